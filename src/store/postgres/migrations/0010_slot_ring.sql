-- Storage over time, 4 of 4: the events and their history become tables partitioned by
-- slot, six slots each; the tables as they were become slot 0, sealed, attached without a
-- read of them (their checks say every row is slot 0; their unique indexes on the slot
-- were built concurrently by step 3). A short transaction: renames, one attach, empty
-- tables and the ring's state. hookgate_slots says which slot takes new keys (current),
-- which hold older ones (sealed) and which are empty; slot 0 is sealed and emptied
-- row by row (row_by_row) until the ring comes round to it.
-- The history's foreign key goes first (the primary key it references goes below): a key's
-- history moves with its event from slot to slot, and is truncated with it. It is dropped
-- here, not in 0007, because the previous release's sweep relies on its cascade until its
-- nodes are stopped; a database whose 0007 (an earlier build) dropped it has none left.
DO $$
DECLARE fk text;
BEGIN
    FOR fk IN SELECT conname FROM pg_constraint
              WHERE conrelid = 'webhook_attempts'::regclass AND contype = 'f' LOOP
        EXECUTE format('ALTER TABLE webhook_attempts DROP CONSTRAINT %I', fk);
    END LOOP;
END $$;
ALTER TABLE webhook_events RENAME TO webhook_events_s0;
ALTER TABLE webhook_events_s0 DROP CONSTRAINT webhook_events_pkey;
ALTER INDEX webhook_events_status_updated RENAME TO webhook_events_s0_status_updated;
ALTER INDEX webhook_events_due RENAME TO webhook_events_s0_due;
ALTER TABLE webhook_attempts RENAME TO webhook_attempts_s0;
ALTER TABLE webhook_attempts_s0 DROP CONSTRAINT webhook_attempts_pkey;

CREATE TABLE webhook_events (
    provider            text        NOT NULL,
    event_key           text        NOT NULL,
    status              text        NOT NULL,
    attempts            integer     NOT NULL DEFAULT 1,
    last_path           text        NOT NULL,
    fingerprint         text,
    result_status       smallint,
    result_content_type text,
    result_body         bytea,
    payload             bytea,
    content_type        text,
    last_error          text,
    dead_reason         text,
    locked_until        timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    request_headers     text,
    mode                text        NOT NULL DEFAULT 'sync',
    next_attempt_at     timestamptz,
    throttles           integer     NOT NULL DEFAULT 0,
    keep_payload        boolean     NOT NULL DEFAULT false,
    slot                smallint    NOT NULL,
    CONSTRAINT webhook_events_status_check
        CHECK (status IN ('queued', 'in_progress', 'done', 'failed', 'dead'))
) PARTITION BY LIST (slot);
ALTER TABLE webhook_events ATTACH PARTITION webhook_events_s0 FOR VALUES IN (0);
-- One row per key and slot; a key is in one slot only (the claim's rule, not the index's).
CREATE UNIQUE INDEX webhook_events_key ON ONLY webhook_events (provider, event_key, slot);
ALTER INDEX webhook_events_key ATTACH PARTITION webhook_events_key_slot;
-- Retention's and the operators' reads by status and age; the scheduler's due rows.
CREATE INDEX webhook_events_status_updated ON webhook_events (status, updated_at);
CREATE INDEX webhook_events_due ON webhook_events (provider, next_attempt_at)
    WHERE mode = 'queue' AND status IN ('queued', 'failed', 'in_progress');

CREATE TABLE webhook_attempts (
    provider      text        NOT NULL,
    event_key     text        NOT NULL,
    attempt       integer     NOT NULL,
    path          text        NOT NULL,
    node          text        NOT NULL,
    mode          text        NOT NULL,
    outcome       text        NOT NULL,
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL,
    target_status smallint,
    error         text,
    answer        text,
    slot          smallint    NOT NULL
) PARTITION BY LIST (slot);
ALTER TABLE webhook_attempts ATTACH PARTITION webhook_attempts_s0 FOR VALUES IN (0);
CREATE UNIQUE INDEX webhook_attempts_key ON ONLY webhook_attempts
    (provider, event_key, slot, attempt);
ALTER INDEX webhook_attempts_key ATTACH PARTITION webhook_attempts_key_slot;

DO $$
BEGIN
    FOR s IN 1..5 LOOP
        EXECUTE format('CREATE TABLE webhook_events_s%s PARTITION OF webhook_events
                        FOR VALUES IN (%s)', s, s);
        EXECUTE format('CREATE TABLE webhook_attempts_s%s PARTITION OF webhook_attempts
                        FOR VALUES IN (%s)', s, s);
    END LOOP;
END $$;

CREATE TABLE hookgate_slots (
    slot       smallint    PRIMARY KEY,
    state      text        NOT NULL CHECK (state IN ('current', 'sealed', 'empty')),
    opened_at  timestamptz,
    sealed_at  timestamptz,
    row_by_row boolean     NOT NULL DEFAULT false
);
CREATE UNIQUE INDEX hookgate_slots_one_current ON hookgate_slots (state)
    WHERE state = 'current';
INSERT INTO hookgate_slots (slot, state, opened_at, sealed_at, row_by_row) VALUES
    (0, 'sealed', now(), now(), true),
    (1, 'current', now(), NULL, false),
    (2, 'empty', NULL, NULL, false),
    (3, 'empty', NULL, NULL, false),
    (4, 'empty', NULL, NULL, false),
    (5, 'empty', NULL, NULL, false);

-- The slot new keys go to. Rows written by hand (or by tests) without a slot land there;
-- hookgate's own statements name the slot: a key already in another slot stays there.
CREATE FUNCTION hookgate_current_slot() RETURNS smallint
    LANGUAGE sql STABLE SET search_path FROM CURRENT
    AS $$ SELECT slot FROM hookgate_slots WHERE state = 'current' $$;
ALTER TABLE webhook_events ALTER COLUMN slot SET DEFAULT hookgate_current_slot();
ALTER TABLE webhook_attempts ALTER COLUMN slot SET DEFAULT hookgate_current_slot();
