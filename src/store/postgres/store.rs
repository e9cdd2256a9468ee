//! The Postgres store (tokio-postgres over a deadpool pool): production, high volume,
//! several hookgate nodes on one database.
//!
//! Every statement is one autocommit statement — single-row here (`sql`), or one
//! statement over many rows for group commit (`batch`) — so no transaction is ever
//! held open across a delivery. Each says which rows it locks and what a concurrent caller
//! sees. `now()` is the only clock used for leases.
//!
//! Every operation runs under `store.statement_timeout` (`pool`): past it the
//! caller gets `TimedOut`, and the statement is cancelled on the server before its
//! connection is closed (the server's own `statement_timeout`, also set, does not end a
//! commit waiting for a synchronous standby). `store.url` may name several hosts, as libpq
//! does; with `target_session_attrs=read-write` each new connection goes to the one that
//! accepts writes.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use tokio::sync::Semaphore;

use super::batch;
use super::durability::{risks, Standbys};
use super::operator::PgOperator;
use super::pool::{ClaimCall, CompleteCall, EnqueueCall, Inner};
use super::pools::{self, Pools};
use super::queue;
use super::rows::{db_error, get, parse_mode, record};
use super::search;
use super::sql::{FAIL, LOOKUP, REPLAY};
use crate::claim::{ClaimResult, Path, Status, StoredResult};
use crate::config::StoreConfig;
use crate::key::EventId;
use crate::store::batcher::Batcher;
use crate::store::operator::{OperatorStore, SearchFilter};
use crate::store::page::PageCursor;
use crate::store::retain::{Retained, Retention, TableSize};
use crate::store::search::Order;
use crate::store::{
    millis, Enqueued, EventRecord, EventSummary, Failure, Fenced, History, Kept, MigrationWait,
    QueueDepth, QueueRow, Reopened, Routed, Store, StoreError, StoreFuture, Taken,
};

/// Claims or completions one batch carries at most.
const MAX_BATCH: usize = 256;

/// Batches running at once, claims and completions together. One: a call that arrives
/// while a batch runs leaves in a later one with everything else that arrived meanwhile,
/// so each statement's fixed cost (executor start-up, commit, WAL flush) is shared by more
/// events (docs/performance.md has the measurements). Across a network a
/// batch grows with the round trip instead.
const BATCHES_IN_FLIGHT: usize = 1;

/// The Postgres store.
pub struct PgStore {
    inner: Arc<Inner>,
    claims: Batcher<ClaimCall, Routed<ClaimResult>>,
    completions: Batcher<CompleteCall, Fenced>,
    enqueues: Batcher<EnqueueCall, Routed<Enqueued>>,
    operator: PgOperator,
}

impl PgStore {
    /// Builds the pools; connections are opened on first use, so this never blocks.
    pub fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let schema = config.schema.clone();
        if schema.is_empty()
            || !schema
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(StoreError::Query(
                format!("store.schema {schema:?} must be letters, digits and '_'").into(),
            ));
        }
        let Pools {
            hot: inner,
            operator,
        } = pools::open(config, schema)?;
        let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        // A claim waiting for its batch is bounded like one waiting for a pooled connection:
        // past `pool_timeout` it is withdrawn, never run, and answered 503 `overloaded`.
        let queue_bound = Some(config.pool_timeout);
        let claims = Batcher::start(
            MAX_BATCH,
            Arc::clone(&slots),
            config.deadline(),
            queue_bound,
            {
                let inner = Arc::clone(&inner);
                move |calls| batch::claims(Arc::clone(&inner), calls)
            },
        );
        // A completion is never withdrawn: it only ends on its answer or the deadline.
        let completions = Batcher::start(MAX_BATCH, Arc::clone(&slots), config.deadline(), None, {
            let inner = Arc::clone(&inner);
            move |calls| batch::completions(Arc::clone(&inner), calls)
        });
        // An enqueue waits for its batch like a claim: past `pool_timeout` it is withdrawn
        // unwritten and the sender is answered 503 `overloaded`.
        let enqueues = Batcher::start(MAX_BATCH, slots, config.deadline(), queue_bound, {
            let inner = Arc::clone(&inner);
            move |calls| batch::enqueues(Arc::clone(&inner), calls)
        });
        Ok(Self {
            operator: PgOperator { inner: operator },
            inner,
            claims,
            completions,
            enqueues,
        })
    }

    /// A batched call's answer; a deadline that passed while the call waited for its batch
    /// opens the reconnect backoff like any other (the batch itself records the rest for
    /// the backoff), and a read-only server retires the pool's connections.
    async fn guarded_batch<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = op.await;
        match &result {
            Err(e @ StoreError::TimedOut(_)) => self.inner.observe::<()>(&Err(e.clone())),
            // The batch told the backoff the rest; a read-only server is noted here.
            Err(e) => self.inner.note_read_only(e),
            Ok(_) => {}
        }
        result
    }
}

