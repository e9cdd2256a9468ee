-- Queue mode (see postgres/migrations/0003_queue.sql): the 'queued' status, mode and next_attempt_at. SQLite
-- cannot change a CHECK constraint in place, so the table is rebuilt in this migration's
-- transaction.
CREATE TABLE webhook_events_v3 (
    provider            TEXT    NOT NULL,
    event_key           TEXT    NOT NULL,
    status              TEXT    NOT NULL
        CHECK (status IN ('queued', 'in_progress', 'done', 'failed', 'dead')),
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
    request_headers     TEXT,
    mode                TEXT    NOT NULL DEFAULT 'sync',
    next_attempt_at     REAL,
    PRIMARY KEY (provider, event_key)
);
INSERT INTO webhook_events_v3
    (provider, event_key, status, attempts, last_path, fingerprint, result_status,
     result_content_type, result_body, payload, content_type, last_error, dead_reason,
     locked_until, created_at, updated_at, request_headers)
SELECT provider, event_key, status, attempts, last_path, fingerprint, result_status,
       result_content_type, result_body, payload, content_type, last_error, dead_reason,
       locked_until, created_at, updated_at, request_headers
FROM webhook_events;
DROP TABLE webhook_events;
ALTER TABLE webhook_events_v3 RENAME TO webhook_events;
CREATE INDEX webhook_events_status_updated ON webhook_events (status, updated_at);
CREATE INDEX webhook_events_due ON webhook_events (provider, next_attempt_at)
    WHERE mode = 'queue' AND status IN ('queued', 'failed', 'in_progress');
