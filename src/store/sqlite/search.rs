//! The embedded store's searches and lists (`store/search.rs` says what they answer), on
//! the reader thread: each status read in the page order by its own scan of the (status,
//! updated_at) index, the scans merged here row by row, at most [`SCAN_BUDGET`] rows read,
//! the filter's other conditions tested on them. A plain read in one snapshot: it locks
//! nothing a write waits for.

use rusqlite::{params, Connection, Rows};

use super::rows::{select_summary, summary};
use super::writer::sql_error;
use crate::claim::Status;
use crate::store::operator::SearchFilter;
use crate::store::page::{micros, PageCursor};
use crate::store::search::{matches, page, start, Order, SearchPage, SCAN_BUDGET};
use crate::store::{EventSummary, StoreError};

/// One status's rows (`?1`), last changed first, changed at or before `?2` and at or after
/// `?3` (Unix seconds): the (status, updated_at) index read backwards between the two; ties
/// on `updated_at` put in order as they come.
pub(super) const NEWEST: &str = "WHERE status = ?1 AND updated_at <= ?2 AND updated_at >= ?3
ORDER BY updated_at DESC, provider DESC, event_key DESC";

/// One status's rows (`?1`), least recently changed first.
pub(super) const OLDEST: &str = "WHERE status = ?1 ORDER BY updated_at, provider, event_key";

/// A row's place in the page order: its time of change in whole microseconds (as cursors
/// hold it), then provider and key, compared as SQLite's `BINARY` compares them.
fn place(row: &EventSummary) -> (i64, &str, &str) {
    (micros(row.updated_at), &row.id.provider, &row.id.key)
}

/// The next row of one status's scan.
fn next(rows: &mut Rows<'_>) -> Result<Option<EventSummary>, StoreError> {
    match rows.next().map_err(sql_error)? {
        Some(row) => summary(row).map_err(sql_error)?.map(Some),
        None => Ok(None),
    }
}

/// A page of rows matching `filter` in `order`, after `after` (newest first only), at most
/// `limit`.
pub(crate) fn scan(
    conn: &Connection,
    filter: &SearchFilter,
    after: Option<&PageCursor>,
    limit: u32,
    order: Order,
) -> Result<SearchPage, StoreError> {
    let statuses: Vec<Status> = match filter.status {
        Some(status) => vec![status],
        None => Status::ALL.to_vec(),
    };
    let start = match order {
        Order::Newest => start(filter, after),
        Order::Oldest => None,
    };
    // The index bounds, loose by a microsecond: the start's own ties are tested below.
    let upto = start
        .as_ref()
        .map_or(f64::MAX, |(us, _, _)| (*us as f64 + 1.0) / 1e6);
    let from = filter.updated_after.unwrap_or(f64::MIN);
    let sql = select_summary(match order {
        Order::Newest => NEWEST,
        Order::Oldest => OLDEST,
    });
    let mut statements = Vec::with_capacity(statuses.len());
    for _ in &statuses {
        statements.push(conn.prepare_cached(&sql).map_err(sql_error)?);
    }
    let mut scans = Vec::with_capacity(statuses.len());
    for (statement, status) in statements.iter_mut().zip(&statuses) {
        let rows = match order {
            Order::Newest => statement.query(params![status.as_str(), upto, from]),
            Order::Oldest => statement.query(params![status.as_str()]),
        };
        scans.push(rows.map_err(sql_error)?);
    }
    let mut heads = Vec::with_capacity(scans.len());
    for rows in &mut scans {
        heads.push(next(rows)?);
    }
    let (mut read, mut hits, mut end) = (0, Vec::new(), None);
    let limit_rows = usize::try_from(limit).unwrap_or(usize::MAX);
    loop {
        // The head that comes first in the page order.
        let first = heads
            .iter()
            .enumerate()
            .filter_map(|(i, head)| head.as_ref().map(|row| (i, row)))
            .reduce(|a, b| {
                let b_first = match order {
                    Order::Newest => place(b.1) > place(a.1),
                    Order::Oldest => place(b.1) < place(a.1),
                };
                if b_first {
                    b
                } else {
                    a
                }
            })
            .map(|(i, _)| i);
        let Some(i) = first else { break };
        let Some(row) = heads[i].take() else { break };
        heads[i] = next(&mut scans[i])?;
        if let Some((us, provider, key)) = &start {
            if place(&row) >= (*us, provider.as_str(), key.as_str()) {
                continue;
            }
        }
        read += 1;
        if read == SCAN_BUDGET {
            end = Some(PageCursor::after(row.updated_at, &row.id));
        }
        if matches(filter, &row) {
            hits.push(row);
            if hits.len() > limit_rows {
                break;
            }
        }
        if read == SCAN_BUDGET {
            break;
        }
    }
    Ok(page(hits, end, limit))
}
