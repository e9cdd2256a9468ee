//! The Postgres store's operator side: an event's history, searches, counts, paused
//! providers and bulk replay jobs. Each statement says what it locks; none is on a sender's
//! path. Every one runs guarded as the store's own do (`Inner::guarded`): a read-only
//! server it meets retires the pool's connections.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;

use super::pool::Inner;
use super::rows::{db_error, get, record};
use super::search;
use super::sql::LOOKUP;
use crate::key::EventId;
use crate::store::operator::{
    HistoryPage, OperatorStore, ReplayItem, ReplayJob, SearchFilter, StatusCount,
};
use crate::store::page::PageCursor;
use crate::store::search::{Order, SearchPage};
use crate::store::{millis, AttemptRecord, EventRecord, StoreError, StoreFuture};

/// History: one event's latest `$4` attempts numbered below `$3` (all when NULL), newest
/// first, from its primary key read backwards. A plain read; rows written meanwhile are
/// newer and on no page asked for yet.
const HISTORY: &str = "
SELECT attempt, path, node, mode, outcome,
       extract(epoch FROM started_at)::float8 AS started_unix,
       extract(epoch FROM ended_at)::float8 AS ended_unix,
       target_status, error, answer
FROM webhook_attempts
WHERE provider = $1 AND event_key = $2 AND attempt < COALESCE($3::int, 2147483647)
ORDER BY attempt DESC LIMIT $4";

/// How many history rows one event has: its primary key's entries (an index-only scan once
/// vacuumed; the table is only ever inserted into and deleted from). A plain read.
const HISTORY_COUNT: &str = "
SELECT count(*)::bigint AS n FROM webhook_attempts WHERE provider = $1 AND event_key = $2";

/// Count: how many rows match a filter (`$1` provider, `$2` status, `$3` last path, `$4`
/// key prefix, exactly, `$5` mode, `$6` dead reason, `$7`…`$10` created and changed from /
/// before, Unix seconds; each ignored when NULL), for a bulk replay's plan. A plain read;
/// a bulk replay's filter has a status, and the count walks that status's index entries.
const COUNT: &str = "
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
const STATUS_COUNTS: &str = "SET LOCAL enable_seqscan = on;
SELECT provider, status, count(*) FROM webhook_events GROUP BY provider, status";

/// Pause: one row per paused provider; a concurrent pause of the same one does nothing.
const PAUSE: &str = "INSERT INTO hookgate_paused (provider) VALUES ($1) ON CONFLICT DO NOTHING";
/// Resume: deletes the provider's row, if any.
const RESUME: &str = "DELETE FROM hookgate_paused WHERE provider = $1";
/// The paused providers. A plain read.
const PAUSED: &str = "SELECT provider FROM hookgate_paused ORDER BY provider";

/// Retry now: a failed queue row becomes due at once. Locks the one row; a concurrent take
/// waits, then takes it as due.
const RETRY_NOW: &str = "
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

const CREATE_JOB: &str = "
INSERT INTO hookgate_replay_jobs (filter, status, total, rate)
VALUES ($1, 'running', $2, $3) RETURNING id";

const JOB: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM hookgate_replay_jobs WHERE id = $1"
);

const JOBS: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM hookgate_replay_jobs ORDER BY id DESC LIMIT $1"
);

