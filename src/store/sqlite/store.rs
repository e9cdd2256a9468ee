//! The embedded store: SQLite through rusqlite's bundled library, in one file. The
//! zero-setup default; one node (several processes on one file work, one writer at a time).
//!
//! Same rows, states, paths and fencing as Postgres. Every write, and every read a write
//! depends on (a lost claim's report, `lookup` after a timed-out outcome), runs on the
//! writer thread (`writer`) inside a `BEGIN IMMEDIATE` transaction, which holds the
//! database's single write lock: no other connection — in this process or another — writes
//! between a claim's upsert and its report. Operators' plain reads (searches, counts,
//! listings, the queue depth) run beside it on the reader thread (`reader`), read-only, in
//! WAL snapshots that hold no lock a write waits for. Lease times come from SQLite's clock,
//! `unixepoch('subsec')`, never from a node's.
//!
//! Durability: WAL with `synchronous = FULL`. Every commit (one per batch of operations) is
//! fsynced before any answer leaves: losing a committed `done` row to a power cut would let
//! a later redelivery run the target twice, which is exactly what hookgate exists to stop.
//! The WAL is copied back into the file by the checkpointer thread (`checkpointer`), not by
//! the commit that filled it; the writer only lets it start over, between two batches.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use rusqlite::{params, Connection, OptionalExtension};

use super::checkpointer;
use super::files::{create_private, open_checkpointer, open_reader, BUSY_TIMEOUT};
use super::operator::SqliteOperator;
use super::queue;
use super::reader::Reader;
use super::retention;
use super::rows::{fenced, record, select_record};
use super::search;
use super::sql::{write_history, CLAIM, COMPLETE, FAIL, MIGRATIONS, REPLAY};
use super::writer::{sql_error, Writer};
use crate::claim::{ClaimResult, Mode, Path as ClaimPath, RowState, Status, StoredResult};
use crate::key::EventId;
use crate::store::operator::{OperatorStore, SearchFilter};
use crate::store::page::PageCursor;
use crate::store::retain::{Retained, Retention, TableSize};
use crate::store::search::Order;
use crate::store::{
    millis, Enqueued, EventRecord, EventSummary, Failure, Fenced, History, Kept, MigrationWait,
    QueueDepth, QueueRow, Reopened, Routed, Store, StoreError, StoreFuture, Taken,
};

/// The embedded store.
pub struct SqliteStore {
    writer: Writer,
    reader: Reader,
    operator: SqliteOperator,
}

impl SqliteStore {
    /// Opens (creating it and its directory if needed) the database file at `path`; every
    /// operation answers within `deadline` (`store.statement_timeout`).
    pub fn open(path: &Path, deadline: Duration) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Query(format!("creating {}: {e}", dir.display()).into())
            })?;
        }
        create_private(path)?;
        let mut conn = Connection::open(path).map_err(sql_error)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_error)?;
        let journal: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(sql_error)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql_error)?;
        // History rows go with their event (ON DELETE CASCADE).
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(sql_error)?;
        // Connections of their own for checkpoints and plain reads in WAL mode only: an
        // in-memory database answers `memory` (a second connection would open another,
        // empty one), and outside WAL a reader would hold up the writer's commits.
        let wal = journal.eq_ignore_ascii_case("wal");
        let checkpoints = if wal {
            Some(checkpointer::start(&mut conn, open_checkpointer(path)?)?)
        } else {
            None
        };
        let writer = Writer::start(conn, deadline, checkpoints)?;
        let reads = if wal {
            Some(open_reader(path, deadline)?)
        } else {
            None
        };
        let reader = Reader::start(reads, writer.clone(), deadline)?;
        Ok(Self {
            operator: SqliteOperator {
                writer: writer.clone(),
                reader: reader.clone(),
            },
            reader,
            writer,
        })
    }

    /// Test only: `hook` runs once, first thing in the next plain read, on its connection.
    #[cfg(test)]
    pub(crate) fn set_read_hook(&self, hook: super::reader::ReadHook) {
        self.reader.set_hook(hook);
    }

    /// The path in a `sqlite://PATH` URL (`sqlite:///abs` is absolute).
    pub fn path_of(url: &str) -> Option<&str> {
        url.strip_prefix("sqlite://").filter(|p| !p.is_empty())
    }
}

