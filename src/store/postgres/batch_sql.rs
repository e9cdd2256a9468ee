//! The group commit's statements, run by `batch.rs`: the single-row rules of `sql.rs`
//! (claim, completion) and `queue_sql.rs` (enqueue) over `unnest`ed arrays, rows locked in
//! (provider, event_key) order.

use super::queue_sql::pg_queue_values;
use super::sql::{pg_claim_conflict, pg_current, pg_found_one_whole};

/// A queue row's insert from the rows of `$from` (aliased `$a`, with the columns of
/// `ENQUEUE_BATCH`'s input), as `ENQUEUE` writes one: into the current slot, whether it
/// holds the key's row (the conflict then writes nothing) or no slot does; a key whose row
/// is in a sealed slot is not written (its caller reports the row). Up to the rows' own
/// further conditions (`AND …`), `ORDER BY`, `ON CONFLICT` and `RETURNING`.
macro_rules! pg_queue_insert {
    ($from:literal, $a:literal) => {
        concat!(
            "
    INSERT INTO webhook_events AS e
        (provider, event_key, slot, status, attempts, last_path, fingerprint, mode, payload,
         content_type, request_headers, next_attempt_at, locked_until, keep_payload)
    SELECT ",
            $a,
            ".provider, ",
            $a,
            ".event_key, COALESCE(s.slot, (SELECT slot FROM current)), ",
            pg_queue_values!(concat!($a, ".start_ms")),
            ", ",
            $a,
            ".fingerprint, 'queue', ",
            $a,
            ".payload, ",
            $a,
            ".content_type, ",
            $a,
            ".request_headers,
           now() + COALESCE(",
            $a,
            ".start_ms, 0) * interval '1 millisecond',
           now() + ",
            $a,
            ".start_ms * interval '1 millisecond', ",
            $a,
            ".keep_payload
    FROM ",
            $from,
            " ",
            $a,
            "
    LEFT JOIN LATERAL (
        SELECT w.slot FROM webhook_events w
        WHERE w.provider = ",
            $a,
            ".provider AND w.event_key = ",
            $a,
            ".event_key
        LIMIT 1) s ON true
    -- A row found in a sealed slot is only reported, never written over: a sealed slot
    -- takes no key (a row swept since the snapshot would otherwise come back there).
    WHERE (s.slot IS NULL OR s.slot = (SELECT slot FROM current))"
        )
    };
}

/// The claim batch's probe of each input key's row (`i`) in every slot, through the
/// partitioned table: planned, locked and run on each of the ring's partitions.
/// [`claim_on_slots`] names the slots that can hold a row instead.
macro_rules! pg_found_whole {
    () => {
        "FROM webhook_events w
        WHERE w.provider = i.provider AND w.event_key = i.event_key
        LIMIT 1"
    };
}

/// The claim batch's input: one row per key (`i`). [`claim_on_slots`] adds a column,
/// `skip`.
macro_rules! pg_claim_input {
    () => {
        "unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::bytea[],
                         $6::text[], $7::text[], $8::text[])
        AS i(provider, event_key, fingerprint, lease_ms, payload, content_type,
             request_headers, first_path)"
    };
}

/// The enqueue batch's input: one row per key (`i`). [`claim_on_slots`] adds a column,
/// `skip`.
macro_rules! pg_enqueue_input {
    () => {
        "unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[],
                         $6::text[], $7::int8[], $8::bool[])
        AS i(provider, event_key, fingerprint, payload, content_type, request_headers,
             start_ms, keep_payload)"
    };
}

/// The enqueue batch's insert of its own rows, after their probe, up to the conflict.
macro_rules! pg_enqueue_order {
    () => {
        "
    ORDER BY i.provider, i.event_key
    ON CONFLICT (provider, event_key, slot) DO NOTHING"
    };
}

/// The claim batch's columns of a key's row, as `found` reads them.
const FOUND_COLUMNS: &str = "w.slot, w.status, w.attempts, w.last_path, w.fingerprint, \
    w.locked_until, w.result_status, w.result_content_type, w.result_body, w.mode";

