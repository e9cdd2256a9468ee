//! The Postgres store's operator side: an event's history, searches, counts, paused
//! providers and bulk replay jobs. Each statement says what it locks; none is on a sender's
//! path. Every one runs guarded as the store's own do (`Inner::guarded`): a read-only
//! server it meets retires the pool's connections.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;

use super::operator_sql::{
    BEGIN_ITEM, CANCEL_JOB, CLAIM_JOB, CLAIM_JOB_BY_ID, COUNT, CREATE_JOB, END_ITEM, FINISH_JOB,
    FORGET_ITEM, HISTORY, HISTORY_COUNT, JOB, JOBS, JOB_ITEMS, NOTE_ITEM, PAUSE, PAUSED, RENEW_JOB,
    RESUME, RETRY_NOW, STATUS_COUNTS,
};
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
    pub(super) async fn rows(
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

    pub(super) async fn changed(
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
