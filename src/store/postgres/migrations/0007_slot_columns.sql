-- Storage over time, 1 of 4: the slot of the ring each row lives in (docs/design.md,
-- "Storage over time"). A constant default adds the column without rewriting the table:
-- every row of an existing table is in slot 0, the first slot of the ring once the last
-- step attaches it. The checks that slot is 0 are validated in the next step, while writes
-- go on. The history's foreign key stays until the last step: nodes of the previous
-- release serve beside this one, and their sweep deletes an event's history through its
-- ON DELETE CASCADE (an earlier build of this step dropped it here; 0011 and 0012 repair
-- what that left).
ALTER TABLE webhook_events ADD COLUMN IF NOT EXISTS slot smallint NOT NULL DEFAULT 0;
ALTER TABLE webhook_attempts ADD COLUMN IF NOT EXISTS slot smallint NOT NULL DEFAULT 0;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_events_slot0'
                   AND conrelid = 'webhook_events'::regclass) THEN
        ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_slot0
            CHECK (slot = 0) NOT VALID;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'webhook_attempts_slot0'
                   AND conrelid = 'webhook_attempts'::regclass) THEN
        ALTER TABLE webhook_attempts ADD CONSTRAINT webhook_attempts_slot0
            CHECK (slot = 0) NOT VALID;
    END IF;
END $$;
