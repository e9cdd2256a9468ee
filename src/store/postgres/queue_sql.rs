//! The Postgres statements of queue mode and of the events no sender will retry. Each
//! says which rows it locks and what a concurrent caller sees; `now()` is the only clock.

use super::sql::pg_slot_of;

/// The values of a new queue row, from `$1`…`$7` (provider, key, fingerprint, payload,
/// content type, headers, start lease in ms): `queued` and due now, or — with a start lease
/// — already taken for its first attempt, holding that lease (and due again at its end).
macro_rules! pg_queue_values {
    ($start:expr) => {
        concat!(
            "CASE WHEN ",
            $start,
            " IS NULL THEN 'queued' ELSE 'in_progress' END,
            CASE WHEN ",
            $start,
            " IS NULL THEN 0 ELSE 1 END,
            CASE WHEN ",
            $start,
            " IS NULL THEN 'queued' ELSE 'first_run' END"
        )
    };
}
pub(crate) use pg_queue_values;

/// Enqueue: write a queue event with its payload, due now (or taken at once, `$7`) — or
/// report the row when the key is known.
///
/// Locks the new row's index slot; a concurrent enqueue of the same key waits, then does
/// nothing and reports our row. As with the claim, the report may miss a row a concurrent
/// insert committed after this statement's snapshot; the caller runs it again.
pub(crate) const ENQUEUE: &str = concat!(
    "
WITH queued AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, slot, status, attempts, last_path, fingerprint, mode, payload,
         content_type, request_headers, next_attempt_at, locked_until, keep_payload)
    SELECT $1::text, $2::text, s.slot, ",
    pg_queue_values!("$7::bigint"),
    ", $3::text, 'queue', $4::bytea, $5::text, $6::text,
            now() + COALESCE($7::bigint, 0) * interval '1 millisecond',
            now() + $7::bigint * interval '1 millisecond', $8::bool
    FROM (SELECT ",
    pg_slot_of!("$1", "$2"),
    " AS slot) s
    -- A row found in a sealed slot is only reported, never written over: a sealed slot
    -- takes no key (a row swept since the snapshot would otherwise come back there).
    WHERE s.slot = (SELECT c.slot FROM hookgate_slots c WHERE c.state = 'current')
    ON CONFLICT (provider, event_key, slot) DO NOTHING
    RETURNING true AS inserted, e.status, e.attempts, e.fingerprint, 0::bigint AS lease_left_ms,
              e.result_status, e.result_content_type, e.result_body, e.mode
)
SELECT * FROM queued
UNION ALL
SELECT false, status, attempts, fingerprint,
       GREATEST(0, extract(epoch FROM locked_until - now()) * 1000)::bigint,
       result_status, result_content_type, result_body, mode
FROM webhook_events
WHERE provider = $1 AND event_key = $2 AND NOT EXISTS (SELECT 1 FROM queued)"
);

/// Take: the claim's rule on an existing queue row that is due — `queued`, `failed` past
/// its backoff, or `in_progress` past its lease — for one attempt with a lease of `$3` ms.
///
/// Locks the one row with `FOR UPDATE SKIP LOCKED`: a node taking the same row right now
/// makes this one skip it (no row returned), so two nodes never take one row; a taker that
/// comes after our commit finds a live lease and returns nothing.
pub(crate) const TAKE: &str = "
UPDATE webhook_events AS e
SET status = 'in_progress', attempts = e.attempts + 1,
    last_path = CASE e.status WHEN 'queued' THEN 'first_run'
                              WHEN 'failed' THEN 'retry_after_failure'
                              ELSE 'lease_retake' END,
    locked_until = now() + $3::bigint * interval '1 millisecond',
    next_attempt_at = now() + $3::bigint * interval '1 millisecond',
    updated_at = now()
FROM (SELECT provider, event_key, slot FROM webhook_events
      WHERE provider = $1 AND event_key = $2 AND mode = 'queue' AND next_attempt_at <= now()
        AND (status IN ('queued', 'failed')
             OR (status = 'in_progress' AND locked_until <= now()))
      FOR UPDATE SKIP LOCKED) AS d
WHERE e.provider = d.provider AND e.event_key = d.event_key AND e.slot = d.slot
RETURNING e.attempts, e.attempts - e.throttles AS tries, e.last_path, e.payload,
          e.content_type, e.fingerprint,
          GREATEST(0, extract(epoch FROM now() - e.created_at) * 1000)::bigint AS age_ms,
          CASE WHEN strpos(e.request_headers, '\"traceparent\"') > 0
                 OR starts_with(e.request_headers, '~hg1:') THEN e.request_headers END
              AS trace_headers";

/// Take due: up to `$2` of one provider's due rows, longest due first, each taken as
/// [`TAKE`] takes one — one statement and one commit for the lot.
///
/// The inner select locks the rows it picks with `FOR UPDATE SKIP LOCKED`: rows another
/// node is taking right now are skipped, never waited for, so two nodes never take one row
/// and never deadlock. Its due conditions are re-checked on a row changed since the
/// snapshot (a claim that won it meanwhile leaves a live lease: not taken).
pub(crate) const TAKE_DUE: &str = "
UPDATE webhook_events AS e
SET status = 'in_progress', attempts = e.attempts + 1,
    last_path = CASE e.status WHEN 'queued' THEN 'first_run'
                              WHEN 'failed' THEN 'retry_after_failure'
                              ELSE 'lease_retake' END,
    locked_until = now() + $3::bigint * interval '1 millisecond',
    next_attempt_at = now() + $3::bigint * interval '1 millisecond',
    updated_at = now()
