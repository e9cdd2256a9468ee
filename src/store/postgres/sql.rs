//! The Postgres store's single-row statements. Each is one statement on one row in
//! autocommit, and says which row it locks and what a concurrent caller sees. `now()` is
//! the only clock used for leases.
//!
//! A statement that finds its row by the primary key checks the row's status with
//! `IS NOT DISTINCT FROM` (the same as `=` on a column that is never NULL), which no index
//! serves. With `=`, a plan cached while the table was empty and never analyzed walks the
//! status index instead — every `in_progress` entry, live or dead, on each call — until
//! the next analyze (measured: completions timing out at 5 s on a table with 50 000
//! `in_progress` rows). `tests/api/store/plans.rs` holds this for every fenced statement.

/// The claim's state rules in Postgres, shared by the single-row and the batched claim
/// (`e` is the existing row): a sync row that is `failed`, or `in_progress` with its lease
/// run out by the database's clock, is taken over — set back to `in_progress` with
/// attempts + 1 — when its fingerprint equals the claim's (or either is unknown: fingerprints
/// off); `done` and `dead` never match. Fingerprints of two kinds (one made before a key
/// rotation, or before encryption was on) never match: the row is reported, and the shard
/// fingerprints the payload again under the row's kind and claims again with it. A row
/// claimed `filtered` (the main route's filter refused the event's first delivery) keeps
/// that path when it is retaken: the row, not the redelivery's headers, says what the
/// attempt does. A queue row
/// is never claimed, whatever the provider's mode is now: a row keeps the mode it was
/// accepted in, and only a queue attempt (renewed, its outcome written however long the
/// store takes) may deliver it; the sender's redelivery is answered from the row. The
/// queue's [`TAKE`](super::queue_sql::TAKE) keeps the same rule for queue rows.
macro_rules! pg_claim_conflict {
    () => {
        "ON CONFLICT (provider, event_key, slot) DO UPDATE
    SET status = 'in_progress',
        attempts = e.attempts + 1,
        last_path = CASE WHEN e.last_path = 'filtered' THEN 'filtered'
                         WHEN e.status = 'failed' THEN 'retry_after_failure'
                         ELSE 'lease_retake' END,
        locked_until = EXCLUDED.locked_until,
        updated_at = now()
    WHERE e.mode = 'sync'
      AND (e.status = 'failed' OR (e.status = 'in_progress' AND e.locked_until <= now()))
      AND (e.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL
           OR e.fingerprint = EXCLUDED.fingerprint)"
    };
}
pub(crate) use pg_claim_conflict;

/// The slot a claimed or enqueued key `($provider, $key)` is written to: the slot its row
/// is in — one primary-key probe per slot of the ring — or, for a key never seen, the
/// current slot (docs/design.md, "Storage over time"). A key is in one slot only: a turn
/// of the ring waits for every statement writing to the table, and a statement takes its
/// snapshot after its locks, so a key's first claims on either side of a turn see each
/// other's rows.
macro_rules! pg_slot_of {
    ($provider:literal, $key:literal) => {
        concat!(
            "COALESCE((SELECT w.slot FROM webhook_events w WHERE w.provider = ",
            $provider,
            " AND w.event_key = ",
            $key,
            " LIMIT 1), (SELECT c.slot FROM hookgate_slots c WHERE c.state = 'current'))"
        )
    };
}
pub(crate) use pg_slot_of;

/// A claim's `current` CTE: the ring's current slot, where a key never seen is inserted.
/// `batch_sql::claim_on_slots` adds its guard.
macro_rules! pg_current {
    () => {
        "current AS (SELECT slot FROM hookgate_slots WHERE state = 'current')"
    };
}
pub(crate) use pg_current;

/// The single claim's probe of its key's row (`$1`, `$2`) in every slot, through the
/// partitioned table. `batch_sql::claim_on_slots` names the filled slots instead.
macro_rules! pg_found_one_whole {
    () => {
        "FROM webhook_events w
    WHERE w.provider = $1 AND w.event_key = $2
    LIMIT 1"
    };
}
pub(crate) use pg_found_one_whole;

