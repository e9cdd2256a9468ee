//! The embedded store's operator side (see `postgres/operator_sql.rs` for each statement's
//! meaning): a statement that writes runs on the writer thread, under its single write
//! lock, so a job's claim and an item's begin see no concurrent writer; a plain read runs
//! on the reader thread (`reader`), in a snapshot of its own, and locks nothing a write
//! waits for.

use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::operator_sql::{
    BEGIN_ITEM, CANCEL_JOB, CLAIM_JOB, CLAIM_JOB_BY_ID, COUNT_ITEM, CREATE_JOB, END_ITEM,
    FINISH_JOB, FORGET_ITEM, HISTORY, HISTORY_COUNT, JOB_COLUMNS, JOB_ITEMS, NOTE_ITEM, PAUSE,
    PAUSED, RENEW_JOB, RESUME, RETRY_NOW, SEARCH_WHERE, STATUS_COUNTS,
};
use super::reader::Reader;
use super::rows::{record, select_record};
use super::search;
use super::writer::{sql_error, Writer};
use crate::key::EventId;
use crate::store::operator::{
    HistoryPage, OperatorStore, ReplayItem, ReplayJob, SearchFilter, StatusCount,
};
use crate::store::page::PageCursor;
use crate::store::search::{Order, SearchPage};
use crate::store::{millis, AttemptRecord, EventRecord, StoreError, StoreFuture};

/// The operator side of a [`SqliteStore`](super::SqliteStore).
pub(crate) struct SqliteOperator {
    /// Runs every statement that writes, and every read a write depends on.
    pub(crate) writer: Writer,
    /// Runs the plain reads, beside the writer.
    pub(crate) reader: Reader,
}

fn job(r: &Row<'_>) -> rusqlite::Result<ReplayJob> {
    Ok(ReplayJob {
        id: r.get(0)?,
        filter: r.get(1)?,
        status: r.get(2)?,
        total: r.get(3)?,
        replayed: r.get(4)?,
        failed: r.get(5)?,
        rate: r.get(6)?,
        owner: r.get(7)?,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
    })
}

/// The keys that start with `prefix`, exactly and case-sensitively, as the half-open range
/// `[prefix, end)` in SQLite's `BINARY` order (UTF-8 bytes, so code point order). `end` is
/// `prefix` with its last character raised by one, trailing U+10FFFF dropped first; a key
/// in the range agrees with `prefix` up to its last character and lies between that
/// character and the next. `None`: no upper bound (an empty prefix, or all U+10FFFF).
fn key_range(prefix: &str) -> (String, Option<String>) {
    let mut end = prefix.to_owned();
    while let Some(last) = end.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            end.push(next);
            return (prefix.to_owned(), Some(end));
        }
    }
    (prefix.to_owned(), None)
}

/// The eleven filter parameters of [`SEARCH_WHERE`].
fn filter_params(filter: &SearchFilter) -> [Box<dyn rusqlite::ToSql + Send>; 11] {
    let (key_from, key_until) = match filter.key_prefix.as_deref().map(key_range) {
        Some((from, until)) => (Some(from), until),
        None => (None, None),
    };
    [
        Box::new(filter.provider.clone()),
        Box::new(filter.status.map(|s| s.as_str())),
        Box::new(filter.path.clone()),
        Box::new(key_from),
        Box::new(filter.mode.clone()),
        Box::new(filter.reason.clone()),
        Box::new(filter.created_after),
        Box::new(filter.created_before),
        Box::new(filter.updated_after),
        Box::new(filter.updated_before),
        Box::new(key_until),
    ]
}

fn run<T>(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<T, StoreError>
where
    T: rusqlite::types::FromSql,
{
    conn.prepare_cached(sql)
        .and_then(|mut s| s.query_row(params, |r| r.get(0)))
        .map_err(sql_error)
}

fn changed(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<usize, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute(params))
        .map_err(sql_error)
}

