//! The embedded store's operator side (see `postgres/operator.rs` for each statement's
//! meaning): a statement that writes runs on the writer thread, under its single write
//! lock, so a job's claim and an item's begin see no concurrent writer; a plain read runs
//! on the reader thread (`reader`), in a snapshot of its own, and locks nothing a write
//! waits for.

use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Row};

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

/// An event's latest `?4` attempts numbered below `?3` (all when NULL), newest first, by
/// its primary key read backwards (a plain read: the last committed ones).
const HISTORY: &str = "
SELECT attempt, path, node, mode, outcome, started_at, ended_at, target_status, error, answer
FROM webhook_attempts
WHERE provider = ?1 AND event_key = ?2 AND attempt < coalesce(?3, 2147483647)
ORDER BY attempt DESC LIMIT ?4";

/// How many history rows one event has: its primary key's entries.
const HISTORY_COUNT: &str =
    "SELECT count(*) FROM webhook_attempts WHERE provider = ?1 AND event_key = ?2";

/// The conditions of a count (a bulk replay's plan), `?1`…`?11` (each ignored when NULL).
/// The key prefix is the range `?4 <= event_key < ?11` ([`key_range`]): SQLite's `LIKE`
/// ignores ASCII case. A bulk replay's filter has a status: the count walks that status's
/// index entries.
const SEARCH_WHERE: &str = "
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
const STATUS_COUNTS: &str = "
SELECT provider, status, count(*) FROM webhook_events
GROUP BY provider, status ORDER BY provider, status";

const PAUSE: &str = "
INSERT INTO hookgate_paused (provider, paused_at) VALUES (?1, unixepoch('subsec'))
ON CONFLICT DO NOTHING";
const RESUME: &str = "DELETE FROM hookgate_paused WHERE provider = ?1";
/// The paused providers (a plain read).
const PAUSED: &str = "SELECT provider FROM hookgate_paused ORDER BY provider";

const RETRY_NOW: &str = "
UPDATE webhook_events SET next_attempt_at = unixepoch('subsec')
WHERE provider = ?1 AND event_key = ?2 AND mode = 'queue' AND status = 'failed'";

const JOB_COLUMNS: &str =
    "id, filter, status, total, replayed, failed, rate, owner, created_at, updated_at";

const CREATE_JOB: &str = "
INSERT INTO hookgate_replay_jobs (filter, status, total, rate, created_at, updated_at)
VALUES (?1, 'running', ?2, ?3, unixepoch('subsec'), unixepoch('subsec'))";

const CLAIM_JOB: &str = "
UPDATE hookgate_replay_jobs
SET owner = ?1, lease_until = unixepoch('subsec') + ?2 / 1000.0, updated_at = unixepoch('subsec')
WHERE id = (SELECT id FROM hookgate_replay_jobs
            WHERE status = 'running' AND (owner IS NULL OR lease_until < unixepoch('subsec'))
            ORDER BY id LIMIT 1)
RETURNING id, filter, status, total, replayed, failed, rate, owner, created_at, updated_at";

/// Job `?3` by its id, on CLAIM_JOB's terms; the one writer connection runs it alone.
const CLAIM_JOB_BY_ID: &str = "
UPDATE hookgate_replay_jobs
SET owner = ?1, lease_until = unixepoch('subsec') + ?2 / 1000.0, updated_at = unixepoch('subsec')
WHERE id = ?3 AND status = 'running'
  AND (owner IS NULL OR lease_until < unixepoch('subsec'))
RETURNING id, filter, status, total, replayed, failed, rate, owner, created_at, updated_at";

const RENEW_JOB: &str = "
UPDATE hookgate_replay_jobs
SET lease_until = unixepoch('subsec') + ?3 / 1000.0, updated_at = unixepoch('subsec')
WHERE id = ?1 AND owner = ?2 AND status = 'running'";

const BEGIN_ITEM: &str = "
INSERT INTO hookgate_replay_items (job_id, provider, event_key, outcome, at)
VALUES (?1, ?2, ?3, 'running', unixepoch('subsec')) ON CONFLICT DO NOTHING";

const FORGET_ITEM: &str = "
DELETE FROM hookgate_replay_items
WHERE job_id = ?1 AND provider = ?2 AND event_key = ?3 AND outcome = 'running'";

/// Note why a begun item waits; an item already ended is left alone.
const NOTE_ITEM: &str = "
UPDATE hookgate_replay_items SET detail = ?4
WHERE job_id = ?1 AND provider = ?2 AND event_key = ?3 AND outcome = 'running'";

const END_ITEM: &str = "
UPDATE hookgate_replay_items SET outcome = ?4, detail = ?5, at = unixepoch('subsec')
WHERE job_id = ?1 AND provider = ?2 AND event_key = ?3";

const COUNT_ITEM: &str = "
UPDATE hookgate_replay_jobs
SET replayed = replayed + ?2, failed = failed + ?3, updated_at = unixepoch('subsec')
WHERE id = ?1";

