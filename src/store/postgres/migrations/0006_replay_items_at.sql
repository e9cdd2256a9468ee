-- A bulk replay job's latest results, newest first (its page, polled while it runs): read
-- from this index instead of sorting every result of the job.
CREATE INDEX IF NOT EXISTS hookgate_replay_items_at ON hookgate_replay_items (job_id, at);
