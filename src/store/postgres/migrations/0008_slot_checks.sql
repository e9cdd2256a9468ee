-- Storage over time, 2 of 4: the checks of 0007 validated. Each reads its whole table
-- under a SHARE UPDATE EXCLUSIVE lock, which writes do not wait for; the step that
-- attaches the table then needs no read of it while it holds the table's writes.
ALTER TABLE webhook_events VALIDATE CONSTRAINT webhook_events_slot0;
ALTER TABLE webhook_attempts VALIDATE CONSTRAINT webhook_attempts_slot0;