/// Claim, in one statement: insert the key, or take over a `failed` row or an expired
/// lease; otherwise report the row as it stands. A new row is claimed under the path `$8`:
/// `first_run`, or `filtered` (see [`pg_claim_conflict!`]).
///
/// `found` is the key's row as the statement's snapshot sees it, found by probing the
/// slots' key indexes in turn up to the slot that holds it (the node names the filled
/// slots, and the statement's guard answers nothing if the ring has outgrown them:
/// `batch_sql::claim_on_slots`). A key whose row is `done` or
/// `dead` is not inserted at all: no claim changes such a row, and `ON CONFLICT DO UPDATE`
/// locks the row it meets even when its `WHERE` leaves it alone — a write of the row's heap
/// page, a WAL record and, for a page not written since the last checkpoint, a copy of the
/// whole page. A duplicate answered from its row writes nothing, and is answered from
/// `found`: asking the table again would probe every slot's key index. A replay that moves
/// the row on after the snapshot is ordered after this claim, which reports the row as the
/// snapshot saw it.
///
/// Locks: the one `(provider, event_key)` row (or its index slot). A concurrent claimer of
/// the same key blocks on that row lock until this statement commits, then re-evaluates
/// the `WHERE` against the committed row: after our win it sees `in_progress` with a live
/// lease, so it cannot win too. `done` and `dead` never match, whatever `locked_until`
/// says. The report is the snapshot's row; if a concurrent insert committed after that
/// snapshot, there is none and the statement returns no row: the caller runs it again
/// (see [`PgStore::claim`]).
pub(crate) const CLAIM: &str = concat!(
    "
WITH ",
    pg_current!(),
    ",
found AS (
    SELECT w.slot, w.status, w.attempts, w.last_path, w.fingerprint, w.locked_until,
           w.result_status, w.result_content_type, w.result_body, w.mode
    ",
    pg_found_one_whole!(),
    "
),
claimed AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, slot, status, attempts, last_path, fingerprint, locked_until,
         payload, content_type, request_headers, keep_payload)
    SELECT $1::text, $2::text, COALESCE(s.slot, (SELECT slot FROM current)),
           'in_progress', 1, $8::text, $3::text,
           now() + $4::bigint * interval '1 millisecond',
           $5::bytea, $6::text, $7::text, $5::bytea IS NOT NULL
    FROM (SELECT) one
    LEFT JOIN found s ON true
    WHERE (s.status IS NULL OR s.status NOT IN ('done', 'dead')) AND EXISTS (SELECT FROM current)
",
    pg_claim_conflict!(),
    "
    RETURNING true AS won, e.status, e.attempts, e.last_path, e.fingerprint,
              0::bigint AS lease_left_ms,
              e.result_status, e.result_content_type, e.result_body, e.mode
)
SELECT * FROM claimed
UNION ALL
SELECT false, status, attempts, last_path, fingerprint,
       GREATEST(0, extract(epoch FROM locked_until - now()) * 1000)::bigint,
       result_status, result_content_type, result_body, mode
FROM found
WHERE NOT EXISTS (SELECT 1 FROM claimed) AND EXISTS (SELECT FROM current)"
);

/// An attempt's history row, from the row the outcome statement `changed` (its
/// `provider`, `event_key`, `slot` and `mode`: the history lives in its event's slot) and the parameters `$3` (attempt), `$path`,
/// `$node`, `$outcome`, `$took_ms`, `$status`, `$error`, `$answer` — written only when
/// `$path` is not NULL (a plain first run's done writes none).
macro_rules! pg_history {
    ($changed:literal, $path:literal, $node:literal, $outcome:literal, $took:literal,
     $status:literal, $error:literal, $answer:literal) => {
        concat!(
            "history AS (
    INSERT INTO webhook_attempts
        (provider, event_key, slot, attempt, path, node, mode, outcome, started_at, ended_at,
         target_status, error, answer)
    SELECT provider, event_key, slot, $3, ",
            $path,
            ", ",
            $node,
            ", mode, ",
            $outcome,
            ",
           now() - ",
            $took,
            "::bigint * interval '1 millisecond', now(), ",
            $status,
            ", ",
            $error,
            ", ",
            $answer,
            "
    FROM ",
            $changed,
            " WHERE ",
            $path,
            "::text IS NOT NULL)"
        )
    };
}

/// Complete, fenced: only the attempt that holds the row may mark it done; with its
/// history row (`$7`…`$11`) in the same statement. A row that keeps its payload keeps it.
///
/// Locks the one row. A concurrent retake (which bumps `attempts`) either commits first,
/// and this matches no row (stale), or waits for this to commit and then finds `done`,
/// which it never claims. Answers how many rows it changed (0 or 1).
pub(crate) const COMPLETE: &str = concat!(
    "
WITH done AS (
    UPDATE webhook_events
    SET status = 'done', result_status = $4, result_content_type = $5, result_body = $6,
        locked_until = NULL, last_error = NULL, dead_reason = NULL,
        payload = CASE WHEN keep_payload THEN payload END,
        content_type = CASE WHEN keep_payload THEN content_type END,
        request_headers = CASE WHEN keep_payload THEN request_headers END, updated_at = now()
    WHERE provider = $1 AND event_key = $2 AND attempts = $3
      AND status IS NOT DISTINCT FROM 'in_progress'
    RETURNING provider, event_key, slot, mode),
",
    pg_history!("done", "$7", "$8", "'done'", "$9", "$4", "NULL", "$10"),
    "
SELECT count(*)::bigint AS changed FROM done"
);

