-- A bulk replay job's latest results, newest first (see
-- postgres/migrations/0006_replay_items_at.sql).
CREATE INDEX IF NOT EXISTS hookgate_replay_items_at ON hookgate_replay_items (job_id, at);