FROM (SELECT provider, event_key, slot FROM webhook_events
      WHERE provider = $1 AND mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
        AND next_attempt_at <= now()
        AND (status <> 'in_progress' OR locked_until <= now())
        AND event_key <> ALL($4::text[])
      ORDER BY next_attempt_at
      LIMIT $2
      FOR UPDATE SKIP LOCKED) AS d
WHERE e.provider = d.provider AND e.event_key = d.event_key AND e.slot = d.slot
RETURNING e.event_key, e.attempts, e.attempts - e.throttles AS tries, e.last_path, e.payload,
          e.content_type, e.fingerprint,
          GREATEST(0, extract(epoch FROM now() - e.created_at) * 1000)::bigint AS age_ms,
          CASE WHEN strpos(e.request_headers, '\"traceparent\"') > 0
                 OR starts_with(e.request_headers, '~hg1:') THEN e.request_headers END
              AS trace_headers";

/// Due: keys of one provider the scheduler may take, longest due first (the partial
/// `webhook_events_due` index). A row with a live lease is never offered, whatever its
/// `next_attempt_at` says.
///
/// Takes no lasting lock: `FOR UPDATE SKIP LOCKED` only skips rows another node is taking
/// this instant, and the locks end with the statement. The take itself decides.
pub(crate) const DUE: &str = "
SELECT event_key FROM webhook_events
WHERE provider = $1 AND mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
  AND next_attempt_at <= now()
  AND (status <> 'in_progress' OR locked_until <= now())
ORDER BY next_attempt_at
LIMIT $2
FOR UPDATE SKIP LOCKED";

/// Renew: extend a running queue attempt's lease, fenced by its attempt number.
///
/// Locks the one row; a retake (after the lease ran out) bumps `attempts`, and this then
/// matches nothing.
pub(crate) const RENEW: &str = "
UPDATE webhook_events
SET locked_until = now() + $4::bigint * interval '1 millisecond',
    next_attempt_at = now() + $4::bigint * interval '1 millisecond'
WHERE provider = $1 AND event_key = $2 AND attempts = $3
  AND status IS NOT DISTINCT FROM 'in_progress'";

/// Abandon: sync rows of one provider nobody delivered for longer than its sender's
/// horizon — `failed`, or `in_progress` with an expired lease — become dead letters
/// (`sender_gave_up`), at most `$3` at a time.
///
/// The inner select locks at most `$3` rows and skips any another transaction holds, so a
/// claim in flight is never waited on; a claim that comes after sees `dead`.
pub(crate) const ABANDON: &str = "
UPDATE webhook_events
SET status = 'dead', dead_reason = 'sender_gave_up', locked_until = NULL,
    last_error = COALESCE(last_error, 'the sender stopped retrying'), updated_at = now()
WHERE (provider, event_key, slot) IN (
    SELECT provider, event_key, slot FROM webhook_events
    WHERE provider = $1 AND mode = 'sync'
      AND updated_at <= now() - $2::bigint * interval '1 millisecond'
      AND (status = 'failed' OR (status = 'in_progress' AND locked_until <= now()))
    LIMIT $3
    FOR UPDATE SKIP LOCKED)";

/// Orphan: due queue rows whose provider is none of `$1` (removed from the config),
/// untouched for `$3` ms, become dead letters (`provider_removed`), at most `$2` at a time.
///
/// The inner select locks at most `$2` rows and skips any another transaction holds; a row
/// with a live lease (an attempt running somewhere) is left to finish first.
pub(crate) const ORPHAN: &str = "
UPDATE webhook_events
SET status = 'dead', dead_reason = 'provider_removed', locked_until = NULL,
    last_error = 'its provider is no longer configured', updated_at = now()
WHERE (provider, event_key, slot) IN (
    SELECT provider, event_key, slot FROM webhook_events
    WHERE mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
      AND NOT (provider = ANY($1)) AND next_attempt_at <= now()
      AND (status <> 'in_progress' OR locked_until <= now())
      AND updated_at <= now() - $3::bigint * interval '1 millisecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED)";

/// Orphan, sync rows: those of a provider that is none of `$1`, nobody delivered for `$3`
/// ms — `failed`, or `in_progress` with an expired lease — become dead letters
/// (`provider_removed`), at most `$2` at a time. Their senders now get 404, and no sweep of
/// a configured provider ([`ABANDON`]) sees them. Read by the `(status, updated_at)` index.
pub(crate) const ORPHAN_SYNC: &str = "
UPDATE webhook_events
SET status = 'dead', dead_reason = 'provider_removed', locked_until = NULL,
    last_error = COALESCE(last_error, 'its provider is no longer configured'),
    updated_at = now()
WHERE (provider, event_key, slot) IN (
    SELECT provider, event_key, slot FROM webhook_events
    WHERE mode = 'sync' AND status IN ('failed', 'in_progress')
      AND NOT (provider = ANY($1))
      AND (status = 'failed' OR locked_until <= now())
      AND updated_at <= now() - $3::bigint * interval '1 millisecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED)";

/// Queue depth per provider: unfinished queue rows and how long the oldest due one has
/// waited. A plain read over the partial index.
pub(crate) const QUEUE_DEPTH: &str = "
SELECT provider, count(*)::bigint AS rows,
       COALESCE(GREATEST(0, extract(epoch FROM now() - min(next_attempt_at)
           FILTER (WHERE next_attempt_at <= now())) * 1000), 0)::bigint AS oldest_due_ms
FROM webhook_events
WHERE mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
GROUP BY provider";