/// `whole` ([`CLAIM_BATCH`], [`CLAIM_ROUTED`], the single claim's `CLAIM`, [`ENQUEUE_BATCH`]
/// or [`ENQUEUE_ROUTED`]) with its probe of each key's row named on the partitions of
/// `slots` alone — the slots that were not `empty` when the caller
/// last read the ring — and a guard: the statement claims and reports nothing unless, in
/// its snapshot, every slot outside `slots` is `empty` (a truncated partition: its state
/// and its truncation commit together). A key's row is then found wherever it is, as the
/// whole statement finds it; a statement whose slots the ring has outgrown (a turn opened
/// an empty slot since) answers no key, and its calls run alone on the whole statement
/// while the caller reads the ring again. Probing the partitions by name, not through the
/// partitioned table, is what spares the empty slots: a generic plan of the partitioned
/// table's probe plans, locks and starts a scan of every partition for every key.
/// The insert stays on the partitioned table: its lock is the one the ring's turns take.
/// An enqueue batch writes its own rows only under the guard; the rows it did not write are
/// reported from the partitioned table, as the whole statement reports them, and the other
/// routes' rows it writes probe the partitioned table too.
///
/// Two parameters follow the whole statement's: each key's slots to skip (a bit per slot,
/// `1 << slot`: an `int4` for the single claim, an `int4[]` beside the batch's input), and
/// a `timestamptz[]` indexed by slot + 1 with the `sealed_at` of each slot whose filter
/// decided a skip (NULL for the others). A skipped slot's probe is a one-time filter of
/// its branch: the partition is not read for that key. The guard then also answers nothing
/// unless each slot with a `sealed_at` given is `empty`, or still sealed with that
/// `sealed_at` — the life whose keys the filter holds (see `ring_view.rs`).
pub(super) fn claim_on_slots(whole: &str, slots: &[i16]) -> String {
    if slots.is_empty() {
        // No slot to name (never the case: the current slot is one): the whole statement.
        return whole.to_owned();
    }
    // The two parameters after the whole statement's: each key's slots to skip, and the
    // sealing each skip was decided under.
    let last = last_param(whole);
    let (skip, sealed) = (last + 1, last + 2);
    let named = |key: &str, skips: &str| -> String {
        let probes: Vec<String> = slots
            .iter()
            .map(|slot| {
                format!(
                    "SELECT {FOUND_COLUMNS} FROM webhook_events_s{slot} w \
                     WHERE {key} AND ({skips} & {}) = 0",
                    1_i32 << slot
                )
            })
            .collect();
        format!(
            "FROM ({}) w\n        LIMIT 1",
            probes.join("\n            UNION ALL ")
        )
    };
    let listed: Vec<String> = slots.iter().map(i16::to_string).collect();
    // The partitioned table's lock first (a lock the ring's `EXCLUSIVE` excludes), before
    // any named partition's: a statement locks its relations in the order its plan names
    // them, and this CTE comes before the probe's. A claim that locked a due slot's
    // partition first and then waited for the ring's lock held that partition against the
    // emptying's truncation (asked without waiting), which then failed at every pass while
    // claims ran: the soak's expired prefill was never removed.
    let current = format!(
        "current AS (SELECT slot FROM hookgate_slots WHERE state = 'current'
                 AND NOT EXISTS (SELECT FROM ONLY webhook_events p WHERE false FOR KEY SHARE)
                 AND NOT EXISTS (SELECT FROM hookgate_slots o
                                 WHERE o.state <> 'empty' AND o.slot NOT IN ({})
                                    OR o.state <> 'empty'
                                       AND (${sealed}::timestamptz[])[o.slot + 1] IS NOT NULL
                                       AND o.sealed_at IS DISTINCT FROM
                                           (${sealed}::timestamptz[])[o.slot + 1]))",
        listed.join(", ")
    );
    let input = pg_claim_input!()
        .replacen("$8::text[])", &format!("$8::text[], ${skip}::int4[])"), 1)
        .replacen("first_path)", "first_path, skip)", 1);
    let enqueue_input = pg_enqueue_input!()
        .replacen("$8::bool[])", &format!("$8::bool[], ${skip}::int4[])"), 1)
        .replacen("keep_payload)", "keep_payload, skip)", 1);
    // An enqueue's own rows are written only under the guard (its report, of the rows it
    // did not write, reads the partitioned table and needs none).
    let enqueue_order = format!(
        "\n      AND EXISTS (SELECT FROM current){}",
        pg_enqueue_order!()
    );
    whole
        .replacen(pg_claim_input!(), &input, 1)
        .replacen(pg_enqueue_input!(), &enqueue_input, 1)
        .replacen(pg_enqueue_order!(), &enqueue_order, 1)
        .replacen(
            pg_found_whole!(),
            &named(
                "w.provider = i.provider AND w.event_key = i.event_key",
                "i.skip",
            ),
            1,
        )
        .replacen(
            pg_found_one_whole!(),
            &named(
                "w.provider = $1 AND w.event_key = $2",
                &format!("${skip}::int4"),
            ),
            1,
        )
        .replacen(pg_current!(), &current, 1)
}

