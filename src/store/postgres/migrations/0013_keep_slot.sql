-- Issue 56: the keep slot. Rows that outlive their slot of the ring (dead letters, rows not
-- yet final, done rows still inside retention when their slot is emptied) move once to a
-- seventh partition, slot 6, instead of to the current slot, which is emptied in its turn
-- and would move them again (a 30-day dead letter was moved about four times, its payload
-- rewritten each time under the lock that holds every claim). The keep slot is never
-- truncated: its rows are deleted one by one when their retention ends (`row_by_row`), as
-- dead letters already are wherever they live. Nodes of the release before this one
-- run beside it: their passes empty only 'sealed' slots and open only 'empty' ones, so
-- they leave slot 6 alone (and delete its expired done rows one by one, as it says), and
-- their statements find a key in any partition. Creating the partitions locks the parent
-- tables for a moment; nothing is read.
ALTER TABLE hookgate_slots DROP CONSTRAINT hookgate_slots_state_check;
ALTER TABLE hookgate_slots ADD CONSTRAINT hookgate_slots_state_check
    CHECK (state IN ('current', 'sealed', 'empty', 'keep'));
CREATE TABLE webhook_events_s6 PARTITION OF webhook_events FOR VALUES IN (6);
CREATE TABLE webhook_attempts_s6 PARTITION OF webhook_attempts FOR VALUES IN (6);
INSERT INTO hookgate_slots (slot, state, opened_at, sealed_at, row_by_row)
VALUES (6, 'keep', now(), NULL, true);
