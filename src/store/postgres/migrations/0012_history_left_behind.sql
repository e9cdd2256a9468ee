-- Issue 55, repair 2 of 2: the history the previous release's sweep left behind beside an
-- earlier build's 0007 (see 0011) is deleted — a row whose event is gone, and a row that
-- ended before its event was created: an earlier life of a key delivered again after its
-- sweep, whose attempt numbers the new life's history rows collide with. A key's own
-- history ends after its event was created (an outcome is written after its claim, both
-- by the database's clock), so nothing of a live event's own history goes.
-- Only where rows can have been left behind: a table whose cascade 0011 restored (the
-- previous release may still be serving), or the slot-0 partitions of a ring that an
-- earlier build's last step made of such tables, until that slot is emptied (the
-- truncation takes what is left). Each reads the history once against its events (one
-- anti-join), while writes go on. Locks: ROW EXCLUSIVE on the history
-- table (or its slot-0 partition), which no claim, outcome or sweep waits for, and the
-- rows it deletes, which no sender's statement touches (a rekey's update of one waits for
-- the commit; slot 0's truncation, asked without waiting, is left for the next pass).
-- A concurrent statement sees the rows until the commit; a history row written meanwhile
-- is newer than the delete's snapshot and stays.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_constraint
               WHERE conrelid = 'webhook_attempts'::regclass
                 AND conname = 'webhook_attempts_event_restored') THEN
        DELETE FROM webhook_attempts a
        WHERE NOT EXISTS (SELECT 1 FROM webhook_events e
                          WHERE e.provider = a.provider AND e.event_key = a.event_key
                            AND e.created_at <= a.ended_at);
    ELSIF (SELECT relkind FROM pg_class WHERE oid = 'webhook_attempts'::regclass) = 'p' THEN
        -- (Nested: hookgate_slots exists only here, and a condition is planned whole.)
        IF EXISTS (SELECT 1 FROM hookgate_slots WHERE slot = 0 AND row_by_row) THEN
            DELETE FROM webhook_attempts_s0 a
            WHERE NOT EXISTS (SELECT 1 FROM webhook_events_s0 e
                              WHERE e.provider = a.provider AND e.event_key = a.event_key
                                AND e.created_at <= a.ended_at);
        END IF;
    END IF;
END $$;