/// Fail (or dead-letter), fenced the same way as [`COMPLETE`]; releases the lease at once
/// so the sender's next retry can claim the row without waiting for it to expire. Kept
/// request headers are replaced only by another request's (a replay has none). A queue
/// row's next attempt is due after `$10` ms; `$11` (0 or 1) is added to the tries that did
/// not count against the attempt cap (throttled, or never started).
///
/// Locks the one row; a concurrent claimer waits, then sees `failed` (and may win it) or
/// `dead` (and never does).
/// [`COMPLETE`] without a history row (a first run that ended done: the hot path); the
/// same locks. Answers through its row count.
pub(crate) const COMPLETE_PLAIN: &str = "
UPDATE webhook_events
SET status = 'done', result_status = $4, result_content_type = $5, result_body = $6,
    locked_until = NULL, last_error = NULL, dead_reason = NULL,
    payload = CASE WHEN keep_payload THEN payload END,
    content_type = CASE WHEN keep_payload THEN content_type END,
    request_headers = CASE WHEN keep_payload THEN request_headers END, updated_at = now()
WHERE provider = $1 AND event_key = $2 AND attempts = $3
  AND status IS NOT DISTINCT FROM 'in_progress'";

/// With its history row (`$12`…`$17`) in the same statement; answers how many rows it
/// changed (0 or 1).
pub(crate) const FAIL: &str = concat!(
    "
WITH failed AS (
    UPDATE webhook_events
    SET status = $4, last_error = $5, dead_reason = $6, payload = $7, content_type = $8,
        request_headers = COALESCE($9, request_headers), locked_until = NULL,
        updated_at = now(),
        next_attempt_at = CASE WHEN $10::bigint IS NULL THEN next_attempt_at
                               ELSE now() + $10::bigint * interval '1 millisecond' END,
        throttles = throttles + $11::int
    WHERE provider = $1 AND event_key = $2 AND attempts = $3
      AND status IS NOT DISTINCT FROM 'in_progress'
    RETURNING provider, event_key, slot, mode),
",
    pg_history!("failed", "$12", "$13", "$14", "$15", "$16", "$5", "$17"),
    "
SELECT count(*)::bigint AS changed FROM failed"
);

/// The columns of a whole row, for [`LOOKUP`]. The times are named
/// apart from their columns (`created_unix`, `updated_unix`): an `ORDER BY updated_at`
/// names the output column when one has that name, and a float computed per row is an
/// order no index gives — every matching row read and sorted for each page.
macro_rules! record_columns {
    () => {
        "provider, event_key, status, attempts, last_path, fingerprint, result_status,
         result_content_type, result_body, payload, content_type, request_headers,
         last_error, dead_reason, mode,
         GREATEST(0, extract(epoch FROM locked_until - now()) * 1000)::bigint AS lease_left_ms,
         extract(epoch FROM created_at)::float8 AS created_unix,
         extract(epoch FROM updated_at)::float8 AS updated_unix"
    };
}

/// Lookup: a plain read, no lock; sees the last committed state.
pub(crate) const LOOKUP: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM webhook_events WHERE provider = $1 AND event_key = $2"
);

/// Replay: reopen a dead letter as a new attempt, the claim's way (attempts + 1 is the new
/// fencing token, the lease from the database clock).
///
/// A queue row is due no earlier than the replay's lease ends (renewals move both on), so
/// no scheduler offers it while the replay runs.
///
/// Locks the one row. A concurrent replay of the same key waits for the lock, re-checks
/// `status = 'dead'` against the committed row, finds `in_progress` and changes nothing:
/// exactly one replay wins. A sender's delivery arriving meanwhile sees a live lease.
pub(crate) const REPLAY: &str = "
UPDATE webhook_events
SET status = 'in_progress', attempts = attempts + 1, last_path = 'replay',
    locked_until = now() + $3::bigint * interval '1 millisecond',
    next_attempt_at = now() + $3::bigint * interval '1 millisecond', updated_at = now()
WHERE provider = $1 AND event_key = $2 AND status IS NOT DISTINCT FROM 'dead'
  AND payload IS NOT NULL
RETURNING attempts, payload, content_type, fingerprint, mode";

