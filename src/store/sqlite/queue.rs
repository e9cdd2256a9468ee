//! The embedded store's queue-mode operations and the abandoning of events no sender will
//! retry: the same rules as Postgres's (`postgres/queue_sql.rs`), run on the writer thread
//! inside its `BEGIN IMMEDIATE` transaction, which holds the database's single write lock —
//! so a take, and the report after a lost enqueue, see no concurrent writer. The queue
//! depth, a plain read, runs on the reader thread instead.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use rusqlite::{params, Connection, OptionalExtension};

use super::writer::sql_error;
use crate::claim::{Mode, Path, RowState};
use crate::key::EventId;
use crate::store::{millis, Enqueued, Fenced, QueueDepth, QueueRow, StoreError, Taken};

/// Enqueue: a new queue row, due now — or, with a start lease (`?7` ms), already taken for
/// its first attempt (see Postgres's `ENQUEUE`); nothing when the key is known.
const ENQUEUE: &str = "
INSERT INTO webhook_events
    (provider, event_key, status, attempts, last_path, fingerprint, mode, payload,
     content_type, request_headers, next_attempt_at, locked_until, created_at, updated_at,
     keep_payload)
VALUES (?1, ?2, CASE WHEN ?7 IS NULL THEN 'queued' ELSE 'in_progress' END,
        CASE WHEN ?7 IS NULL THEN 0 ELSE 1 END,
        CASE WHEN ?7 IS NULL THEN 'queued' ELSE 'first_run' END,
        ?3, 'queue', ?4, ?5, ?6, unixepoch('subsec') + COALESCE(?7, 0) / 1000.0,
        unixepoch('subsec') + ?7 / 1000.0, unixepoch('subsec'), unixepoch('subsec'), ?8)
ON CONFLICT (provider, event_key) DO NOTHING";

/// Take: the claim's rule on a due queue row (see Postgres's `TAKE`).
const TAKE: &str = "
UPDATE webhook_events
SET status = 'in_progress', attempts = attempts + 1,
    last_path = CASE status WHEN 'queued' THEN 'first_run'
                            WHEN 'failed' THEN 'retry_after_failure'
                            ELSE 'lease_retake' END,
    locked_until = unixepoch('subsec') + ?3 / 1000.0,
    next_attempt_at = unixepoch('subsec') + ?3 / 1000.0,
    updated_at = unixepoch('subsec')
WHERE provider = ?1 AND event_key = ?2 AND mode = 'queue'
  AND next_attempt_at <= unixepoch('subsec')
  AND (status IN ('queued', 'failed')
       OR (status = 'in_progress' AND locked_until <= unixepoch('subsec')))
RETURNING attempts, attempts - throttles, last_path, payload, content_type, fingerprint,
          CAST(MAX(0, unixepoch('subsec') - created_at) * 1000 AS INTEGER),
          CASE WHEN instr(request_headers, '\"traceparent\"') > 0
               OR substr(request_headers, 1, 5) = '~hg1:' THEN request_headers END";

/// Take due: up to `?2` of one provider's due rows, longest due first, as [`TAKE`] takes
/// one (read from the due index alone).
const TAKE_DUE: &str = "
UPDATE webhook_events
SET status = 'in_progress', attempts = attempts + 1,
    last_path = CASE status WHEN 'queued' THEN 'first_run'
                            WHEN 'failed' THEN 'retry_after_failure'
                            ELSE 'lease_retake' END,
    locked_until = unixepoch('subsec') + ?3 / 1000.0,
    next_attempt_at = unixepoch('subsec') + ?3 / 1000.0,
    updated_at = unixepoch('subsec')
WHERE rowid IN (
    SELECT rowid FROM webhook_events INDEXED BY webhook_events_due
    WHERE provider = ?1 AND mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
      AND next_attempt_at <= unixepoch('subsec')
      AND (status <> 'in_progress' OR locked_until <= unixepoch('subsec'))
      AND event_key NOT IN (SELECT value FROM json_each(?4))
    ORDER BY next_attempt_at LIMIT ?2)
RETURNING event_key, attempts, attempts - throttles, last_path, payload, content_type,
          fingerprint, CAST(MAX(0, unixepoch('subsec') - created_at) * 1000 AS INTEGER),
          CASE WHEN instr(request_headers, '\"traceparent\"') > 0
               OR substr(request_headers, 1, 5) = '~hg1:' THEN request_headers END";