const FINISH_JOB: &str = "
UPDATE hookgate_replay_jobs
SET status = 'done', owner = NULL, lease_until = NULL, updated_at = unixepoch('subsec')
WHERE id = ?1 AND owner = ?2 AND status = 'running'";

const CANCEL_JOB: &str = "
UPDATE hookgate_replay_jobs SET status = 'cancelled', updated_at = unixepoch('subsec')
WHERE id = ?1 AND status = 'running'";

/// A job's latest results, newest first by the (job_id, at) index (a plain read: a job
/// running on the writer goes on beside it).
const JOB_ITEMS: &str = "
SELECT provider, event_key, outcome, detail, at FROM hookgate_replay_items
WHERE job_id = ?1 ORDER BY at DESC LIMIT ?2";

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
mod tests {
    use super::*;
    use crate::store::sqlite::rows::select_summary;
    use crate::store::sqlite::SqliteStore;
    use crate::store::Store;

    /// A migrated store in a directory of its own, removed when dropped.
    struct TempStore {
        dir: std::path::PathBuf,
        store: SqliteStore,
    }

    impl TempStore {
        async fn new() -> Self {
            Self::with_deadline(Duration::from_secs(5)).await
        }

        /// Migrated under the usual deadline, then opened again with `deadline`.
        async fn with_deadline(deadline: Duration) -> Self {
            let dir = std::env::temp_dir().join(format!("hookgate-prefix-{}", fastrand::u64(..)));
            let path = dir.join("events.db");
            let store = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
            store.migrate().await.unwrap();
            drop(store);
            let store = SqliteStore::open(&path, deadline).unwrap();
            Self { dir, store }
        }
    }

    impl Drop for TempStore {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// The keys a search with `prefix` finds (sorted), after checking that `count` agrees.
    async fn found(store: &SqliteStore, prefix: &str) -> Vec<String> {
        let filter = SearchFilter {
            key_prefix: Some(prefix.into()),
            ..SearchFilter::default()
        };
        let page = store.operator().search(&filter, None, 100).await.unwrap();
        let mut keys: Vec<String> = page
            .rows
            .into_iter()
            .map(|r| r.id.key.to_string())
            .collect();
        keys.sort();
        let counted = store.operator().count(&filter).await.unwrap();
        assert_eq!(counted, keys.len() as u64, "count and search of {prefix:?}");
        keys
    }

