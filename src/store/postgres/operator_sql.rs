//! The Postgres store's operator statements, run by `operator.rs`: an event's history,
//! searches, counts, paused providers and bulk replay jobs. Each says what it locks; none
//! is on a sender's path.

/// History: one event's latest `$4` attempts numbered below `$3` (all when NULL), newest
/// first, from its primary key read backwards. A plain read; rows written meanwhile are
/// newer and on no page asked for yet.
pub(super) const HISTORY: &str = "
SELECT attempt, path, node, mode, outcome,
       extract(epoch FROM started_at)::float8 AS started_unix,
       extract(epoch FROM ended_at)::float8 AS ended_unix,
       target_status, error, answer
FROM webhook_attempts
WHERE provider = $1 AND event_key = $2 AND attempt < COALESCE($3::int, 2147483647)
ORDER BY attempt DESC LIMIT $4";

/// How many history rows one event has: its primary key's entries (an index-only scan once
/// vacuumed; the table is only ever inserted into and deleted from). A plain read.
pub(super) const HISTORY_COUNT: &str = "
SELECT count(*)::bigint AS n FROM webhook_attempts WHERE provider = $1 AND event_key = $2";

/// Count: how many rows match a filter (`$1` provider, `$2` status, `$3` last path, `$4`
/// key prefix, exactly, `$5` mode, `$6` dead reason, `$7`…`$10` created and changed from /
/// before, Unix seconds; each ignored when NULL), for a bulk replay's plan. A plain read;
/// a bulk replay's filter has a status, and the count walks that status's index entries.
pub(super) const COUNT: &str = "
SELECT count(*)::bigint AS n FROM webhook_events
WHERE ($1::text IS NULL OR provider = $1)
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR last_path = $3)
  AND ($4::text IS NULL OR starts_with(event_key, $4))
  AND ($5::text IS NULL OR mode = $5)
  AND ($6::text IS NULL OR dead_reason = $6)
  AND ($7::float8 IS NULL OR created_at >= to_timestamp($7))
  AND ($8::float8 IS NULL OR created_at < to_timestamp($8))
  AND ($9::float8 IS NULL OR updated_at >= to_timestamp($9))
  AND ($10::float8 IS NULL OR updated_at < to_timestamp($10))";

/// Rows per provider and status: the one operator read that must read every row, so it
/// reads them in the cheapest order, one after the other. The operators' sessions rule
/// sequential scans out (and sorts: the groups are put in order by the caller); this one
/// simple query, a transaction of its own, lets them back in for itself only — through the
/// primary key instead, a million rows took three times as long (docs/performance.md). A
/// plain read: it locks nothing a write waits for.
pub(super) const STATUS_COUNTS: &str = "SET LOCAL enable_seqscan = on;
SELECT provider, status, count(*) FROM webhook_events GROUP BY provider, status";

/// Pause: one row per paused provider; a concurrent pause of the same one does nothing.
pub(super) const PAUSE: &str =
    "INSERT INTO hookgate_paused (provider) VALUES ($1) ON CONFLICT DO NOTHING";
/// Resume: deletes the provider's row, if any.
pub(super) const RESUME: &str = "DELETE FROM hookgate_paused WHERE provider = $1";
/// The paused providers. A plain read.
pub(super) const PAUSED: &str = "SELECT provider FROM hookgate_paused ORDER BY provider";

/// Retry now: a failed queue row becomes due at once. Locks the one row; a concurrent take
/// waits, then takes it as due.
pub(super) const RETRY_NOW: &str = "
UPDATE webhook_events SET next_attempt_at = now()
WHERE provider = $1 AND event_key = $2 AND mode = 'queue'
  AND status IS NOT DISTINCT FROM 'failed'";

/// A job's columns.
macro_rules! job_columns {
    () => {
        "id, filter, status, total, replayed, failed, rate, owner,
         extract(epoch FROM created_at)::float8 AS created_at,
         extract(epoch FROM updated_at)::float8 AS updated_at"
    };
}

pub(super) const CREATE_JOB: &str = "
INSERT INTO hookgate_replay_jobs (filter, status, total, rate)
VALUES ($1, 'running', $2, $3) RETURNING id";