/// Due keys of one provider, longest due first (the partial `webhook_events_due` index);
/// never a row with a live lease.
const DUE: &str = "
SELECT event_key FROM webhook_events
WHERE provider = ?1 AND mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
  AND next_attempt_at <= unixepoch('subsec')
  AND (status <> 'in_progress' OR locked_until <= unixepoch('subsec'))
ORDER BY next_attempt_at LIMIT ?2";

/// Renew a running queue attempt's lease, fenced by its attempt number.
const RENEW: &str = "
UPDATE webhook_events
SET locked_until = unixepoch('subsec') + ?4 / 1000.0,
    next_attempt_at = unixepoch('subsec') + ?4 / 1000.0
WHERE provider = ?1 AND event_key = ?2 AND attempts = ?3 AND status = 'in_progress'";

/// Abandon: stale sync rows of one provider become `sender_gave_up` dead letters.
const ABANDON: &str = "
UPDATE webhook_events
SET status = 'dead', dead_reason = 'sender_gave_up', locked_until = NULL,
    last_error = COALESCE(last_error, 'the sender stopped retrying'),
    updated_at = unixepoch('subsec')
WHERE rowid IN (
    SELECT rowid FROM webhook_events
    WHERE provider = ?1 AND mode = 'sync' AND updated_at <= unixepoch('subsec') - ?2 / 1000.0
      AND (status = 'failed'
           OR (status = 'in_progress' AND locked_until <= unixepoch('subsec')))
    LIMIT ?3)";

/// Orphan: due queue rows whose provider is not in the JSON array `?1` become
/// `provider_removed` dead letters (see Postgres's `ORPHAN`); read from the due index alone.
const ORPHAN: &str = "
UPDATE webhook_events
SET status = 'dead', dead_reason = 'provider_removed', locked_until = NULL,
    last_error = 'its provider is no longer configured', updated_at = unixepoch('subsec')
WHERE rowid IN (
    SELECT rowid FROM webhook_events INDEXED BY webhook_events_due
    WHERE mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
      AND provider NOT IN (SELECT value FROM json_each(?1))
      AND next_attempt_at <= unixepoch('subsec')
      AND (status <> 'in_progress' OR locked_until <= unixepoch('subsec'))
      AND updated_at <= unixepoch('subsec') - ?3 / 1000.0
    LIMIT ?2)";

/// Orphan, sync rows: `failed` ones, or `in_progress` with an expired lease, of providers
/// not in `?1` (see Postgres's `ORPHAN_SYNC`); read from the status index.
const ORPHAN_SYNC: &str = "
UPDATE webhook_events
SET status = 'dead', dead_reason = 'provider_removed', locked_until = NULL,
    last_error = COALESCE(last_error, 'its provider is no longer configured'),
    updated_at = unixepoch('subsec')
WHERE rowid IN (
    SELECT rowid FROM webhook_events INDEXED BY webhook_events_status_updated
    WHERE status IN ('failed', 'in_progress') AND mode = 'sync'
      AND provider NOT IN (SELECT value FROM json_each(?1))
      AND (status = 'failed' OR locked_until <= unixepoch('subsec'))
      AND updated_at <= unixepoch('subsec') - ?3 / 1000.0
    LIMIT ?2)";

/// Unfinished queue rows per provider and the age of the oldest due one, read from the
/// partial due index alone (`INDEXED BY`: without statistics the planner would walk the
/// status index — every `in_progress` and `failed` row, sync ones included — on every
/// `/stats` poll and metrics refresh). A plain read on the reader thread: locks nothing.
const QUEUE_DEPTH: &str = "
SELECT provider, count(*),
       CAST(COALESCE(MAX(0, unixepoch('subsec') - min(next_attempt_at)
           FILTER (WHERE next_attempt_at <= unixepoch('subsec'))), 0) * 1000 AS INTEGER)
FROM webhook_events INDEXED BY webhook_events_due
WHERE mode = 'queue' AND status IN ('queued', 'failed', 'in_progress')
GROUP BY provider";

