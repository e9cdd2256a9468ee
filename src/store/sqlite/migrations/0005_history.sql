-- Attempt history, kept payloads, paused providers and bulk replays (see
-- postgres/migrations/0005_history.sql). Times are Unix seconds (REAL), the store's clock.
CREATE TABLE IF NOT EXISTS webhook_attempts (
    provider      TEXT    NOT NULL,
    event_key     TEXT    NOT NULL,
    attempt       INTEGER NOT NULL,
    path          TEXT    NOT NULL,
    node          TEXT    NOT NULL,
    mode          TEXT    NOT NULL,
    outcome       TEXT    NOT NULL,
    started_at    REAL    NOT NULL,
    ended_at      REAL    NOT NULL,
    target_status INTEGER,
    error         TEXT,
    answer        TEXT,
    PRIMARY KEY (provider, event_key, attempt),
    FOREIGN KEY (provider, event_key) REFERENCES webhook_events (provider, event_key)
        ON DELETE CASCADE
);
ALTER TABLE webhook_events ADD COLUMN keep_payload INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS hookgate_paused (
    provider  TEXT PRIMARY KEY,
    paused_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS hookgate_replay_jobs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    filter      TEXT    NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('running', 'done', 'cancelled')),
    total       INTEGER NOT NULL,
    replayed    INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    rate        REAL    NOT NULL,
    owner       TEXT,
    lease_until REAL,
    created_at  REAL    NOT NULL,
    updated_at  REAL    NOT NULL
);
CREATE TABLE IF NOT EXISTS hookgate_replay_items (
    job_id    INTEGER NOT NULL REFERENCES hookgate_replay_jobs (id) ON DELETE CASCADE,
    provider  TEXT    NOT NULL,
    event_key TEXT    NOT NULL,
    outcome   TEXT    NOT NULL,
    detail    TEXT,
    at        REAL    NOT NULL,
    PRIMARY KEY (job_id, provider, event_key)
);