impl Store for SqliteStore {
    /// One writer at a time holds the database's write lock (`BEGIN IMMEDIATE`) and other
    /// processes wait for it within their busy timeout: nothing waits behind a migration
    /// but the writer's own batches, so there is no wait to report.
    fn migrate_reporting<'a>(
        &'a self,
        _on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.writer.call(|conn| {
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS hookgate_migrations (
                     version INTEGER PRIMARY KEY,
                     applied_at REAL NOT NULL DEFAULT (unixepoch('subsec')))",
            )
            .map_err(sql_error)?;
            for (version, sql) in MIGRATIONS {
                let applied = conn
                    .query_row(
                        "SELECT 1 FROM hookgate_migrations WHERE version = ?1",
                        [version],
                        |_| Ok(()),
                    )
                    .optional()
                    .map_err(sql_error)?;
                if applied.is_none() {
                    conn.execute_batch(sql).map_err(sql_error)?;
                    conn.execute(
                        "INSERT INTO hookgate_migrations (version) VALUES (?1)",
                        [version],
                    )
                    .map_err(sql_error)?;
                }
            }
            Ok(())
        }))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.writer.call(|conn| {
            conn.query_row("SELECT 1", [], |_| Ok(()))
                .map_err(sql_error)
        }))
    }

    fn durability_risks(&self) -> StoreFuture<'_, Vec<(String, String)>> {
        // Opened with WAL and synchronous = FULL: every commit is on disk before it answers.
        Box::pin(async { Ok(Vec::new()) })
    }

    fn claim_routed<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
        keep: Option<&'a Kept>,
        first: ClaimPath,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<ClaimResult>> {
        let (provider, key) = (id.provider.clone(), id.key.clone());
        let fingerprint = fingerprint.map(str::to_owned);
        let keep = keep.cloned();
        let others = others.to_vec();
        Box::pin(self.writer.call(move |conn| {
            let keep = keep.as_ref();
            let won = conn
                .prepare_cached(CLAIM)
                .and_then(|mut s| {
                    s.query_row(
                        params![
                            &*provider,
                            &*key,
                            fingerprint,
                            millis(lease),
                            keep.map(|k| &k.payload[..]),
                            keep.and_then(|k| k.content_type.as_deref()),
                            keep.and_then(|k| k.headers.as_deref()),
                            first.as_str()
                        ],
                        |r| Ok((r.get::<_, i32>(0)?, r.get::<_, String>(1)?)),
                    )
                    .optional()
                })
                .map_err(sql_error)?;
            if let Some((attempts, path)) = won {
                let path = ClaimPath::parse(&path)
                    .ok_or_else(|| StoreError::Corrupt(format!("last_path {path:?}").into()))?;
                // The job runs in its own savepoint: the other routes' rows commit with
                // the claim or not at all. Only the claim that wrote the row (attempt 1,
                // the event's first accepted delivery) writes them: a redelivery never
                // changes which routes an event has.
                let written = if attempts == 1 {
                    write_others(conn, &others)?
                } else {
                    vec![false; others.len()]
                };
                return Ok(Routed {
                    answer: ClaimResult::Won { attempts, path },
                    written,
                });
            }
            let record = conn
                .prepare_cached(&select_record("WHERE provider = ?1 AND event_key = ?2"))
                .and_then(|mut s| s.query_row(params![&*provider, &*key], record))
                .map_err(sql_error)??;
            Ok(Routed {
                answer: ClaimResult::Existing(RowState {
                    mode: Mode::parse(&record.mode).ok_or_else(|| {
                        StoreError::Corrupt(format!("mode {:?}", record.mode).into())
                    })?,
                    status: record.status,
                    attempts: record.attempts,
                    fingerprint: record.fingerprint,
                    lease_left: record.lease_left,
                    result: record.result,
                }),
                written: vec![false; others.len()],
            })
        }))
    }

    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
        history: Option<&'a History>,
    ) -> StoreFuture<'a, Fenced> {
        let (provider, key, result) = (id.provider.clone(), id.key.clone(), result.clone());
        let history = history.cloned();
        Box::pin(self.writer.call(move |conn| {
            let written = fenced(conn.prepare_cached(COMPLETE).and_then(|mut s| {
                s.execute(params![
                    &*provider,
                    &*key,
                    attempts,
                    result.status,
                    result.content_type,
                    result.body
                ])
            }))?;
            if let (Fenced::Applied, Some(h)) = (written, &history) {
                write_history(conn, &provider, &key, attempts, h, None)?;
            }
            Ok(written)
        }))
    }

    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced> {
        let (provider, key, failure) = (id.provider.clone(), id.key.clone(), failure.clone());
        Box::pin(self.writer.call(move |conn| {
            let status = if failure.dead.is_some() {
                Status::Dead
            } else {
                Status::Failed
            };
            let written = fenced(conn.prepare_cached(FAIL).and_then(|mut s| {
                s.execute(params![
                    &*provider,
                    &*key,
                    attempts,
                    status.as_str(),
                    failure.error,
                    failure.dead.map(|d| d.as_str()),
                    &failure.payload[..],
                    failure.content_type,
                    failure.headers,
                    failure.retry_in.map(millis),
                    i32::from(failure.uncounted),
                ])
            }))?;
            if let (Fenced::Applied, Some(h)) = (written, &failure.history) {
                write_history(conn, &provider, &key, attempts, h, Some(&failure.error))?;
            }
            Ok(written)
        }))
    }

    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        let (provider, key) = (id.provider.clone(), id.key.clone());
        Box::pin(self.writer.call(move |conn| {
            conn.prepare_cached(&select_record("WHERE provider = ?1 AND event_key = ?2"))
                .and_then(|mut s| s.query_row(params![&*provider, &*key], record).optional())
                .map_err(sql_error)?
                .transpose()
        }))
    }

    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>> {
        let (provider, key) = (id.provider.clone(), id.key.clone());
        Box::pin(self.writer.call(move |conn| {
            conn.prepare_cached(REPLAY)
                .and_then(|mut s| {
                    s.query_row(params![&*provider, &*key, millis(lease)], |r| {
                        let mode = r.get::<_, String>(4)?;
                        Ok((
                            Reopened {
                                attempts: r.get(0)?,
                                payload: Bytes::from(r.get::<_, Vec<u8>>(1)?),
                                content_type: r.get(2)?,
                                fingerprint: r.get(3)?,
                                mode: Mode::Sync,
                            },
                            mode,
                        ))
                    })
                    .optional()
                })
                .map_err(sql_error)?
                .map(|(reopened, mode)| {
                    let mode = Mode::parse(&mode)
                        .ok_or_else(|| StoreError::Corrupt(format!("mode {mode:?}").into()))?;
                    Ok(Reopened { mode, ..reopened })
                })
                .transpose()
        }))
    }

    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        let filter = SearchFilter {
            provider: provider.map(str::to_owned),
            status: Some(Status::Dead),
            ..SearchFilter::default()
        };
        let after = after.cloned();
        Box::pin(self.reader.call(move |conn| {
            let page = search::scan(conn, &filter, after.as_ref(), limit, Order::Newest)?;
            Ok(page.rows)
        }))
    }

    fn retain<'a>(&'a self, policy: &'a Retention) -> StoreFuture<'a, Retained> {
        Box::pin(async move {
            let mut retained = retention::by_rows(self, policy).await?;
            let (done, dead) = (millis(policy.done), millis(policy.dead));
            retained.backlog = self
                .reader
                .call(move |conn| retention::backlog(conn, done, dead))
                .await?;
            Ok(retained)
        })
    }

    fn table_sizes(&self) -> StoreFuture<'_, Vec<TableSize>> {
        Box::pin(self.reader.call(retention::table_sizes))
    }

    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        Box::pin(
            self.writer
                .call(move |conn| retention::sweep(conn, status, older_than, batch)),
        )
    }

    fn enqueue_routed<'a>(
        &'a self,
        item: &'a QueueRow,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<Enqueued>> {
        let item = item.clone();
        let others = others.to_vec();
        Box::pin(self.writer.call(move |conn| {
            let answer = queue::enqueue(conn, &item)?;
            let written = if answer == Enqueued::Inserted {
                write_others(conn, &others)?
            } else {
                vec![false; others.len()]
            };
            Ok(Routed { answer, written })
        }))
    }

    fn take<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Taken>> {
        let id = id.clone();
        Box::pin(self.writer.call(move |conn| queue::take(conn, &id, lease)))
    }

    fn take_due<'a>(
        &'a self,
        provider: &'a str,
        limit: u32,
        lease: Duration,
        busy: &'a [Arc<str>],
    ) -> StoreFuture<'a, Vec<Taken>> {
        let provider = provider.to_owned();
        let busy = busy.to_vec();
        Box::pin(
            self.writer
                .call(move |conn| queue::take_due(conn, &provider, limit, lease, &busy)),
        )
    }

    fn due<'a>(&'a self, provider: &'a str, limit: u32) -> StoreFuture<'a, Vec<EventId>> {
        let provider = provider.to_owned();
        Box::pin(
            self.writer
                .call(move |conn| queue::due(conn, &provider, limit)),
        )
    }

    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced> {
        let id = id.clone();
        Box::pin(
            self.writer
                .call(move |conn| queue::renew(conn, &id, attempts, lease)),
        )
    }

    fn abandon<'a>(
        &'a self,
        provider: &'a str,
        horizon: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        let provider = provider.to_owned();
        Box::pin(
            self.writer
                .call(move |conn| queue::abandon(conn, &provider, horizon, batch)),
        )
    }

    fn orphan<'a>(
        &'a self,
        known: &'a [String],
        grace: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        let known = known.to_vec();
        Box::pin(
            self.writer
                .call(move |conn| queue::orphan(conn, &known, grace, batch)),
        )
    }

    fn list<'a>(
        &'a self,
        provider: Option<&'a str>,
        status: Option<Status>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        let filter = SearchFilter {
            provider: provider.map(str::to_owned),
            status,
            ..SearchFilter::default()
        };
        Box::pin(self.reader.call(move |conn| {
            let page = search::scan(conn, &filter, None, limit, Order::Oldest)?;
            Ok(page.rows)
        }))
    }

    fn operator(&self) -> &dyn OperatorStore {
        &self.operator
    }

    fn resealer(&self) -> &dyn crate::store::Resealer {
        &self.operator
    }

    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>> {
        Box::pin(self.reader.call(queue::queue_depth))
    }
}

/// Writes an event's other routes' rows (in the caller's savepoint); which were new.
fn write_others(conn: &rusqlite::Connection, others: &[QueueRow]) -> Result<Vec<bool>, StoreError> {
    others
        .iter()
        .map(|other| Ok(queue::enqueue(conn, other)? == Enqueued::Inserted))
        .collect()
}
