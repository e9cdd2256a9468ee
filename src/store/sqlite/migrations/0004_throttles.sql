-- Tries that did not count against retry.max_attempts (see postgres/migrations/0004_throttles.sql).
ALTER TABLE webhook_events ADD COLUMN throttles INTEGER NOT NULL DEFAULT 0;
