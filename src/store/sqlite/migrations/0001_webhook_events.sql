-- The event row for the embedded store: the same states and columns as Postgres's
-- (see 0001_webhook_events.sql), with SQLite's types. Times are Unix seconds (REAL) from
-- the store's own clock, unixepoch('subsec').
CREATE TABLE IF NOT EXISTS webhook_events (
    provider            TEXT    NOT NULL,
    event_key           TEXT    NOT NULL,
    status              TEXT    NOT NULL
        CHECK (status IN ('in_progress', 'done', 'failed', 'dead')),
    attempts            INTEGER NOT NULL DEFAULT 1,
    last_path           TEXT    NOT NULL,
    fingerprint         TEXT,
    result_status       INTEGER,
    result_content_type TEXT,
    result_body         BLOB,
    payload             BLOB,
    content_type        TEXT,
    last_error          TEXT,
    dead_reason         TEXT,
    locked_until        REAL,
    created_at          REAL    NOT NULL,
    updated_at          REAL    NOT NULL,
    PRIMARY KEY (provider, event_key)
);

CREATE INDEX IF NOT EXISTS webhook_events_status_updated
    ON webhook_events (status, updated_at);