/// The highest parameter number `$n` in `sql`.
fn last_param(sql: &str) -> usize {
    sql.split('$')
        .skip(1)
        .filter_map(|after| {
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            after[..digits].parse().ok()
        })
        .max()
        .unwrap_or(0)
}

/// The claim batch, with `$others` (a CTE, or nothing) after its own and `$report` (more
/// rows of the answer, or nothing) after its report: see [`CLAIM_BATCH`] and
/// [`CLAIM_ROUTED`].
macro_rules! pg_claim_batch {
    ($others:expr, $report:expr) => {
        concat!(
            "
WITH input AS (
    SELECT * FROM ",
            pg_claim_input!(),
            "
),
",
            pg_current!(),
            ",
found AS (
    SELECT i.*, s.slot, s.status, s.attempts, s.last_path, s.fingerprint AS row_fingerprint,
           s.locked_until, s.result_status, s.result_content_type, s.result_body, s.mode
    FROM input i
    LEFT JOIN LATERAL (
        SELECT w.slot, w.status, w.attempts, w.last_path, w.fingerprint, w.locked_until,
               w.result_status, w.result_content_type, w.result_body, w.mode
        ",
            pg_found_whole!(),
            ") s ON true
),
claimed AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, slot, status, attempts, last_path, fingerprint, locked_until,
         payload, content_type, request_headers, keep_payload)
    SELECT f.provider, f.event_key, COALESCE(f.slot, (SELECT slot FROM current)),
           'in_progress', 1, f.first_path, f.fingerprint,
           now() + f.lease_ms * interval '1 millisecond',
           f.payload, f.content_type, f.request_headers, f.payload IS NOT NULL
    FROM found f
    -- A key whose row is done or dead is only reported (no claim changes it: see `CLAIM`).
    WHERE (f.status IS NULL OR f.status NOT IN ('done', 'dead')) AND EXISTS (SELECT FROM current)
    ORDER BY f.provider, f.event_key
",
            pg_claim_conflict!(),
            "
    RETURNING e.provider, e.event_key, true AS won, e.status, e.attempts, e.last_path,
              e.fingerprint, 0::bigint AS lease_left_ms,
              e.result_status, e.result_content_type, e.result_body, e.mode
)",
            $others,
            "
SELECT * FROM claimed
UNION ALL
SELECT f.provider, f.event_key, false, f.status, f.attempts, f.last_path, f.row_fingerprint,
       GREATEST(0, extract(epoch FROM f.locked_until - now()) * 1000)::bigint,
       f.result_status, f.result_content_type, f.result_body, f.mode
FROM found f
-- Keys with a row; won keys are not reported (NOT IN: the keys are never NULL).
WHERE f.status IS NOT NULL AND EXISTS (SELECT FROM current)
  AND (f.provider, f.event_key) NOT IN (SELECT provider, event_key FROM claimed)",
            $report
        )
    };
}