/// The row a lost enqueue reports, read under the same write lock.
const ROW_STATE: &str = "
SELECT status, attempts, fingerprint,
       CAST(MAX(0, COALESCE(locked_until, 0) - unixepoch('subsec')) * 1000 AS INTEGER),
       result_status, result_content_type, result_body, mode
FROM webhook_events WHERE provider = ?1 AND event_key = ?2";

pub(crate) fn enqueue(conn: &Connection, item: &QueueRow) -> Result<Enqueued, StoreError> {
    let id = &item.id;
    let inserted = conn
        .prepare_cached(ENQUEUE)
        .and_then(|mut s| {
            s.execute(params![
                &*id.provider,
                &*id.key,
                item.fingerprint,
                &item.payload[..],
                item.content_type,
                item.headers,
                item.start.map(millis),
                item.keep_payload
            ])
        })
        .map_err(sql_error)?;
    if inserted == 1 {
        return Ok(Enqueued::Inserted);
    }
    let row = conn
        .prepare_cached(ROW_STATE)
        .and_then(|mut s| {
            s.query_row(params![&*id.provider, &*id.key], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i32>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, Option<u16>>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    r.get::<_, Option<Vec<u8>>>(6)?,
                    r.get::<_, String>(7)?,
                ))
            })
        })
        .map_err(sql_error)?;
    let (status, attempts, fingerprint, lease_ms, result_status, content_type, body, mode) = row;
    let mode =
        Mode::parse(&mode).ok_or_else(|| StoreError::Corrupt(format!("mode {mode:?}").into()))?;
    let state = RowState {
        mode,
        status: crate::claim::Status::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("status {status:?}").into()))?,
        attempts,
        fingerprint,
        lease_left: Duration::from_millis(u64::try_from(lease_ms).unwrap_or(0)),
        result: result_status.map(|status| crate::claim::StoredResult {
            status,
            content_type,
            body: body.unwrap_or_default(),
        }),
    };
    Ok(match mode {
        Mode::Sync => Enqueued::SyncRow(state),
        Mode::Queue => Enqueued::Existing(state),
    })
}

pub(crate) fn take(
    conn: &Connection,
    id: &EventId,
    lease: Duration,
) -> Result<Option<Taken>, StoreError> {
    conn.prepare_cached(TAKE)
        .and_then(|mut s| {
            s.query_row(params![&*id.provider, &*id.key, millis(lease)], |r| {
                taken_columns(r, 0)
            })
            .optional()
        })
        .map_err(sql_error)?
        .map(|columns| taken(id.clone(), columns))
        .transpose()
}

pub(crate) fn take_due(
    conn: &Connection,
    provider: &str,
    limit: u32,
    lease: Duration,
    busy: &[Arc<str>],
) -> Result<Vec<Taken>, StoreError> {
    let busy: Vec<&str> = busy.iter().map(|key| &**key).collect();
    let busy = serde_json::to_string(&busy).map_err(|e| StoreError::Query(e.to_string().into()))?;
    let mut stmt = conn.prepare_cached(TAKE_DUE).map_err(sql_error)?;
    let rows = stmt
        .query_map(params![provider, limit, millis(lease), busy], |r| {
            Ok((r.get::<_, String>(0)?, taken_columns(r, 1)?))
        })
        .map_err(sql_error)?;
    rows.map(|row| {
        let (key, columns) = row.map_err(sql_error)?;
        taken(EventId::new(provider, key), columns)
    })
    .collect()
}

/// The columns of a taken row from `first` on: attempts, tries, last path, payload, content
/// type, fingerprint, age in ms, kept headers holding a trace context.
type TakenColumns = (
    i32,
    i32,
    String,
    Option<Vec<u8>>,
    Option<String>,
    Option<String>,
    i64,
    Option<String>,
);