/// Sweep: delete one bounded batch of old rows of one status, with their history (which
/// lives in the same slot).
///
/// The inner select locks at most `$3` rows and skips any row another transaction holds
/// (`SKIP LOCKED`), so a sweep never waits on a claim and holds few locks. Only `done` and
/// `dead` rows are swept, and nothing but a replay ever changes them: a replay that locked
/// the row first is skipped; one that comes after the delete finds no row and is refused.
pub(crate) const SWEEP: &str = "
WITH gone AS (
    DELETE FROM webhook_events
    WHERE (provider, event_key, slot) IN (
        SELECT provider, event_key, slot FROM webhook_events
        WHERE status = $1 AND updated_at < now() - $2::bigint * interval '1 millisecond'
        ORDER BY updated_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED)
    RETURNING provider, event_key, slot),
history AS (
    DELETE FROM webhook_attempts a USING gone g
    WHERE a.provider = g.provider AND a.event_key = g.event_key AND a.slot = g.slot)
SELECT count(*)::bigint AS deleted FROM gone";

/// The bytes of each of hookgate's tables in this schema (heap, indexes and TOAST; a
/// partitioned table's are its partitions'): a read of the catalog, no lock on the tables.
pub(crate) const TABLE_SIZES: &str = "
SELECT c.relname::text AS name,
       (SELECT COALESCE(sum(pg_total_relation_size(t.relid)), 0)
        FROM pg_partition_tree(c.oid) t)::bigint AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
  AND c.relname = ANY($1::text[])";

/// The ring's partitions: slots 0 to 5 and the keep slot, 6 (`webhook_events_s0` …
/// `webhook_events_s6`).
pub(crate) const SLOTS: i16 = 7;

/// `sql` — a statement whose one `UPDATE webhook_events` finds its row by key — with that
/// update named on slot `slot`'s partition (`webhook_events_s{slot}`), or `None` for a slot
/// outside the ring. A statement on the partitioned table plans, locks and probes every
/// slot's partition and key index (a key's slot is not known to it); named on one, it
/// touches that partition alone. Both forms change the same row when it is in that slot
/// (a key is in one slot only): the caller runs the slotted form first, on the slot that
/// holds nearly every row in flight (the current one), and the whole form for the calls it
/// did not change (docs/design.md, "Storage over time"). Each text is made once and kept
/// for the process's life (a few statements × [`SLOTS`]), so its prepared statement is
/// cached by text on each connection.
pub(crate) fn on_slot(sql: &'static str, slot: i16) -> Option<&'static str> {
    type Texts = dashmap::DashMap<(usize, usize, i16), &'static str>;
    static TEXTS: std::sync::LazyLock<Texts> = std::sync::LazyLock::new(Texts::new);
    if !(0..SLOTS).contains(&slot) {
        return None;
    }
    let id = (sql.as_ptr() as usize, sql.len(), slot);
    if let Some(text) = TEXTS.get(&id) {
        return Some(*text);
    }
    let made: &'static str = Box::leak(slotted(sql, slot)?.into_boxed_str());
    let text: &'static str = TEXTS.entry(id).or_insert(made).value();
    Some(text)
}

/// The text of [`on_slot`]: the first `UPDATE webhook_events` followed by white space,
/// named on the partition; `None` for a statement that has none.
fn slotted(sql: &str, slot: i16) -> Option<String> {
    const WHOLE: &str = "UPDATE webhook_events";
    let at = sql.match_indices(WHOLE).map(|(at, _)| at).find(|at| {
        sql[at + WHOLE.len()..]
            .chars()
            .next()
            .is_some_and(char::is_whitespace)
    })?;
    Some(format!(
        "{}{WHOLE}_s{slot}{}",
        &sql[..at],
        &sql[at + WHOLE.len()..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::batch_sql::{COMPLETE_BATCH, COMPLETE_BATCH_PLAIN};
    use crate::store::postgres::queue_sql::RENEW;

    #[test]
    fn a_slotted_statement_updates_that_slot_alone_and_is_made_once() {
        for sql in [
            COMPLETE,
            COMPLETE_PLAIN,
            FAIL,
            RENEW,
            COMPLETE_BATCH,
            COMPLETE_BATCH_PLAIN,
        ] {
            let text = on_slot(sql, 3).unwrap();
            assert_eq!(
                text.matches("UPDATE webhook_events_s3").count(),
                1,
                "{text}"
            );
            // Nothing else of the statement changes: its history still goes through the
            // partitioned history table, its row's slot read from the row.
            assert_eq!(text.replace("webhook_events_s3", "webhook_events"), sql);
            assert!(std::ptr::eq(text, on_slot(sql, 3).unwrap()));
        }
        assert_eq!(on_slot(COMPLETE, SLOTS), None);
        assert_eq!(on_slot(COMPLETE, -1), None);
        assert_eq!(on_slot(LOOKUP, 1), None);
    }
}
