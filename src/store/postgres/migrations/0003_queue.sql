-- Queue mode: hookgate redelivers these rows itself. A 'queued' row is written with its
-- payload before the sender is answered; its first attempt is not claimed yet (attempts 0).
-- next_attempt_at is when the scheduler may take a queue row: now for a new row, after the
-- backoff for a failed one, the lease's end for one in progress.
ALTER TABLE webhook_events DROP CONSTRAINT IF EXISTS webhook_events_status_check;
ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_status_check
    CHECK (status IN ('queued', 'in_progress', 'done', 'failed', 'dead'));
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS mode text NOT NULL DEFAULT 'sync';
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS next_attempt_at timestamptz;
-- The scheduler's due rows of one provider, longest due first; only queue rows that can
-- still be delivered are in it, so it stays small.
CREATE INDEX IF NOT EXISTS webhook_events_due ON webhook_events (provider, next_attempt_at)
    WHERE mode = 'queue' AND status IN ('queued', 'failed', 'in_progress');