/// Claims for many keys: the single-row `CLAIM` over `unnest`ed input.
///
/// Reads: each input key's row as the statement's snapshot sees it (`found`: the slots'
/// key indexes probed in turn up to the slot that holds the key), never a scan. Keys whose
/// row is neither `done` nor `dead` go on to the insert; the others, and keys whose claim
/// did not win, are reported from `found`, without probing the table again (which would
/// descend every slot's key index: see `CLAIM`). Won keys are filtered out of the report
/// with `NOT IN`, a hashed lookup: `NOT EXISTS` would be an anti-join, which without hash
/// joins (see `PgStore::connect`) costs won × reported comparisons. `found` carries the
/// input's columns so that no step joins two sets of rows.
/// Locks: each input key's row that is not `done` or `dead` (those are only read, as in
/// `CLAIM`), in key order. A concurrent claimer of one of these keys waits for this
/// statement's commit and then sees the row it left (a live lease). Keys whose row was
/// inserted by another transaction after this statement's snapshot are missing from the
/// report; their calls retry alone.
pub(super) const CLAIM_BATCH: &str = pg_claim_batch!("", "");

/// The rows of an event's other routes (`$others` are the nine arrays of [`pg_others!`]'s
/// input), written for each key that `$owners` (a CTE of the statement's own written rows:
/// won claims, new queue rows) returned — as `ENQUEUE` writes a row: queued and due now,
/// or taken with its start lease; a key whose row exists is left alone.
///
/// Its rows are inserted in key order, after the statement's own in the same command, so
/// they commit together; they are reported as rows whose third column (`won`, `inserted`)
/// is NULL, by [`pg_others_report!`].
macro_rules! pg_others {
    ($owners:literal, $others:literal) => {
        concat!(
            ",
other_input AS (
    SELECT * FROM unnest(",
            $others,
            ")
        AS o(provider, event_key, owner, fingerprint, payload, content_type,
             request_headers, start_ms, keep_payload)
),
others AS (",
            pg_queue_insert!("other_input", "o"),
            "
    -- The owner's key is one the statement wrote: a hashed lookup (`NOT … NOT IN` stays a
    -- hashed subplan, where `IN` would become a join of two sets of rows, a nested loop
    -- without hash and merge joins; the keys are never NULL).
      AND NOT ((o.owner, o.event_key) NOT IN (SELECT provider, event_key FROM ",
            $owners,
            "))
    ORDER BY o.provider, o.event_key
    ON CONFLICT (provider, event_key, slot) DO NOTHING
    RETURNING e.provider, e.event_key
)"
        )
    };
}

/// The rows [`pg_others!`] wrote, as rows of a batch's answer with NULL in every column
/// but the key (`$nulls`: one for each of the answer's other columns).
macro_rules! pg_others_report {
    ($nulls:literal) => {
        concat!(
            "
UNION ALL
SELECT provider, event_key, ",
            $nulls,
            " FROM others"
        )
    };
}

/// [`CLAIM_BATCH`] for calls with other routes: the other routes' rows of the keys whose
/// row it inserted (a won claim of attempt 1: the event's first accepted delivery; a won
/// retry or retake writes none, so a redelivery never changes which routes an event has)
/// are written by the same statement (`$9`…`$17`: scope, key, the main route's scope,
/// fingerprint, payload, content type, headers, start lease in ms, keep payload), so an
/// event's routes commit together with no transaction around them.
pub(super) const CLAIM_ROUTED: &str = pg_claim_batch!(
    pg_others!(
        "claimed WHERE attempts = 1",
        "$9::text[], $10::text[], $11::text[], $12::text[], $13::bytea[], $14::text[],
                         $15::text[], $16::int8[], $17::bool[]"
    ),
    pg_others_report!("NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL")
);

/// The enqueue batch, with `$others` and `$report` as in [`pg_claim_batch!`]: see
/// [`ENQUEUE_BATCH`] and [`ENQUEUE_ROUTED`].
macro_rules! pg_enqueue_batch {
    ($others:expr, $report:expr) => {
        concat!(
            "
WITH input AS (
    SELECT * FROM ",
            pg_enqueue_input!(),
            "
),
",
            pg_current!(),
            ",
queued AS (",
            pg_queue_insert!("input", "i"),
            pg_enqueue_order!(),
            "
    RETURNING e.provider, e.event_key, true AS inserted, e.status, e.attempts, e.fingerprint,
              0::bigint AS lease_left_ms, e.result_status, e.result_content_type,
              e.result_body, e.mode
)",
            $others,
            "
SELECT * FROM queued
UNION ALL
SELECT w.provider, w.event_key, false, w.status, w.attempts, w.fingerprint,
       GREATEST(0, extract(epoch FROM w.locked_until - now()) * 1000)::bigint,
       w.result_status, w.result_content_type, w.result_body, w.mode
FROM input i
CROSS JOIN LATERAL (
    SELECT * FROM webhook_events w
    WHERE w.provider = i.provider AND w.event_key = i.event_key
    OFFSET 0) w
WHERE (i.provider, i.event_key) NOT IN (SELECT provider, event_key FROM queued)",
            $report
        )
    };
}

/// Enqueues of many events: the single-row `ENQUEUE` over `unnest`ed input — each key
/// inserted (queued, or taken at once when its `start_ms` is set), or reported as it
/// stands.
///
/// Locks each new row's index slot, in key order; a concurrent enqueue or claim of one of
/// these keys waits for this statement's commit. As with the claim batch, a key whose row
/// another transaction inserted after this statement's snapshot is missing from the
/// report; its call runs alone.
pub(super) const ENQUEUE_BATCH: &str = pg_enqueue_batch!("", "");

/// [`ENQUEUE_BATCH`] for calls with other routes: the other routes' rows of the keys it
/// wrote are written by the same statement (`$9`…`$17`, as `CLAIM_ROUTED`'s `$8`…`$16`).
pub(super) const ENQUEUE_ROUTED: &str = pg_enqueue_batch!(
    pg_others!(
        "queued",
        "$9::text[], $10::text[], $11::text[], $12::text[], $13::bytea[], $14::text[],
                         $15::text[], $16::int8[], $17::bool[]"
    ),
    pg_others_report!("NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL")
);

/// Completions for many attempts: the single-row `COMPLETE`, fenced per row.
///
/// Locks each matching row; rows whose attempt or status moved on match nothing and are
/// not returned (stale). A deadlock with another node's batch falls back to single rows.
/// The status is checked with `IS NOT DISTINCT FROM`, which no index serves, so the rows are
/// found by the primary key per input key (see `sql.rs`).
///
/// The joined input carries only the keys, the attempt and the position `n`; the results
/// are read from their arrays by position. An `UPDATE … FROM` keeps a copy of each joined
/// row (for re-checking a concurrently updated row), and copying the result bodies into
/// those cost about 7 % of Postgres's time on first runs.
///
/// History rows (for attempts that were not plain first runs) are written from the same
/// statement, read from their arrays (`$7`…`$10`) by position; a NULL path writes none.
pub(super) const COMPLETE_BATCH: &str = "
WITH done AS (
    UPDATE webhook_events AS e
    SET status = 'done', result_status = ($4::int2[])[u.n],
        result_content_type = ($5::text[])[u.n], result_body = ($6::bytea[])[u.n],
        locked_until = NULL, last_error = NULL, dead_reason = NULL,
        payload = CASE WHEN e.keep_payload THEN e.payload END,
        content_type = CASE WHEN e.keep_payload THEN e.content_type END,
        request_headers = CASE WHEN e.keep_payload THEN e.request_headers END,
        updated_at = now()
    FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::int4[]) WITH ORDINALITY
              AS u(provider, event_key, attempts, n)
          ORDER BY provider, event_key) AS u
    WHERE e.provider = u.provider AND e.event_key = u.event_key
      AND e.attempts = u.attempts AND e.status IS NOT DISTINCT FROM 'in_progress'
    RETURNING e.provider, e.event_key, e.slot, e.mode, e.attempts, u.n),