fn taken_columns(r: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<TakenColumns> {
    Ok((
        r.get(first)?,
        r.get(first + 1)?,
        r.get(first + 2)?,
        r.get(first + 3)?,
        r.get(first + 4)?,
        r.get(first + 5)?,
        r.get(first + 6)?,
        r.get(first + 7)?,
    ))
}

fn taken(id: EventId, columns: TakenColumns) -> Result<Taken, StoreError> {
    let (attempts, tries, path, payload, content_type, fingerprint, age_ms, trace_headers) =
        columns;
    Ok(Taken {
        id,
        attempts,
        tries,
        age: Duration::from_millis(u64::try_from(age_ms).unwrap_or(0)),
        path: Path::parse(&path)
            .ok_or_else(|| StoreError::Corrupt(format!("last_path {path:?}").into()))?,
        payload: Bytes::from(payload.unwrap_or_default()),
        content_type,
        fingerprint,
        trace_headers,
        unreadable: None,
    })
}

pub(crate) fn due(
    conn: &Connection,
    provider: &str,
    limit: u32,
) -> Result<Vec<EventId>, StoreError> {
    let mut stmt = conn.prepare_cached(DUE).map_err(sql_error)?;
    let keys = stmt
        .query_map(params![provider, limit], |r| r.get::<_, String>(0))
        .map_err(sql_error)?;
    keys.map(|k| Ok(EventId::new(provider, k.map_err(sql_error)?)))
        .collect()
}

pub(crate) fn renew(
    conn: &Connection,
    id: &EventId,
    attempts: i32,
    lease: Duration,
) -> Result<Fenced, StoreError> {
    let changed = conn
        .prepare_cached(RENEW)
        .and_then(|mut s| s.execute(params![&*id.provider, &*id.key, attempts, millis(lease)]))
        .map_err(sql_error)?;
    Ok(if changed == 1 {
        Fenced::Applied
    } else {
        Fenced::Stale
    })
}

pub(crate) fn abandon(
    conn: &Connection,
    provider: &str,
    horizon: Duration,
    batch: u32,
) -> Result<u64, StoreError> {
    let changed = conn
        .prepare_cached(ABANDON)
        .and_then(|mut s| s.execute(params![provider, millis(horizon), batch]))
        .map_err(sql_error)?;
    Ok(changed as u64)
}

pub(crate) fn orphan(
    conn: &Connection,
    known: &[String],
    grace: Duration,
    batch: u32,
) -> Result<u64, StoreError> {
    let known =
        serde_json::to_string(known).map_err(|e| StoreError::Query(e.to_string().into()))?;
    let mut changed = 0;
    for sql in [ORPHAN, ORPHAN_SYNC] {
        changed += conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(params![known, batch, millis(grace)]))
            .map_err(sql_error)?;
    }
    Ok(changed as u64)
}

pub(crate) fn queue_depth(conn: &Connection) -> Result<Vec<QueueDepth>, StoreError> {
    let mut stmt = conn.prepare_cached(QUEUE_DEPTH).map_err(sql_error)?;
    let rows = stmt
        .query_map([], |r| {
            Ok(QueueDepth {
                provider: r.get(0)?,
                rows: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                oldest_due: Duration::from_millis(u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0)),
            })
        })
        .map_err(sql_error)?;
    rows.map(|r| r.map_err(sql_error)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan SQLite picks for `sql` on the migrated schema, one detail line a step.
    fn plan(sql: &str) -> Vec<String> {
        let conn = Connection::open_in_memory().unwrap();
        for migration in [
            include_str!("migrations/0001_webhook_events.sql"),
            include_str!("migrations/0002_request_headers.sql"),
            include_str!("migrations/0003_queue.sql"),
            include_str!("migrations/0004_throttles.sql"),
        ] {
            conn.execute_batch(migration).unwrap();
        }
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        let details = stmt
            .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))
            .unwrap();
        details.map(Result::unwrap).collect()
    }

    #[test]
    fn the_queue_depth_reads_the_due_index_not_every_unfinished_row() {
        let steps = plan(QUEUE_DEPTH);
        assert!(
            steps.iter().any(|s| s.contains("INDEX webhook_events_due")),
            "{steps:?}"
        );
        assert!(
            !steps
                .iter()
                .any(|s| s.contains("webhook_events_status_updated")
                    || s.trim_end() == "SCAN webhook_events"),
            "{steps:?}"
        );
    }

    #[test]
    fn the_due_and_orphan_reads_and_the_batched_take_use_the_due_index() {
        for sql in [DUE, ORPHAN, TAKE_DUE] {
            let steps = plan(sql);
            assert!(
                steps.iter().any(|s| s.contains("webhook_events_due")),
                "{sql}: {steps:?}"
            );
        }
    }
}
