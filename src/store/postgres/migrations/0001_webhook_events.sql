-- The event row: one per (provider, event_key), the truth about that event.
-- status moves (none) -> in_progress -> done | failed | dead; failed -> in_progress on a
-- won retry; in_progress -> in_progress on a retake after locked_until; dead -> in_progress
-- only by an operator's replay. attempts is +1 on every won claim and fences completions.
CREATE TABLE IF NOT EXISTS webhook_events (
    provider            text        NOT NULL,
    event_key           text        NOT NULL,
    status              text        NOT NULL
        CHECK (status IN ('in_progress', 'done', 'failed', 'dead')),
    attempts            integer     NOT NULL DEFAULT 1,
    last_path           text        NOT NULL,
    fingerprint         text,
    result_status       smallint,
    result_content_type text,
    result_body         bytea,
    payload             bytea,
    content_type        text,
    last_error          text,
    dead_reason         text,
    locked_until        timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_key)
);

-- Retention sweeps and the dead-letter list scan by status and age.
CREATE INDEX IF NOT EXISTS webhook_events_status_updated
    ON webhook_events (status, updated_at);
