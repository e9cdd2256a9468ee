-- Every attempt whose story is not a plain first_run -> done: failures, retries, retakes,
-- throttled and released tries, replays, dead letters. Written in the same statement as the
-- outcome it belongs to; deleted with its event (the sweeper's retention).
CREATE TABLE IF NOT EXISTS webhook_attempts (
    provider      text        NOT NULL,
    event_key     text        NOT NULL,
    attempt       integer     NOT NULL,
    path          text        NOT NULL,
    node          text        NOT NULL,
    mode          text        NOT NULL,
    outcome       text        NOT NULL,
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL,
    target_status smallint,
    error         text,
    answer        text,
    PRIMARY KEY (provider, event_key, attempt),
    FOREIGN KEY (provider, event_key) REFERENCES webhook_events (provider, event_key)
        ON DELETE CASCADE
);
-- keep_payload = "always": the payload is written with the claim and kept once done.
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS keep_payload boolean NOT NULL DEFAULT false;
-- Providers an operator paused: every node delivers none of their events while listed.
CREATE TABLE IF NOT EXISTS hookgate_paused (
    provider  text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
-- Bulk replays: a job (its filter, progress and owner) and one result per event.
CREATE TABLE IF NOT EXISTS hookgate_replay_jobs (
    id          bigserial   PRIMARY KEY,
    filter      text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('running', 'done', 'cancelled')),
    total       integer     NOT NULL,
    replayed    integer     NOT NULL DEFAULT 0,
    failed      integer     NOT NULL DEFAULT 0,
    rate        double precision NOT NULL,
    owner       text,
    lease_until timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS hookgate_replay_items (
    job_id    bigint NOT NULL REFERENCES hookgate_replay_jobs (id) ON DELETE CASCADE,
    provider  text   NOT NULL,
    event_key text   NOT NULL,
    outcome   text   NOT NULL,
    detail    text,
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, provider, event_key)
);
