-- Request headers kept with a failed or dead event's payload (JSON object text).
ALTER TABLE webhook_events ADD COLUMN request_headers TEXT;
