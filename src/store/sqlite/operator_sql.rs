//! The embedded store's operator statements (see `postgres/operator_sql.rs` for each one's
//! meaning), run by `operator.rs`.

/// An event's latest `?4` attempts numbered below `?3` (all when NULL), newest first, by
/// its primary key read backwards (a plain read: the last committed ones).
pub(super) const HISTORY: &str = "
SELECT attempt, path, node, mode, outcome, started_at, ended_at, target_status, error, answer
FROM webhook_attempts
WHERE provider = ?1 AND event_key = ?2 AND attempt < coalesce(?3, 2147483647)
ORDER BY attempt DESC LIMIT ?4";

/// How many history rows one event has: its primary key's entries.
pub(super) const HISTORY_COUNT: &str =
    "SELECT count(*) FROM webhook_attempts WHERE provider = ?1 AND event_key = ?2";

/// The conditions of a count (a bulk replay's plan), `?1`…`?11` (each ignored when NULL).
/// The key prefix is the range `?4 <= event_key < ?11` ([`key_range`]): SQLite's `LIKE`
/// ignores ASCII case. A bulk replay's filter has a status: the count walks that status's
/// index entries.
pub(super) const SEARCH_WHERE: &str = "
WHERE (?1 IS NULL OR provider = ?1)
  AND (?2 IS NULL OR status = ?2)
  AND (?3 IS NULL OR last_path = ?3)
  AND (?4 IS NULL OR (event_key >= ?4 AND (?11 IS NULL OR event_key < ?11)))
  AND (?5 IS NULL OR mode = ?5)
  AND (?6 IS NULL OR dead_reason = ?6)
  AND (?7 IS NULL OR created_at >= ?7)
  AND (?8 IS NULL OR created_at < ?8)
  AND (?9 IS NULL OR updated_at >= ?9)
  AND (?10 IS NULL OR updated_at < ?10)";

/// Rows per provider and status: the whole table, in one snapshot on the reader thread
/// (seconds on a million rows). It locks nothing: claims and completions go on beside it,
/// and it does not see them.
pub(super) const STATUS_COUNTS: &str = "
SELECT provider, status, count(*) FROM webhook_events
GROUP BY provider, status ORDER BY provider, status";

pub(super) const PAUSE: &str = "
INSERT INTO hookgate_paused (provider, paused_at) VALUES (?1, unixepoch('subsec'))
ON CONFLICT DO NOTHING";
pub(super) const RESUME: &str = "DELETE FROM hookgate_paused WHERE provider = ?1";
/// The paused providers (a plain read).
pub(super) const PAUSED: &str = "SELECT provider FROM hookgate_paused ORDER BY provider";

pub(super) const RETRY_NOW: &str = "
UPDATE webhook_events SET next_attempt_at = unixepoch('subsec')
WHERE provider = ?1 AND event_key = ?2 AND mode = 'queue' AND status = 'failed'";

pub(super) const JOB_COLUMNS: &str =
    "id, filter, status, total, replayed, failed, rate, owner, created_at, updated_at";

pub(super) const CREATE_JOB: &str = "
INSERT INTO hookgate_replay_jobs (filter, status, total, rate, created_at, updated_at)
VALUES (?1, 'running', ?2, ?3, unixepoch('subsec'), unixepoch('subsec'))";

pub(super) const CLAIM_JOB: &str = "
UPDATE hookgate_replay_jobs
SET owner = ?1, lease_until = unixepoch('subsec') + ?2 / 1000.0, updated_at = unixepoch('subsec')
WHERE id = (SELECT id FROM hookgate_replay_jobs
            WHERE status = 'running' AND (owner IS NULL OR lease_until < unixepoch('subsec'))
            ORDER BY id LIMIT 1)
RETURNING id, filter, status, total, replayed, failed, rate, owner, created_at, updated_at";

/// Job `?3` by its id, on CLAIM_JOB's terms; the one writer connection runs it alone.
pub(super) const CLAIM_JOB_BY_ID: &str = "
UPDATE hookgate_replay_jobs
SET owner = ?1, lease_until = unixepoch('subsec') + ?2 / 1000.0, updated_at = unixepoch('subsec')
WHERE id = ?3 AND status = 'running'
  AND (owner IS NULL OR lease_until < unixepoch('subsec'))
RETURNING id, filter, status, total, replayed, failed, rate, owner, created_at, updated_at";

pub(super) const RENEW_JOB: &str = "
UPDATE hookgate_replay_jobs
SET lease_until = unixepoch('subsec') + ?3 / 1000.0, updated_at = unixepoch('subsec')
WHERE id = ?1 AND owner = ?2 AND status = 'running'";

pub(super) const BEGIN_ITEM: &str = "
INSERT INTO hookgate_replay_items (job_id, provider, event_key, outcome, at)
VALUES (?1, ?2, ?3, 'running', unixepoch('subsec')) ON CONFLICT DO NOTHING";

pub(super) const FORGET_ITEM: &str = "
DELETE FROM hookgate_replay_items
WHERE job_id = ?1 AND provider = ?2 AND event_key = ?3 AND outcome = 'running'";

/// Note why a begun item waits; an item already ended is left alone.
pub(super) const NOTE_ITEM: &str = "
UPDATE hookgate_replay_items SET detail = ?4
WHERE job_id = ?1 AND provider = ?2 AND event_key = ?3 AND outcome = 'running'";

pub(super) const END_ITEM: &str = "
UPDATE hookgate_replay_items SET outcome = ?4, detail = ?5, at = unixepoch('subsec')
WHERE job_id = ?1 AND provider = ?2 AND event_key = ?3";

pub(super) const COUNT_ITEM: &str = "
UPDATE hookgate_replay_jobs
SET replayed = replayed + ?2, failed = failed + ?3, updated_at = unixepoch('subsec')
WHERE id = ?1";

pub(super) const FINISH_JOB: &str = "
UPDATE hookgate_replay_jobs
SET status = 'done', owner = NULL, lease_until = NULL, updated_at = unixepoch('subsec')
WHERE id = ?1 AND owner = ?2 AND status = 'running'";

pub(super) const CANCEL_JOB: &str = "
UPDATE hookgate_replay_jobs SET status = 'cancelled', updated_at = unixepoch('subsec')
WHERE id = ?1 AND status = 'running'";

/// A job's latest results, newest first by the (job_id, at) index (a plain read: a job
/// running on the writer goes on beside it).
pub(super) const JOB_ITEMS: &str = "
SELECT provider, event_key, outcome, detail, at FROM hookgate_replay_items
WHERE job_id = ?1 ORDER BY at DESC LIMIT ?2";