history AS (
    INSERT INTO webhook_attempts
        (provider, event_key, slot, attempt, path, node, mode, outcome, started_at, ended_at,
         target_status, answer)
    SELECT provider, event_key, slot, attempts, ($7::text[])[n], ($8::text[])[n], mode, 'done',
           now() - ($9::int8[])[n] * interval '1 millisecond', now(), ($4::int2[])[n],
           ($10::text[])[n]
    FROM done WHERE ($7::text[])[n] IS NOT NULL)
SELECT provider, event_key FROM done";

/// [`COMPLETE_BATCH`] for a batch without history rows (first runs that ended done: the
/// hot path), with nothing of the history's statement to plan or run.
pub(super) const COMPLETE_BATCH_PLAIN: &str = "
UPDATE webhook_events AS e
SET status = 'done', result_status = ($4::int2[])[u.n],
    result_content_type = ($5::text[])[u.n], result_body = ($6::bytea[])[u.n],
    locked_until = NULL, last_error = NULL, dead_reason = NULL,
    payload = CASE WHEN e.keep_payload THEN e.payload END,
    content_type = CASE WHEN e.keep_payload THEN e.content_type END,
    request_headers = CASE WHEN e.keep_payload THEN e.request_headers END,
    updated_at = now()
FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::int4[]) WITH ORDINALITY
          AS u(provider, event_key, attempts, n)
      ORDER BY provider, event_key) AS u
