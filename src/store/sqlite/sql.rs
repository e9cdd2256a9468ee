//! The embedded store's own statements (a claim, an outcome, a replay, sweeping, sizes),
//! its migrations, and the one helper that writes an attempt's history row; run by
//! `store.rs`. The queue's statements are in `queue.rs`, operators' in `operator_sql.rs`.

use rusqlite::{params, Connection};

use super::writer::sql_error;
use crate::store::{millis, History, StoreError};

/// The migrations, applied in order, each once.
pub(super) const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_webhook_events.sql")),
    (2, include_str!("migrations/0002_request_headers.sql")),
    (3, include_str!("migrations/0003_queue.sql")),
    (4, include_str!("migrations/0004_throttles.sql")),
    (5, include_str!("migrations/0005_history.sql")),
    (6, include_str!("migrations/0006_replay_items_at.sql")),
];

/// Claim: insert the key, or take over a sync row that is `failed` or has an expired lease
/// (never a queue row: see Postgres's `pg_claim_conflict`), in one upsert; a new row is
/// claimed under the path `?8` (`first_run` or `filtered`, which a retake keeps);
/// `RETURNING` yields a row only when the claim was won. Runs under the transaction's write
/// lock, so the report that follows a lost claim reads the row as this upsert left it.
pub(super) const CLAIM: &str = "
INSERT INTO webhook_events
    (provider, event_key, status, attempts, last_path, fingerprint, locked_until,
     created_at, updated_at, payload, content_type, request_headers, keep_payload)
VALUES (?1, ?2, 'in_progress', 1, ?8, ?3,
        unixepoch('subsec') + ?4 / 1000.0, unixepoch('subsec'), unixepoch('subsec'),
        ?5, ?6, ?7, ?5 IS NOT NULL)
ON CONFLICT (provider, event_key) DO UPDATE
SET status = 'in_progress',
    attempts = webhook_events.attempts + 1,
    last_path = CASE WHEN webhook_events.last_path = 'filtered' THEN 'filtered'
                     WHEN webhook_events.status = 'failed' THEN 'retry_after_failure'
                     ELSE 'lease_retake' END,
    locked_until = excluded.locked_until,
    updated_at = excluded.updated_at
WHERE webhook_events.mode = 'sync'
  AND (webhook_events.status = 'failed'
       OR (webhook_events.status = 'in_progress'
           AND webhook_events.locked_until <= unixepoch('subsec')))
  AND (webhook_events.fingerprint IS NULL OR excluded.fingerprint IS NULL
       OR webhook_events.fingerprint = excluded.fingerprint)
RETURNING attempts, last_path";

/// Complete, fenced by the attempt (see Postgres's `COMPLETE`).
pub(super) const COMPLETE: &str = "
UPDATE webhook_events
SET status = 'done', result_status = ?4, result_content_type = ?5, result_body = ?6,
    locked_until = NULL, last_error = NULL, dead_reason = NULL,
    payload = CASE WHEN keep_payload THEN payload END,
    content_type = CASE WHEN keep_payload THEN content_type END,
    request_headers = CASE WHEN keep_payload THEN request_headers END,
    updated_at = unixepoch('subsec')
WHERE provider = ?1 AND event_key = ?2 AND attempts = ?3 AND status = 'in_progress'";

/// An attempt's history row, after its outcome changed the row (in the same transaction:
/// the write lock is held from the outcome's update to here).
pub(super) const HISTORY: &str = "
INSERT INTO webhook_attempts
    (provider, event_key, attempt, path, node, mode, outcome, started_at, ended_at,
     target_status, error, answer)
SELECT provider, event_key, ?3, ?4, ?5, mode, ?6, unixepoch('subsec') - ?7 / 1000.0,
       unixepoch('subsec'), ?8, ?9, ?10
FROM webhook_events WHERE provider = ?1 AND event_key = ?2";

/// Fail or dead-letter, fenced by the attempt; releases the lease at once. Kept request
/// headers are replaced only by another request's (a replay has none and keeps them).
pub(super) const FAIL: &str = "
UPDATE webhook_events
SET status = ?4, last_error = ?5, dead_reason = ?6, payload = ?7, content_type = ?8,
    request_headers = COALESCE(?9, request_headers), locked_until = NULL,
    updated_at = unixepoch('subsec'),
    next_attempt_at = CASE WHEN ?10 IS NULL THEN next_attempt_at
                           ELSE unixepoch('subsec') + ?10 / 1000.0 END,
    throttles = throttles + ?11
WHERE provider = ?1 AND event_key = ?2 AND attempts = ?3 AND status = 'in_progress'";

/// Replay: reopen a dead letter as a new attempt, due for no scheduler before its lease
/// ends. Under the write lock, of concurrent replays only the first still sees `dead`.
pub(super) const REPLAY: &str = "
UPDATE webhook_events
SET status = 'in_progress', attempts = attempts + 1, last_path = 'replay',
    locked_until = unixepoch('subsec') + ?3 / 1000.0,
    next_attempt_at = unixepoch('subsec') + ?3 / 1000.0, updated_at = unixepoch('subsec')
WHERE provider = ?1 AND event_key = ?2 AND status = 'dead' AND payload IS NOT NULL
RETURNING attempts, payload, content_type, fingerprint, mode";

/// Sweep one bounded batch of old rows of one status (oldest first, by the index).
pub(super) const SWEEP: &str = "
DELETE FROM webhook_events WHERE rowid IN (
    SELECT rowid FROM webhook_events
    WHERE status = ?1 AND updated_at < unixepoch('subsec') - ?2 / 1000.0
    ORDER BY updated_at LIMIT ?3)";

/// How far past retention the oldest kept row is, in ms (0 when none is): the oldest
/// `done` row against `?1` ms, the oldest dead letter against `?2`; the first entry of the
/// (status, updated_at) index for each.
pub(super) const BACKLOG: &str = "
SELECT max(0,
    coalesce((unixepoch('subsec') - (SELECT min(updated_at) FROM webhook_events
                                      WHERE status = 'done')) * 1000 - ?1, 0),
    coalesce((unixepoch('subsec') - (SELECT min(updated_at) FROM webhook_events
                                      WHERE status = 'dead')) * 1000 - ?2, 0))";

/// The bytes of each table with its indexes: the pages the `dbstat` table counts for each
/// b-tree, by the table it belongs to.
pub(super) const TABLE_SIZES: &str = "
SELECT coalesce(m.tbl_name, d.name) AS tbl, sum(d.pgsize) AS bytes
FROM dbstat d LEFT JOIN sqlite_schema m ON m.name = d.name
GROUP BY tbl";

/// Writes `history` for attempt `attempts` of the row, after its outcome (same transaction).
pub(super) fn write_history(
    conn: &Connection,
    provider: &str,
    key: &str,
    attempts: i32,
    history: &History,
    error: Option<&str>,
) -> Result<(), StoreError> {
    conn.prepare_cached(HISTORY)
        .and_then(|mut s| {
            s.execute(params![
                provider,
                key,
                attempts,
                history.path.as_str(),
                &*history.node,
                history.outcome,
                millis(history.took),
                history.target_status,
                error,
                history.answer
            ])
        })
        .map(|_| ())
        .map_err(sql_error)
}
