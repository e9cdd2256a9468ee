-- Request headers kept with a failed or dead event's payload (JSON object), for people
-- reading a dead letter. Credentials (Authorization, Cookie) are never stored.
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS request_headers text;
