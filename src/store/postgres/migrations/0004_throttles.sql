-- Queue mode: tries that did not count against retry.max_attempts — the target asked for
-- time (429/503 with Retry-After) or the attempt never reached it. attempts stays the
-- fencing token (+1 on every take); attempts - throttles is the number of counted tries.
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS throttles integer NOT NULL DEFAULT 0;