impl OperatorStore for SqliteOperator {
    fn event<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        let id = id.clone();
        Box::pin(self.reader.call(move |conn| {
            conn.prepare_cached(&select_record("WHERE provider = ?1 AND event_key = ?2"))
                .and_then(|mut s| {
                    s.query_row(params![&*id.provider, &*id.key], record)
                        .optional()
                })
                .map_err(sql_error)?
                .transpose()
        }))
    }

    fn history<'a>(
        &'a self,
        id: &'a EventId,
        before: Option<i32>,
        limit: u32,
    ) -> StoreFuture<'a, HistoryPage> {
        let id = id.clone();
        Box::pin(self.reader.call(move |conn| {
            let mut stmt = conn.prepare_cached(HISTORY).map_err(sql_error)?;
            // One more than the page: whether older attempts are left.
            let more = i64::from(limit) + 1;
            let rows = stmt
                .query_map(params![&*id.provider, &*id.key, before, more], |r| {
                    Ok(AttemptRecord {
                        attempt: r.get(0)?,
                        path: r.get(1)?,
                        node: r.get(2)?,
                        mode: r.get(3)?,
                        outcome: r.get(4)?,
                        started_at: r.get(5)?,
                        ended_at: r.get(6)?,
                        target_status: r.get(7)?,
                        error: r.get(8)?,
                        answer: r.get(9)?,
                    })
                })
                .map_err(sql_error)?;
            let attempts = rows
                .map(|r| r.map_err(sql_error))
                .collect::<Result<Vec<_>, _>>()?;
            let total: i64 = run(conn, HISTORY_COUNT, params![&*id.provider, &*id.key])?;
            Ok(HistoryPage::newest_first(attempts, total, limit))
        }))
    }

    fn search<'a>(
        &'a self,
        filter: &'a SearchFilter,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, SearchPage> {
        let filter = filter.clone();
        let after = after.cloned();
        Box::pin(
            self.reader.call(move |conn| {
                search::scan(conn, &filter, after.as_ref(), limit, Order::Newest)
            }),
        )
    }

    fn count<'a>(&'a self, filter: &'a SearchFilter) -> StoreFuture<'a, u64> {
        let filter = filter.clone();
        Box::pin(self.reader.call(move |conn| {
            let values = filter_params(&filter);
            let refs: Vec<&dyn rusqlite::ToSql> = values
                .iter()
                .map(|v| v.as_ref() as &dyn rusqlite::ToSql)
                .collect();
            let sql = format!("SELECT count(*) FROM webhook_events {SEARCH_WHERE}");
            let n: i64 = run(conn, &sql, refs.as_slice())?;
            Ok(u64::try_from(n).unwrap_or(0))
        }))
    }

    fn status_counts(&self) -> StoreFuture<'_, Vec<StatusCount>> {
        Box::pin(self.reader.call(|conn| {
            let mut stmt = conn.prepare_cached(STATUS_COUNTS).map_err(sql_error)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(StatusCount {
                        provider: r.get(0)?,
                        status: r.get(1)?,
                        rows: u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
                    })
                })
                .map_err(sql_error)?;
            rows.map(|r| r.map_err(sql_error)).collect()
        }))
    }

    fn set_paused<'a>(&'a self, provider: &'a str, paused: bool) -> StoreFuture<'a, ()> {
        let provider = provider.to_owned();
        Box::pin(self.writer.call(move |conn| {
            let sql = if paused { PAUSE } else { RESUME };
            changed(conn, sql, params![provider]).map(|_| ())
        }))
    }

    fn paused(&self) -> StoreFuture<'_, Vec<String>> {
        Box::pin(self.reader.call(|conn| {
            let mut stmt = conn.prepare_cached(PAUSED).map_err(sql_error)?;
            let rows = stmt.query_map([], |r| r.get(0)).map_err(sql_error)?;
            rows.map(|r| r.map_err(sql_error)).collect()
        }))
    }

    fn retry_now<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, bool> {
        let id = id.clone();
        Box::pin(
            self.writer.call(move |conn| {
                Ok(changed(conn, RETRY_NOW, params![&*id.provider, &*id.key])? == 1)
            }),
        )
    }

    fn create_job<'a>(&'a self, filter: &'a str, total: u64, rate: f64) -> StoreFuture<'a, i64> {
        let filter = filter.to_owned();
        Box::pin(self.writer.call(move |conn| {
            let total = i64::try_from(total).unwrap_or(i64::MAX);
            changed(conn, CREATE_JOB, params![filter, total, rate])?;
            Ok(conn.last_insert_rowid())
        }))
    }

    fn job(&self, id: i64) -> StoreFuture<'_, Option<ReplayJob>> {
        Box::pin(self.reader.call(move |conn| {
            let sql = format!("SELECT {JOB_COLUMNS} FROM hookgate_replay_jobs WHERE id = ?1");
            conn.prepare_cached(&sql)
                .and_then(|mut s| s.query_row(params![id], job).optional())
                .map_err(sql_error)
        }))
    }

    fn jobs(&self, limit: u32) -> StoreFuture<'_, Vec<ReplayJob>> {
        Box::pin(self.reader.call(move |conn| {
            let sql =
                format!("SELECT {JOB_COLUMNS} FROM hookgate_replay_jobs ORDER BY id DESC LIMIT ?1");
            let mut stmt = conn.prepare_cached(&sql).map_err(sql_error)?;
            let rows = stmt.query_map(params![limit], job).map_err(sql_error)?;
            rows.map(|r| r.map_err(sql_error)).collect()
        }))
    }

    fn claim_job<'a>(
        &'a self,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>> {
        let node = node.to_owned();
        Box::pin(self.writer.call(move |conn| {
            conn.prepare_cached(CLAIM_JOB)
                .and_then(|mut s| s.query_row(params![node, millis(lease)], job).optional())
                .map_err(sql_error)
        }))
    }

    fn claim_job_by_id<'a>(
        &'a self,
        id: i64,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>> {
        let node = node.to_owned();
        Box::pin(self.writer.call(move |conn| {
            conn.prepare_cached(CLAIM_JOB_BY_ID)
                .and_then(|mut s| {
                    s.query_row(params![node, millis(lease), id], job)
                        .optional()
                })
                .map_err(sql_error)
        }))
    }

    fn renew_job<'a>(&'a self, id: i64, node: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        let node = node.to_owned();
        Box::pin(
            self.writer.call(move |conn| {
                Ok(changed(conn, RENEW_JOB, params![id, node, millis(lease)])? == 1)
            }),
        )
    }

    fn begin_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, bool> {
        let event = event.clone();
        Box::pin(self.writer.call(move |conn| {
            Ok(changed(conn, BEGIN_ITEM, params![id, &*event.provider, &*event.key])? == 1)
        }))
    }

    fn forget_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, ()> {
        let event = event.clone();
        Box::pin(self.writer.call(move |conn| {
            changed(
                conn,
                FORGET_ITEM,
                params![id, &*event.provider, &*event.key],
            )
            .map(|_| ())
        }))
    }

    fn note_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        detail: Option<&'a str>,
    ) -> StoreFuture<'a, ()> {
        let event = event.clone();
        let detail = detail.map(str::to_owned);
        Box::pin(self.writer.call(move |conn| {
            changed(
                conn,
                NOTE_ITEM,
                params![id, &*event.provider, &*event.key, detail],
            )
            .map(|_| ())
        }))
    }

    fn end_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        outcome: &'a str,
        detail: Option<&'a str>,
        ok: bool,
    ) -> StoreFuture<'a, ()> {
        let (event, outcome) = (event.clone(), outcome.to_owned());
        let detail = detail.map(str::to_owned);
        Box::pin(self.writer.call(move |conn| {
            changed(
                conn,
                END_ITEM,
                params![id, &*event.provider, &*event.key, outcome, detail],
            )?;
            let (replayed, failed) = if ok { (1, 0) } else { (0, 1) };
            changed(conn, COUNT_ITEM, params![id, replayed, failed]).map(|_| ())
        }))
    }

    fn finish_job<'a>(&'a self, id: i64, node: &'a str) -> StoreFuture<'a, ()> {
        let node = node.to_owned();
        Box::pin(
            self.writer
                .call(move |conn| changed(conn, FINISH_JOB, params![id, node]).map(|_| ())),
        )
    }

    fn cancel_job(&self, id: i64) -> StoreFuture<'_, bool> {
        Box::pin(
            self.writer
                .call(move |conn| Ok(changed(conn, CANCEL_JOB, params![id])? == 1)),
        )
    }

    fn job_items(&self, id: i64, limit: u32) -> StoreFuture<'_, Vec<ReplayItem>> {
        Box::pin(self.reader.call(move |conn| {
            let mut stmt = conn.prepare_cached(JOB_ITEMS).map_err(sql_error)?;
            let rows = stmt
                .query_map(params![id, limit], |r| {
                    Ok(ReplayItem {
                        provider: r.get(0)?,
                        key: r.get(1)?,
                        outcome: r.get(2)?,
                        detail: r.get(3)?,
                        at: r.get(4)?,
                    })
                })
                .map_err(sql_error)?;
            rows.map(|r| r.map_err(sql_error)).collect()
        }))
    }
}

#[cfg(test)]
#[path = "operator_tests.rs"]
mod tests;