WHERE e.provider = u.provider AND e.event_key = u.event_key
  AND e.attempts = u.attempts AND e.status IS NOT DISTINCT FROM 'in_progress'
RETURNING e.provider, e.event_key";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_on_slots_probes_those_partitions_alone_behind_its_guard() {
        for whole in [CLAIM_BATCH, CLAIM_ROUTED] {
            let text = claim_on_slots(whole, &[0, 3, 6]);
            assert!(!text.contains(pg_found_whole!()), "{text}");
            for slot in [0, 3, 6] {
                assert_eq!(
                    text.matches(&format!("FROM webhook_events_s{slot} w"))
                        .count(),
                    1,
                    "{text}"
                );
            }
            assert!(!text.contains("webhook_events_s1"), "{text}");
            assert!(text.contains("o.slot NOT IN (0, 3, 6)"), "{text}");
            // Each probe can be skipped by its key's bit, under the sealings given.
            let (skip, sealed) = (last_param(whole) + 1, last_param(whole) + 2);
            assert_eq!(last_param(&text), sealed, "{text}");
            assert!(text.contains(&format!("${skip}::int4[])")), "{text}");
            assert!(text.contains("first_path, skip)"), "{text}");
            for bit in [1, 8, 64] {
                assert!(text.contains(&format!("(i.skip & {bit}) = 0")), "{text}");
            }
            assert_eq!(
                text.matches(&format!("${sealed}::timestamptz[]")).count(),
                2
            );
            // The insert stays on the partitioned table (the ring's lock), and nothing
            // is claimed or reported unless the guard holds.
            assert!(text.contains("INSERT INTO webhook_events AS e"), "{text}");
            assert_eq!(text.matches("EXISTS (SELECT FROM current)").count(), 2);
            assert_eq!(claim_on_slots(whole, &[]), whole);
        }
        for whole in [ENQUEUE_BATCH, ENQUEUE_ROUTED] {
            let text = claim_on_slots(whole, &[4, 6]);
            let (skip, sealed) = (last_param(whole) + 1, last_param(whole) + 2);
            assert_eq!(last_param(&text), sealed, "{text}");
            assert!(
                text.contains(&format!("$8::bool[], ${skip}::int4[])")),
                "{text}"
            );
            assert!(text.contains("keep_payload, skip)"), "{text}");
            assert!(text.contains("(i.skip & 16) = 0"), "{text}");
            assert!(text.contains("o.slot NOT IN (4, 6)"), "{text}");
            // The own rows' probe is named, under the guard; the other routes' is not.
            assert_eq!(
                text.matches("FROM webhook_events_s4 w").count(),
                1,
                "{text}"
            );
            assert!(text.contains("AND EXISTS (SELECT FROM current)\n    ORDER BY i.provider"));
            assert!(
                text.contains("w.event_key = i.event_key\n    OFFSET 0"),
                "{text}"
            );
        }
        // The single claim's skips are one `int4` after its eight parameters.
        let text = claim_on_slots(super::super::sql::CLAIM, &[2, 0]);
        assert_eq!(last_param(&text), 10, "{text}");
        assert!(text.contains("($9::int4 & 4) = 0"), "{text}");
        assert!(text.contains("($9::int4 & 1) = 0"), "{text}");
        assert!(text.contains("$10::timestamptz[]"), "{text}");
    }
}
