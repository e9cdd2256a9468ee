//! The embedded store's retention: deleting expired rows a batch at a time, the backlog
//! left past retention, and the tables' sizes on disk. Runs on the writer (deletes) and
//! the reader (the backlog, the sizes) the store hands it.

use std::time::Duration;

use rusqlite::{params, Connection};

use super::sql::{BACKLOG, SWEEP, TABLE_SIZES};
use super::writer::sql_error;
use crate::claim::Status;
use crate::store::retain::{Retained, Retention, TableSize, TABLES};
use crate::store::{millis, Store, StoreError};

/// A pass that deletes expired rows one statement of `policy.batch` rows at a time —
/// `done`, then dead letters — for as long as full batches come back and the budget lasts.
/// There is no ceiling but the budget: a pass keeps up with any rate the store can
/// delete at. Answers the rows deleted; the caller adds the backlog.
pub(super) async fn by_rows(store: &dyn Store, policy: &Retention) -> Result<Retained, StoreError> {
    let started = std::time::Instant::now();
    let mut retained = Retained::default();
    for (status, age) in [(Status::Done, policy.done), (Status::Dead, policy.dead)] {
        loop {
            let deleted = store.sweep(status, age, policy.batch).await?;
            match status {
                Status::Dead => retained.dead += deleted,
                _ => retained.done += deleted,
            }
            if deleted < u64::from(policy.batch) || started.elapsed() >= policy.budget {
                break;
            }
        }
    }
    Ok(retained)
}

/// Deletes up to `batch` rows in `status` older than `older_than`; answers how many.
pub(super) fn sweep(
    conn: &Connection,
    status: Status,
    older_than: Duration,
    batch: u32,
) -> Result<u64, StoreError> {
    let deleted = conn
        .prepare_cached(SWEEP)
        .and_then(|mut s| s.execute(params![status.as_str(), millis(older_than), batch]))
        .map_err(sql_error)?;
    Ok(deleted as u64)
}

/// How far past retention the oldest expired row is, for the given ages in milliseconds.
pub(super) fn backlog(
    conn: &Connection,
    done_ms: i64,
    dead_ms: i64,
) -> Result<Duration, StoreError> {
    let backlog_ms: f64 = conn
        .query_row(BACKLOG, params![done_ms, dead_ms], |r| r.get(0))
        .map_err(sql_error)?;
    Ok(Duration::from_secs_f64(backlog_ms.max(0.0) / 1000.0))
}

/// Each of hookgate's tables' bytes on disk (0 for one the file has no pages of).
pub(super) fn table_sizes(conn: &Connection) -> Result<Vec<TableSize>, StoreError> {
    let mut statement = conn.prepare_cached(TABLE_SIZES).map_err(sql_error)?;
    let rows = statement
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(sql_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql_error)?;
    Ok(TABLES
        .iter()
        .map(|table| TableSize {
            table,
            bytes: rows
                .iter()
                .find(|(name, _)| name == table)
                .map_or(0, |(_, b)| u64::try_from(*b).unwrap_or(0)),
        })
        .collect())
}