pub(super) const JOB: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM hookgate_replay_jobs WHERE id = $1"
);

pub(super) const JOBS: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM hookgate_replay_jobs ORDER BY id DESC LIMIT $1"
);

/// Claim a job: the oldest running one nobody holds, or whose holder's lease ran out. The
/// inner select locks it with `FOR UPDATE SKIP LOCKED`: a node claiming at the same moment
/// skips it, so one node runs a job at a time.
pub(super) const CLAIM_JOB: &str = concat!(
    "
UPDATE hookgate_replay_jobs
SET owner = $1, lease_until = now() + $2::bigint * interval '1 millisecond', updated_at = now()
WHERE id = (SELECT id FROM hookgate_replay_jobs
            WHERE status = 'running' AND (owner IS NULL OR lease_until < now())
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING ",
    job_columns!()
);

/// Claim job `$3` by its id, on CLAIM_JOB's terms. Locks that job's row only; a claim of
/// the same job at the same moment waits for it, then finds the row held (Postgres checks
/// the condition again on the row as updated) and takes nothing, and CLAIM_JOB's `SKIP
/// LOCKED` passes it by.
pub(super) const CLAIM_JOB_BY_ID: &str = concat!(
    "
UPDATE hookgate_replay_jobs
SET owner = $1, lease_until = now() + $2::bigint * interval '1 millisecond', updated_at = now()
WHERE id = $3 AND status = 'running' AND (owner IS NULL OR lease_until < now())
RETURNING ",
    job_columns!()
);

/// Renew: the holder extends its lease while the job still runs and is still its own.
/// Locks the job's row.
pub(super) const RENEW_JOB: &str = "
UPDATE hookgate_replay_jobs
SET lease_until = now() + $3::bigint * interval '1 millisecond', updated_at = now()
WHERE id = $1 AND owner = $2 AND status = 'running'";

/// Begin an item: one row per (job, event); a second begin of the same does nothing.
pub(super) const BEGIN_ITEM: &str = "
INSERT INTO hookgate_replay_items (job_id, provider, event_key, outcome)
VALUES ($1, $2, $3, 'running') ON CONFLICT DO NOTHING";

/// Forget a begun item that did nothing. Locks the item.
pub(super) const FORGET_ITEM: &str = "
DELETE FROM hookgate_replay_items
WHERE job_id = $1 AND provider = $2 AND event_key = $3 AND outcome = 'running'";

/// Note why a begun item waits. Locks the item; an item already ended is left alone.
pub(super) const NOTE_ITEM: &str = "
UPDATE hookgate_replay_items SET detail = $4
WHERE job_id = $1 AND provider = $2 AND event_key = $3 AND outcome = 'running'";

/// End an item and count it on its job, in one statement. Locks the item and the job row.
pub(super) const END_ITEM: &str = "
WITH item AS (
    UPDATE hookgate_replay_items SET outcome = $4, detail = $5, at = now()
    WHERE job_id = $1 AND provider = $2 AND event_key = $3)
UPDATE hookgate_replay_jobs
SET replayed = replayed + $6, failed = failed + $7, updated_at = now()
WHERE id = $1";

/// Finish: the holder marks its running job done. Locks the job's row.
pub(super) const FINISH_JOB: &str = "
UPDATE hookgate_replay_jobs
SET status = 'done', owner = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND owner = $2 AND status = 'running'";

/// Cancel: a running job stops; its holder sees it at its next renewal.
pub(super) const CANCEL_JOB: &str = "
UPDATE hookgate_replay_jobs SET status = 'cancelled', updated_at = now()
WHERE id = $1 AND status = 'running'";

/// A job's latest results: a plain read, newest first by the (job_id, at) index; its time
/// is named apart from the column (see `record_columns!`), so the index gives the order.
pub(super) const JOB_ITEMS: &str = "
SELECT provider, event_key, outcome, detail, extract(epoch FROM at)::float8 AS at_unix
FROM hookgate_replay_items WHERE job_id = $1 ORDER BY at DESC LIMIT $2";