impl Store for PgStore {
    fn migrate_reporting<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.inner.migrate(on_wait, false))
    }

    fn migrate_online<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.inner.migrate(on_wait, true))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let result = self
                .inner
                .run(async |client| {
                    // Whether this server takes writes now (a standby, or an old primary
                    // fenced read-only, answers "on"). Locks nothing.
                    let row = client
                        .query_one("SELECT current_setting('transaction_read_only')", &[])
                        .await
                        .map_err(db_error)?;
                    match get::<String>(&row, "current_setting")?.as_str() {
                        "off" => Ok(()),
                        _ => Err(self.inner.read_only_server()),
                    }
                })
                .await;
            self.inner.observe(&result);
            result
        })
    }

    fn durability_risks(&self) -> StoreFuture<'_, Vec<(String, String)>> {
        Box::pin(self.inner.guarded(self.inner.run(async |client| {
            // Settings and the standbys streaming from this server (logical-replication
            // consumers are not standbys); locks nothing. pg_stat_replication lists every
            // walsender to any role, its sync_state only to a privileged one. Aggregates
            // without GROUP BY: one row, none streaming or several.
            let row = client
                .query_one(
                    "SELECT current_setting('synchronous_commit'), current_setting('fsync'),
                            current_setting('synchronous_standby_names'),
                            count(r.pid), count(r.sync_state),
                            count(*) FILTER (WHERE r.sync_state IN ('sync', 'quorum'))
                     FROM (SELECT pid, sync_state FROM pg_stat_replication
                           WHERE pid NOT IN (SELECT active_pid FROM pg_replication_slots
                                             WHERE slot_type = 'logical'
                                               AND active_pid IS NOT NULL)) AS r",
                    &[],
                )
                .await
                .map_err(db_error)?;
            let setting = |i: usize| -> Result<String, StoreError> {
                row.try_get(i)
                    .map_err(|e| StoreError::Corrupt(format!("setting {i}: {e}").into()))
            };
            let count = |i: usize| -> Result<i64, StoreError> {
                row.try_get(i)
                    .map_err(|e| StoreError::Corrupt(format!("standbys {i}: {e}").into()))
            };
            let (synchronous_commit, fsync, names) = (setting(0)?, setting(1)?, setting(2)?);
            let standbys = Standbys {
                streaming: count(3)?,
                with_state: count(4)?,
                synchronous: count(5)?,
            };
            Ok(risks(&synchronous_commit, &fsync, &names, &standbys))
        })))
    }

    fn claim_routed<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
        keep: Option<&'a Kept>,
        first: Path,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<ClaimResult>> {
        Box::pin(self.guarded_batch(self.claims.call(ClaimCall {
            id: id.clone(),
            fingerprint: fingerprint.map(str::to_owned),
            lease_ms: millis(lease),
            keep: keep.cloned(),
            first,
            others: others.to_vec(),
        })))
    }

    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
        history: Option<&'a History>,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(self.guarded_batch(self.completions.call(CompleteCall {
            id: id.clone(),
            attempts,
            result: result.clone(),
            history: history.cloned(),
        })))
    }

    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(self.inner.guarded(async move {
            let status = match failure.dead {
                Some(_) => Status::Dead,
                None => Status::Failed,
            };
            let retry_in = failure.retry_in.map(millis);
            let history = failure.history.as_ref();
            self.inner
                .fenced_on_slot(
                    FAIL,
                    &[
                        &&*id.provider,
                        &&*id.key,
                        &attempts,
                        &status.as_str(),
                        &failure.error,
                        &failure.dead.map(|d| d.as_str()),
                        &&*failure.payload,
                        &failure.content_type,
                        &failure.headers,
                        &retry_in,
                        &i32::from(failure.uncounted),
                        &history.map(|h| h.path.as_str()),
                        &history.map(|h| &*h.node),
                        &history.map(|h| h.outcome),
                        &history.map(|h| millis(h.took)),
                        &history.and_then(|h| h.target_status.map(|s| s as i16)),
                        &history.and_then(|h| h.answer.as_deref()),
                    ],
                    true,
                )
                .await
        }))
    }

    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        Box::pin(self.inner.guarded(self.inner.run(async |client| {
            let stmt = client.prepare_cached(LOOKUP).await.map_err(db_error)?;
            let row = client
                .query_opt(&stmt, &[&&*id.provider, &&*id.key])
                .await
                .map_err(db_error)?;
            row.map(|row| record(&row)).transpose()
        })))
    }

    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>> {
        let lease_ms = millis(lease);
        Box::pin(self.inner.guarded(self.inner.run(async move |client| {
            let row = client
                .query_opt(REPLAY, &[&&*id.provider, &&*id.key, &lease_ms])
                .await
                .map_err(db_error)?;
            row.map(|row| {
                Ok(Reopened {
                    attempts: get(&row, "attempts")?,
                    payload: Bytes::from(get::<Vec<u8>>(&row, "payload")?),
                    content_type: get(&row, "content_type")?,
                    fingerprint: get(&row, "fingerprint")?,
                    mode: parse_mode(&get::<String>(&row, "mode")?)?,
                })
            })
            .transpose()
        })))
    }

    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        Box::pin(async move {
            let filter = SearchFilter {
                provider: provider.map(str::to_owned),
                status: Some(Status::Dead),
                ..SearchFilter::default()
            };
            let inner = &self.operator.inner;
            let page = search::scan(inner, &filter, after, limit, Order::Newest).await?;
            Ok(page.rows)
        })
    }

    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        Box::pin(self.inner.sweep(status, older_than, batch))
    }

    fn retain<'a>(&'a self, policy: &'a Retention) -> StoreFuture<'a, Retained> {
        Box::pin(self.inner.guarded(self.inner.retain_ring(policy)))
    }

    fn table_sizes(&self) -> StoreFuture<'_, Vec<TableSize>> {
        Box::pin(self.inner.table_sizes())
    }

    fn enqueue_routed<'a>(
        &'a self,
        item: &'a QueueRow,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<Enqueued>> {
        Box::pin(self.guarded_batch(self.enqueues.call(EnqueueCall {
            row: item.clone(),
            others: others.to_vec(),
        })))
    }

    fn take<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Taken>> {
        Box::pin(self.inner.guarded(queue::take(&self.inner, id, lease)))
    }

    fn take_due<'a>(
        &'a self,
        provider: &'a str,
        limit: u32,
        lease: Duration,
        busy: &'a [Arc<str>],
    ) -> StoreFuture<'a, Vec<Taken>> {
        Box::pin(
            self.inner
                .guarded(queue::take_due(&self.inner, provider, limit, lease, busy)),
        )
    }

    fn due<'a>(&'a self, provider: &'a str, limit: u32) -> StoreFuture<'a, Vec<EventId>> {
        Box::pin(self.inner.guarded(queue::due(&self.inner, provider, limit)))
    }

    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced> {
        // Not behind the reconnect backoff: a renewal refused for the backoff's seconds
        // would make a short-leased delivery hang up although the database answers. It
        // still reports what it saw, so an outage opens the backoff for everything else.
        Box::pin(async move {
            let result = queue::renew(&self.inner, id, attempts, lease).await;
            self.inner.observe(&result);
            result
        })
    }

    fn abandon<'a>(
        &'a self,
        provider: &'a str,
        horizon: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        Box::pin(
            self.inner
                .guarded(queue::abandon(&self.inner, provider, horizon, batch)),
        )
    }

    fn orphan<'a>(
        &'a self,
        known: &'a [String],
        grace: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        Box::pin(
            self.inner
                .guarded(queue::orphan(&self.inner, known, grace, batch)),
        )
    }

    fn list<'a>(
        &'a self,
        provider: Option<&'a str>,
        status: Option<Status>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        Box::pin(async move {
            let filter = SearchFilter {
                provider: provider.map(str::to_owned),
                status,
                ..SearchFilter::default()
            };
            let inner = &self.operator.inner;
            let page = search::scan(inner, &filter, None, limit, Order::Oldest).await?;
            Ok(page.rows)
        })
    }

    fn operator(&self) -> &dyn OperatorStore {
        &self.operator
    }

    fn resealer(&self) -> &dyn crate::store::Resealer {
        &self.operator
    }

    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>> {
        Box::pin(self.inner.guarded(queue::queue_depth(&self.inner)))
    }
}
