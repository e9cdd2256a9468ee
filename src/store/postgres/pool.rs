//! The Postgres pool as both the store and its group-commit batches use it: every
//! operation under the statement deadline ([`Inner::run`]: past it the connection is
//! taken out of the pool and dropped, since an unanswered statement may still be queued on
//! it), the reconnect backoff, the single-row claim and completion that a batch falls
//! back to, and the migrations.

use std::time::Duration;

use deadpool_postgres::{Client, Object, Pool};

use super::batch::{ClaimCall, CompleteCall};
use super::rows::{claim_result, db_error, get, pool_error};
use super::sql::{CLAIM, COMPLETE, COMPLETE_PLAIN};
use crate::claim::ClaimResult;
use crate::store::api::millis;
use crate::store::api::{Fenced, StoreError};
use crate::store::reconnect::Reconnect;

/// The migrations, applied in order, each once.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_webhook_events.sql")),
    (2, include_str!("migrations/0002_request_headers.sql")),
    (3, include_str!("migrations/0003_queue.sql")),
    (4, include_str!("migrations/0004_throttles.sql")),
    (5, include_str!("migrations/0005_history.sql")),
];

/// The pool and the reconnect state, shared with the batching tasks.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) schema: String,
    /// `store.statement_timeout`: the client-side deadline of every operation.
    pub(crate) deadline: Duration,
    pub(crate) reconnect: Reconnect,
}

impl Inner {
    /// A pooled connection for work outside the statement deadline (migrations).
    pub(crate) async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// Applies the migrations not applied yet, in one transaction, one node at a time.
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let schema = &self.schema;
        let tx = client.transaction().await.map_err(db_error)?;
        // A migration may rewrite a large table: no statement deadline here.
        tx.execute("SET LOCAL statement_timeout = 0", &[])
            .await
            .map_err(db_error)?;
        // One migrator at a time across every node; released at commit.
        tx.execute("SELECT pg_advisory_xact_lock(8347284)", &[])
            .await
            .map_err(db_error)?;
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {0};
             CREATE TABLE IF NOT EXISTS {0}.hookgate_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now());",
            schema
        ))
        .await
        .map_err(db_error)?;
        for (version, sql) in MIGRATIONS {
            let applied = tx
                .query_opt(
                    "SELECT 1 FROM hookgate_migrations WHERE version = $1",
                    &[version],
                )
                .await
                .map_err(db_error)?;
            if applied.is_none() {
                tx.batch_execute(sql).await.map_err(db_error)?;
                tx.execute(
                    "INSERT INTO hookgate_migrations (version) VALUES ($1)",
                    &[version],
                )
                .await
                .map_err(db_error)?;
            }
        }
        tx.commit().await.map_err(db_error)
    }

    /// Runs `op` on a pooled connection within the statement deadline. Waiting for the
    /// connection is bounded by `pool_timeout` (`Busy`); past the deadline the caller gets
    /// `TimedOut` and the connection is discarded instead of going back to the pool.
    pub(crate) async fn run<T>(
        &self,
        op: impl AsyncFnOnce(&Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let until = tokio::time::Instant::from_std(crate::deadline::from_now(self.deadline));
        let client = self.client().await?;
        match tokio::time::timeout_at(until, op(&client)).await {
            Ok(result) => result,
            Err(_) => {
                drop(Object::take(client));
                Err(StoreError::TimedOut(
                    format!(
                        "no answer within the {} ms deadline; connection dropped",
                        millis(self.deadline)
                    )
                    .into(),
                ))
            }
        }
    }

    /// The single-row claim, retried while a concurrent insert hides the row from the
    /// statement's snapshot.
    pub(crate) async fn claim(&self, call: &ClaimCall) -> Result<ClaimResult, StoreError> {
        // An empty answer means a concurrent insert committed after our snapshot; the
        // next statement's snapshot sees it. Two more tries are plenty.
        for _ in 0..3 {
            if let Some(result) = self.claim_once(call).await? {
                return Ok(result);
            }
        }
        Err(StoreError::Corrupt(
            format!("claim of {} reported no row", call.id).into(),
        ))
    }

    /// The single-row completion, with its history row.
    pub(crate) async fn complete(&self, call: &CompleteCall) -> Result<Fenced, StoreError> {
        let CompleteCall {
            id,
            attempts,
            result,
            history,
        } = call;
        let status = i16::try_from(result.status).unwrap_or(i16::MAX);
        let Some(history) = history.as_ref() else {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
                &&*id.provider,
                &&*id.key,
                attempts,
                &status,
                &result.content_type,
                &result.body,
            ];
            return self.fenced(COMPLETE_PLAIN, &params).await;
        };
        let history = Some(history);
        self.counted(
            COMPLETE,
            &[
                &&*id.provider,
                &&*id.key,
                attempts,
                &status,
                &result.content_type,
                &result.body,
                &history.map(|h| h.path.as_str()),
                &history.map(|h| &*h.node),
                &history.map(|h| millis(h.took)),
                &history.and_then(|h| h.answer.as_deref()),
            ],
        )
        .await
    }

    async fn claim_once(&self, call: &ClaimCall) -> Result<Option<ClaimResult>, StoreError> {
        let keep = call.keep.as_ref();
        let payload = keep.map(|k| &k.payload[..]);
        let content_type = keep.and_then(|k| k.content_type.as_deref());
        let headers = keep.and_then(|k| k.headers.as_deref());
        self.run(async |client| {
            let stmt = client.prepare_cached(CLAIM).await.map_err(db_error)?;
            let row = client
                .query_opt(
                    &stmt,
                    &[
                        &&*call.id.provider,
                        &&*call.id.key,
                        &call.fingerprint,
                        &call.lease_ms,
                        &payload,
                        &content_type,
                        &headers,
                    ],
                )
                .await
                .map_err(db_error)?;
            row.map(|row| claim_result(&row)).transpose()
        })
        .await
    }

    /// Runs a fenced statement that answers how many rows it `changed` (a CTE that also
    /// writes history).
    pub(crate) async fn counted(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Fenced, StoreError> {
        self.run(async |client| {
            let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
            let row = client.query_one(&stmt, params).await.map_err(db_error)?;
            let changed: i64 = get(&row, "changed")?;
            Ok(if changed == 1 {
                Fenced::Applied
            } else {
                Fenced::Stale
            })
        })
        .await
    }

    pub(crate) async fn fenced(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Fenced, StoreError> {
        self.run(async |client| {
            let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
            let changed = client.execute(&stmt, params).await.map_err(db_error)?;
            Ok(if changed == 1 {
                Fenced::Applied
            } else {
                Fenced::Stale
            })
        })
        .await
    }
}