    /// SQLite's plan of `sql`, one line a step (`EXPLAIN QUERY PLAN`), on `t`'s database.
    fn plan(t: &TempStore, sql: &str, params: impl rusqlite::Params) -> Vec<String> {
        let conn = Connection::open(t.dir.join("events.db")).unwrap();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = stmt.query_map(params, |r| r.get::<_, String>(3)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    #[tokio::test]
    async fn a_jobs_latest_results_come_from_an_index_not_a_sort_of_all_of_them() {
        let t = TempStore::new().await;
        let steps = plan(&t, JOB_ITEMS, params![1, 200]);
        assert!(
            steps
                .iter()
                .all(|s| !s.contains("TEMP B-TREE") && !s.starts_with("SCAN")),
            "{steps:?}"
        );
    }

    #[tokio::test]
    async fn a_search_reads_each_status_by_its_index_in_the_page_order() {
        let t = TempStore::new().await;
        let newest = select_summary(search::NEWEST);
        let oldest = select_summary(search::OLDEST);
        for steps in [
            plan(&t, &newest, params!["dead", 1e12, 0.0]),
            plan(&t, &oldest, params!["dead"]),
        ] {
            assert!(
                steps
                    .iter()
                    .any(|s| s.contains("USING INDEX webhook_events_status_updated (status=?")),
                "{steps:?}"
            );
            // Ties on updated_at may be ordered as they come ("RIGHT PART OF ORDER BY");
            // every row of a status read and sorted may not.
            assert!(
                steps
                    .iter()
                    .all(|s| !s.starts_with("SCAN") && !s.contains("TEMP B-TREE FOR ORDER BY")),
                "{steps:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_key_prefix_matches_case_exact_keys_and_its_metacharacters_literally() {
        let t = TempStore::new().await;
        let keys = [
            "evt_Ab1",
            "evt_ab2",
            "evt_A%c",
            "evt_A_d",
            "evt_AÉ",
            "evt_Aé",
            "evt_A*[x]",
            "evt_Az",
            "evu_A",
            "evt_\u{10FFFF}x",
            "evt_\u{10FFFF}",
        ];
        for key in keys {
            let id = EventId::new("stripe", key);
            store_claim(&t.store, &id).await;
        }
        let t = &t.store;
        assert_eq!(
            found(t, "evt_A").await,
            [
                "evt_A%c",
                "evt_A*[x]",
                "evt_A_d",
                "evt_Ab1",
                "evt_Az",
                "evt_AÉ",
                "evt_Aé"
            ]
        );
        assert_eq!(found(t, "evt_A%").await, ["evt_A%c"]);
        assert_eq!(found(t, "evt_A_").await, ["evt_A_d"]);
        assert_eq!(found(t, "evt_A*").await, ["evt_A*[x]"]);
        assert_eq!(found(t, "evt_A*[").await, ["evt_A*[x]"]);
        assert_eq!(found(t, "evt_a").await, ["evt_ab2"]);
        assert_eq!(found(t, "evt_Aé").await, ["evt_Aé"]);
        assert_eq!(found(t, "evt_AÉ").await, ["evt_AÉ"]);
        assert_eq!(
            found(t, "evt_\u{10FFFF}").await,
            ["evt_\u{10FFFF}", "evt_\u{10FFFF}x"]
        );
        assert_eq!(
            found(t, "").await.len(),
            keys.len(),
            "an empty prefix matches all"
        );
    }

    #[test]
    fn a_key_range_ends_before_the_next_character() {
        let end = |prefix: &str| key_range(prefix).1;
        assert_eq!(end("evt_A").as_deref(), Some("evt_B"));
        assert_eq!(
            end("k\u{D7FF}").as_deref(),
            Some("k\u{E000}"),
            "past the surrogates"
        );
        assert_eq!(end("k\u{10FFFF}").as_deref(), Some("l"));
        assert_eq!(end("\u{10FFFF}"), None);
        assert_eq!(end(""), None);
    }

    #[tokio::test]
    async fn a_claim_completes_while_an_operator_read_holds_its_snapshot_open() {
        let t = TempStore::new().await;
        store_claim(&t.store, &EventId::new("stripe", "evt_1")).await;
        let (entered, inside) = std::sync::mpsc::channel::<()>();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (seen, snapshot) = std::sync::mpsc::channel::<i64>();
        // The next operator read stops part-way through a scan — its read transaction
        // open — until the claim below has answered, then counts within that snapshot.
        t.store.set_read_hook(Box::new(move |conn| {
            let mut scan = conn
                .prepare("SELECT event_key FROM webhook_events")
                .unwrap();
            let mut rows = scan.query([]).unwrap();
            assert!(rows.next().unwrap().is_some());
            entered.send(()).unwrap();
            let _ = released.recv();
            let rows_seen = conn
                .query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))
                .unwrap();
            drop(rows);
            seen.send(rows_seen).unwrap();
        }));
        let read = t.store.operator().status_counts();
        let claim = async {
            let began = tokio::task::spawn_blocking(move || inside.recv()).await;
            assert!(matches!(began, Ok(Ok(()))), "the read began");
            let won = t
                .store
                .claim(
                    &EventId::new("stripe", "evt_2"),
                    None,
                    Duration::from_secs(60),
                    None,
                )
                .await;
            let _ = release.send(());
            won
        };
        let (counts, won) = tokio::join!(read, claim);
        let won = won.expect("the claim answers while the read is inside its scan");
        assert!(
            matches!(won, crate::claim::ClaimResult::Won { .. }),
            "{won:?}"
        );
        assert_eq!(
            snapshot.recv().unwrap(),
            1,
            "the read's snapshot predates the claim"
        );
        let rows: u64 = counts.unwrap().iter().map(|c| c.rows).sum();
        assert_eq!(
            rows, 2,
            "the read itself ran after the hook, in a new snapshot"
        );
    }

    #[tokio::test]
    async fn an_operator_read_past_its_deadline_is_stopped_not_left_running() {
        let t = TempStore::with_deadline(Duration::from_secs(1)).await;
        let (ended, end) = std::sync::mpsc::channel();
        t.store.set_read_hook(Box::new(move |conn| {
            // Never ends by itself: only an interrupt stops it.
            let endless = conn.query_row(
                "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n)
                 SELECT count(*) FROM n",
                [],
                |r| r.get::<_, i64>(0),
            );
            let _ = ended.send(endless.map_err(|e| e.sqlite_error_code()));
        }));
        let late = t.store.operator().status_counts().await.unwrap_err();
        assert!(matches!(late, StoreError::TimedOut(_)), "{late}");
        // Waiting bounds only a failure: a read left running never sends.
        let endless =
            tokio::task::spawn_blocking(move || end.recv_timeout(Duration::from_secs(10)))
                .await
                .unwrap()
                .expect("the read was stopped, not left running");
        assert_eq!(
            endless,
            Err(Some(rusqlite::ErrorCode::OperationInterrupted))
        );
        let counts = t.store.operator().status_counts().await;
        assert!(counts.is_ok(), "the next read runs: {counts:?}");
    }

    async fn store_claim(store: &SqliteStore, id: &EventId) {
        let won = store
            .claim(id, None, Duration::from_secs(60), None)
            .await
            .unwrap();
        assert!(
            matches!(won, crate::claim::ClaimResult::Won { .. }),
            "{won:?}"
        );
    }
}
