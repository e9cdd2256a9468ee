-- Issue 55, repair 1 of 2: the history's cascade back where an earlier build's 0007 dropped
-- it. That step ran with `hookgate migrate --online`, beside nodes of the previous release
-- whose sweep deletes an event and relies on ON DELETE CASCADE for its history: every event
-- they swept since left its history behind, and a key delivered again collided with it.
-- On a table not yet partitioned (0010 not applied) that lost its foreign key, the key comes
-- back NOT VALID: nothing is read, the lock it takes on both tables (SHARE ROW EXCLUSIVE,
-- which holds their writes) lasts a moment, and from its commit an event deleted takes its
-- history with it. 0012 removes what was left behind; 0010 drops the key once the old nodes
-- are gone. Anywhere else (a database that kept its key, or one already partitioned)
-- nothing changes.
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'webhook_attempts'::regclass) = 'r'
       AND NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = 'webhook_attempts'::regclass AND contype = 'f') THEN
        ALTER TABLE webhook_attempts ADD CONSTRAINT webhook_attempts_event_restored
            FOREIGN KEY (provider, event_key) REFERENCES webhook_events (provider, event_key)
            ON DELETE CASCADE NOT VALID;
    END IF;
END $$;