/// Claim a job: the oldest running one nobody holds, or whose holder's lease ran out. The
/// inner select locks it with `FOR UPDATE SKIP LOCKED`: a node claiming at the same moment
/// skips it, so one node runs a job at a time.
const CLAIM_JOB: &str = concat!(
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
const CLAIM_JOB_BY_ID: &str = concat!(
    "
UPDATE hookgate_replay_jobs
SET owner = $1, lease_until = now() + $2::bigint * interval '1 millisecond', updated_at = now()
WHERE id = $3 AND status = 'running' AND (owner IS NULL OR lease_until < now())
RETURNING ",
    job_columns!()
);

/// Renew: the holder extends its lease while the job still runs and is still its own.
/// Locks the job's row.
const RENEW_JOB: &str = "
UPDATE hookgate_replay_jobs
SET lease_until = now() + $3::bigint * interval '1 millisecond', updated_at = now()
WHERE id = $1 AND owner = $2 AND status = 'running'";

/// Begin an item: one row per (job, event); a second begin of the same does nothing.
const BEGIN_ITEM: &str = "
INSERT INTO hookgate_replay_items (job_id, provider, event_key, outcome)
VALUES ($1, $2, $3, 'running') ON CONFLICT DO NOTHING";

/// Forget a begun item that did nothing. Locks the item.
const FORGET_ITEM: &str = "
DELETE FROM hookgate_replay_items
WHERE job_id = $1 AND provider = $2 AND event_key = $3 AND outcome = 'running'";

/// Note why a begun item waits. Locks the item; an item already ended is left alone.
const NOTE_ITEM: &str = "
UPDATE hookgate_replay_items SET detail = $4
WHERE job_id = $1 AND provider = $2 AND event_key = $3 AND outcome = 'running'";

/// End an item and count it on its job, in one statement. Locks the item and the job row.
const END_ITEM: &str = "
WITH item AS (
    UPDATE hookgate_replay_items SET outcome = $4, detail = $5, at = now()
    WHERE job_id = $1 AND provider = $2 AND event_key = $3)
UPDATE hookgate_replay_jobs
SET replayed = replayed + $6, failed = failed + $7, updated_at = now()
WHERE id = $1";

/// Finish: the holder marks its running job done. Locks the job's row.
const FINISH_JOB: &str = "
UPDATE hookgate_replay_jobs
SET status = 'done', owner = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND owner = $2 AND status = 'running'";

/// Cancel: a running job stops; its holder sees it at its next renewal.
const CANCEL_JOB: &str = "
UPDATE hookgate_replay_jobs SET status = 'cancelled', updated_at = now()
WHERE id = $1 AND status = 'running'";

/// A job's latest results: a plain read, newest first by the (job_id, at) index; its time
/// is named apart from the column (see `record_columns!`), so the index gives the order.
const JOB_ITEMS: &str = "
SELECT provider, event_key, outcome, detail, extract(epoch FROM at)::float8 AS at_unix
FROM hookgate_replay_items WHERE job_id = $1 ORDER BY at DESC LIMIT $2";

/// The operator side of a [`PgStore`](super::PgStore).
pub(crate) struct PgOperator {
    pub(crate) inner: Arc<Inner>,
}

fn job(row: &Row) -> Result<ReplayJob, StoreError> {
    Ok(ReplayJob {
        id: get(row, "id")?,
        filter: get(row, "filter")?,
        status: get(row, "status")?,
        total: i64::from(get::<i32>(row, "total")?),
        replayed: i64::from(get::<i32>(row, "replayed")?),
        failed: i64::from(get::<i32>(row, "failed")?),
        rate: get(row, "rate")?,
        owner: get(row, "owner")?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
    })
}

impl PgOperator {
    async fn rows(
        &self,
        sql: &'static str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let inner = &self.inner;
        inner
            .guarded(inner.run(async |client| {
                let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
                client.query(&stmt, params).await.map_err(db_error)
            }))
            .await
    }

    async fn changed(
        &self,
        sql: &'static str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let inner = &self.inner;
        inner
            .guarded(inner.run(async |client| {
                let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
                client.execute(&stmt, params).await.map_err(db_error)
            }))
            .await
    }
}

impl OperatorStore for PgOperator {
    fn event<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        Box::pin(async move {
            let rows = self.rows(LOOKUP, &[&&*id.provider, &&*id.key]).await?;
            rows.first().map(record).transpose()
        })
    }

    fn history<'a>(
        &'a self,
        id: &'a EventId,
        before: Option<i32>,
        limit: u32,
    ) -> StoreFuture<'a, HistoryPage> {
        Box::pin(async move {
            // One more than the page: whether older attempts are left.
            let more = i64::from(limit) + 1;
            let rows = self
                .rows(HISTORY, &[&&*id.provider, &&*id.key, &before, &more])
                .await?;
            let counted = self
                .rows(HISTORY_COUNT, &[&&*id.provider, &&*id.key])
                .await?;
            let total: i64 = counted
                .first()
                .map(|r| get(r, "n"))
                .transpose()?
                .unwrap_or(0);
            let attempts = rows
                .iter()
                .map(|row| {
                    Ok(AttemptRecord {
                        attempt: get(row, "attempt")?,
                        path: get(row, "path")?,
                        node: get(row, "node")?,
                        mode: get(row, "mode")?,
                        outcome: get(row, "outcome")?,
                        started_at: get(row, "started_unix")?,
                        ended_at: get(row, "ended_unix")?,
                        target_status: get::<Option<i16>>(row, "target_status")?
                            .and_then(|s| u16::try_from(s).ok()),
                        error: get(row, "error")?,
                        answer: get(row, "answer")?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            Ok(HistoryPage::newest_first(attempts, total, limit))
        })
    }

    fn search<'a>(
        &'a self,
        filter: &'a SearchFilter,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, SearchPage> {
        Box::pin(search::scan(
            &self.inner,
            filter,
            after,
            limit,
            Order::Newest,
        ))
    }

    fn count<'a>(&'a self, filter: &'a SearchFilter) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let status = filter.status.map(|s| s.as_str());
            let rows = self
                .rows(
                    COUNT,
                    &[
                        &filter.provider,
                        &status,
                        &filter.path,
                        &filter.key_prefix,
                        &filter.mode,
                        &filter.reason,
                        &filter.created_after,
                        &filter.created_before,
                        &filter.updated_after,
                        &filter.updated_before,
                    ],
                )
                .await?;
            let n: i64 = rows.first().map(|r| get(r, "n")).transpose()?.unwrap_or(0);
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn status_counts(&self) -> StoreFuture<'_, Vec<StatusCount>> {
        Box::pin(async move {
            let inner = &self.inner;
            let messages =
                inner
                    .guarded(inner.run(async |client| {
                        client.simple_query(STATUS_COUNTS).await.map_err(db_error)
                    }))
                    .await?;
            let text = |row: &tokio_postgres::SimpleQueryRow, i: usize| {
                row.get(i)
                    .map(str::to_owned)
                    .ok_or_else(|| StoreError::Corrupt(format!("status count column {i}").into()))
            };
            let mut counts = messages
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
                    _ => None,
                })
                .map(|row| {
                    Ok(StatusCount {
                        provider: text(row, 0)?,
                        status: text(row, 1)?,
                        rows: text(row, 2)?.parse().map_err(|e| {
                            StoreError::Corrupt(format!("status count: {e}").into())
                        })?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            counts.sort_by(|a, b| (&a.provider, &a.status).cmp(&(&b.provider, &b.status)));
            Ok(counts)
        })
    }

    fn set_paused<'a>(&'a self, provider: &'a str, paused: bool) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let sql = if paused { PAUSE } else { RESUME };
            self.changed(sql, &[&provider]).await.map(|_| ())
        })
    }

    fn paused(&self) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move {
            let rows = self.rows(PAUSED, &[]).await?;
            rows.iter().map(|row| get(row, "provider")).collect()
        })
    }

    fn retry_now<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let n = self
                .changed(RETRY_NOW, &[&&*id.provider, &&*id.key])
                .await?;
            Ok(n == 1)
        })
    }

    fn create_job<'a>(&'a self, filter: &'a str, total: u64, rate: f64) -> StoreFuture<'a, i64> {
        Box::pin(async move {
            let total = i32::try_from(total).unwrap_or(i32::MAX);
            let rows = self.rows(CREATE_JOB, &[&filter, &total, &rate]).await?;
            let row = rows
                .first()
                .ok_or_else(|| StoreError::Corrupt("a new job without an id".into()))?;
            get(row, "id")
        })
    }

    fn job(&self, id: i64) -> StoreFuture<'_, Option<ReplayJob>> {
        Box::pin(async move { self.rows(JOB, &[&id]).await?.first().map(job).transpose() })
    }

    fn jobs(&self, limit: u32) -> StoreFuture<'_, Vec<ReplayJob>> {
        Box::pin(async move {
            let rows = self.rows(JOBS, &[&i64::from(limit)]).await?;
            rows.iter().map(job).collect()
        })
    }

    fn claim_job<'a>(
        &'a self,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>> {
        Box::pin(async move {
            let rows = self.rows(CLAIM_JOB, &[&node, &millis(lease)]).await?;
            rows.first().map(job).transpose()
        })
    }

    fn claim_job_by_id<'a>(
        &'a self,
        id: i64,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>> {
        Box::pin(async move {
            let rows = self
                .rows(CLAIM_JOB_BY_ID, &[&node, &millis(lease), &id])
                .await?;
            rows.first().map(job).transpose()
        })
    }

    fn renew_job<'a>(&'a self, id: i64, node: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            Ok(self
                .changed(RENEW_JOB, &[&id, &node, &millis(lease)])
                .await?
                == 1)
        })
    }

    fn begin_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            Ok(self
                .changed(BEGIN_ITEM, &[&id, &&*event.provider, &&*event.key])
                .await?
                == 1)
        })
    }

    fn forget_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.changed(FORGET_ITEM, &[&id, &&*event.provider, &&*event.key])
                .await
                .map(|_| ())
        })
    }

    fn note_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        detail: Option<&'a str>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.changed(NOTE_ITEM, &[&id, &&*event.provider, &&*event.key, &detail])
                .await
                .map(|_| ())
        })
    }

    fn end_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        outcome: &'a str,
        detail: Option<&'a str>,
        ok: bool,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let (replayed, failed) = if ok { (1i32, 0i32) } else { (0, 1) };
            self.changed(
                END_ITEM,
                &[
                    &id,
                    &&*event.provider,
                    &&*event.key,
                    &outcome,
                    &detail,
                    &replayed,
                    &failed,
                ],
            )
            .await
            .map(|_| ())
        })
    }

    fn finish_job<'a>(&'a self, id: i64, node: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.changed(FINISH_JOB, &[&id, &node]).await.map(|_| ()) })
    }

    fn cancel_job(&self, id: i64) -> StoreFuture<'_, bool> {
        Box::pin(async move { Ok(self.changed(CANCEL_JOB, &[&id]).await? == 1) })
    }

    fn job_items(&self, id: i64, limit: u32) -> StoreFuture<'_, Vec<ReplayItem>> {
        Box::pin(async move {
            let rows = self.rows(JOB_ITEMS, &[&id, &i64::from(limit)]).await?;
            rows.iter()
                .map(|row| {
                    Ok(ReplayItem {
                        provider: get(row, "provider")?,
                        key: get(row, "event_key")?,
                        outcome: get(row, "outcome")?,
                        detail: get(row, "detail")?,
                        at: get(row, "at_unix")?,
                    })
                })
                .collect()
        })
    }
}
