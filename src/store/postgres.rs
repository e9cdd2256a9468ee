//! The Postgres store (tokio-postgres over a deadpool pool): production, high volume,
//! several hookgate nodes on one database.
//!
//! Every statement below is a single statement on a single row in autocommit, so no
//! transaction is ever held open across a delivery. Each one says which row it locks and
//! what a concurrent caller sees. `now()` is the only clock used for leases.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row};

use std::sync::Arc;

use super::batcher::Batcher;
use super::postgres_batch::{self, ClaimCall, CompleteCall};
use super::reconnect::Reconnect;
use super::{EventRecord, Failure, Fenced, Reopened, Store, StoreError, StoreFuture};
use crate::claim::{ClaimResult, Path, RowState, Status, StoredResult};
use crate::config::StoreConfig;
use crate::key::EventId;
use actix_web::web::Bytes;

/// The migrations, applied in order, each once.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_webhook_events.sql")),
    (2, include_str!("migrations/0002_request_headers.sql")),
];

/// How long a new connection may take before the store counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Claim, in one statement: insert the key, or take over a `failed` row or an expired
/// lease; otherwise report the row as it stands.
///
/// Locks: the one `(provider, event_key)` row (or its index slot). A concurrent claimer of
/// the same key blocks on that row lock until this statement commits, then re-evaluates
/// the `WHERE` against the committed row: after our win it sees `in_progress` with a live
/// lease, so it cannot win too. `done` and `dead` never match, whatever `locked_until`
/// says. The report branch reads the statement's snapshot; if a concurrent insert
/// committed after that snapshot, it returns no row and the caller runs the statement
/// again (see [`PgStore::claim`]).
const CLAIM: &str = "
WITH claimed AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, status, attempts, last_path, fingerprint, locked_until)
    VALUES ($1, $2, 'in_progress', 1, 'first_run', $3,
            now() + $4::bigint * interval '1 millisecond')
    ON CONFLICT (provider, event_key) DO UPDATE
    SET status = 'in_progress',
        attempts = e.attempts + 1,
        last_path = CASE WHEN e.status = 'failed'
                         THEN 'retry_after_failure' ELSE 'lease_retake' END,
        locked_until = EXCLUDED.locked_until,
        updated_at = now()
    WHERE (e.status = 'failed'
           OR (e.status = 'in_progress' AND e.locked_until <= now()))
      AND (e.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL
           OR e.fingerprint = EXCLUDED.fingerprint)
    RETURNING true AS won, e.status, e.attempts, e.last_path, e.fingerprint,
              0::bigint AS lease_left_ms,
              e.result_status, e.result_content_type, e.result_body
)
SELECT * FROM claimed
UNION ALL
SELECT false, status, attempts, last_path, fingerprint,
       GREATEST(0, extract(epoch FROM locked_until - now()) * 1000)::bigint,
       result_status, result_content_type, result_body
FROM webhook_events
WHERE provider = $1 AND event_key = $2 AND NOT EXISTS (SELECT 1 FROM claimed)";

/// Complete, fenced: only the attempt that holds the row may mark it done.
///
/// Locks the one row. A concurrent retake (which bumps `attempts`) either commits first,
/// and this matches no row (stale), or waits for this to commit and then finds `done`,
/// which it never claims.
const COMPLETE: &str = "
UPDATE webhook_events
SET status = 'done', result_status = $4, result_content_type = $5, result_body = $6,
    locked_until = NULL, last_error = NULL, dead_reason = NULL, payload = NULL,
    content_type = NULL, request_headers = NULL, updated_at = now()
WHERE provider = $1 AND event_key = $2 AND attempts = $3 AND status = 'in_progress'";

/// Fail (or dead-letter), fenced the same way as [`COMPLETE`]; releases the lease at once
/// so the sender's next retry can claim the row without waiting for it to expire.
///
/// Locks the one row; a concurrent claimer waits, then sees `failed` (and may win it) or
/// `dead` (and never does).
const FAIL: &str = "
UPDATE webhook_events
SET status = $4, last_error = $5, dead_reason = $6, payload = $7, content_type = $8,
    request_headers = $9, locked_until = NULL, updated_at = now()
WHERE provider = $1 AND event_key = $2 AND attempts = $3 AND status = 'in_progress'";

/// The columns of a whole row, for [`LOOKUP`] and [`DEAD_LETTERS`].
macro_rules! record_columns {
    () => {
        "provider, event_key, status, attempts, last_path, fingerprint, result_status,
         result_content_type, result_body, payload, content_type, request_headers,
         last_error, dead_reason,
         GREATEST(0, extract(epoch FROM locked_until - now()) * 1000)::bigint AS lease_left_ms,
         extract(epoch FROM created_at)::float8 AS created_at,
         extract(epoch FROM updated_at)::float8 AS updated_at"
    };
}

/// Lookup: a plain read, no lock; sees the last committed state.
const LOOKUP: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM webhook_events WHERE provider = $1 AND event_key = $2"
);

/// Dead letters, newest first: a plain read over the (status, updated_at) index.
const DEAD_LETTERS: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM webhook_events WHERE status = 'dead' AND ($1::text IS NULL OR provider = $1)
      ORDER BY updated_at DESC LIMIT $2"
);

/// Replay: reopen a dead letter as a new attempt, the claim's way (attempts + 1 is the new
/// fencing token, the lease from the database clock).
///
/// Locks the one row. A concurrent replay of the same key waits for the lock, re-checks
/// `status = 'dead'` against the committed row, finds `in_progress` and changes nothing:
/// exactly one replay wins. A sender's delivery arriving meanwhile sees a live lease.
const REPLAY: &str = "
UPDATE webhook_events
SET status = 'in_progress', attempts = attempts + 1, last_path = 'replay',
    locked_until = now() + $3::bigint * interval '1 millisecond', updated_at = now()
WHERE provider = $1 AND event_key = $2 AND status = 'dead' AND payload IS NOT NULL
RETURNING attempts, payload, content_type, fingerprint";

/// Sweep: delete one bounded batch of old rows of one status.
///
/// The inner select locks at most `$3` rows and skips any row another transaction holds
/// (`SKIP LOCKED`), so a sweep never waits on a claim and holds few locks. Only `done` and
/// `dead` rows are swept, and nothing but a replay ever changes them: a replay that locked
/// the row first is skipped; one that comes after the delete finds no row and is refused.
const SWEEP: &str = "
DELETE FROM webhook_events
WHERE (provider, event_key) IN (
    SELECT provider, event_key FROM webhook_events
    WHERE status = $1 AND updated_at < now() - $2::bigint * interval '1 millisecond'
    ORDER BY updated_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED)";

/// Claims or completions one batch carries at most.
const MAX_BATCH: usize = 256;

/// Batches of each kind running at once (see [`PgStore::connect`]).
const BATCHES_IN_FLIGHT: usize = 2;

/// The Postgres store.
pub struct PgStore {
    inner: Arc<Inner>,
    claims: Batcher<ClaimCall, ClaimResult>,
    completions: Batcher<CompleteCall, Fenced>,
}

/// The pool and the reconnect state, shared with the batching tasks.
pub(crate) struct Inner {
    pool: Pool,
    schema: String,
    pub(crate) reconnect: Reconnect,
}

impl PgStore {
    /// Builds the pool; connections are opened on first use, so this never blocks.
    pub fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let schema = config.schema.clone();
        if schema.is_empty()
            || !schema
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(StoreError::Query(format!(
                "store.schema {schema:?} must be letters, digits and '_'"
            )));
        }
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|e| StoreError::Query(format!("store.url: {e}")))?;
        pg.options(format!("-c search_path={schema}"));
        pg.connect_timeout(CONNECT_TIMEOUT);
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .wait_timeout(Some(config.pool_timeout))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Query(format!("building the pool: {e}")))?;
        let inner = Arc::new(Inner {
            pool,
            schema,
            reconnect: Reconnect::default(),
        });
        // Two batches of each kind at a time: measured on the load bench, more slots only
        // shrink the batches and spend Postgres CPU per statement (16 slots: 2.6k
        // first_run/s; 1-2 slots: 3.2-3.4k/s), while a second slot hides one batch's
        // round trip behind the other when the database is across a network.
        let in_flight = BATCHES_IN_FLIGHT;
        let claims = Batcher::start(MAX_BATCH, in_flight, {
            let inner = Arc::clone(&inner);
            move |calls| postgres_batch::claims(Arc::clone(&inner), calls)
        });
        let completions = Batcher::start(MAX_BATCH, in_flight, {
            let inner = Arc::clone(&inner);
            move |calls| postgres_batch::completions(Arc::clone(&inner), calls)
        });
        Ok(Self {
            inner,
            claims,
            completions,
        })
    }

    /// Runs `op` unless a reconnect backoff is running, and records how it went.
    async fn guarded<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.inner.reconnect.check()?;
        let result = op.await;
        self.inner.reconnect.observe(&result);
        result
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.inner.client().await
    }
}

impl Inner {
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// The single-row claim, retried while a concurrent insert hides the row from the
    /// statement's snapshot.
    pub(crate) async fn claim(
        &self,
        id: &EventId,
        fingerprint: Option<&str>,
        lease_ms: i64,
    ) -> Result<ClaimResult, StoreError> {
        // An empty answer means a concurrent insert committed after our snapshot; the
        // next statement's snapshot sees it. Two more tries are plenty.
        for _ in 0..3 {
            if let Some(result) = self.claim_once(id, fingerprint, lease_ms).await? {
                return Ok(result);
            }
        }
        Err(StoreError::Corrupt(format!(
            "claim of {id} reported no row"
        )))
    }

    /// The single-row completion.
    pub(crate) async fn complete(
        &self,
        id: &EventId,
        attempts: i32,
        result: &StoredResult,
    ) -> Result<Fenced, StoreError> {
        let status = i16::try_from(result.status).unwrap_or(i16::MAX);
        self.fenced(
            COMPLETE,
            &[
                &&*id.provider,
                &&*id.key,
                &attempts,
                &status,
                &result.content_type,
                &result.body,
            ],
        )
        .await
    }

    async fn claim_once(
        &self,
        id: &EventId,
        fingerprint: Option<&str>,
        lease_ms: i64,
    ) -> Result<Option<ClaimResult>, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(CLAIM).await.map_err(db_error)?;
        let row = client
            .query_opt(&stmt, &[&&*id.provider, &&*id.key, &fingerprint, &lease_ms])
            .await
            .map_err(db_error)?;
        row.map(|row| claim_result(&row)).transpose()
    }

    async fn fenced(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Fenced, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
        let changed = client.execute(&stmt, params).await.map_err(db_error)?;
        Ok(if changed == 1 {
            Fenced::Applied
        } else {
            Fenced::Stale
        })
    }
}

impl Store for PgStore {
    fn migrate(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut client = self.client().await?;
            let schema = &self.inner.schema;
            let tx = client.transaction().await.map_err(db_error)?;
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
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let result = async {
                let client = self.client().await?;
                client.simple_query("SELECT 1").await.map_err(db_error)?;
                Ok(())
            }
            .await;
            self.inner.reconnect.observe(&result);
            result
        })
    }

    fn claim<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimResult> {
        Box::pin(self.claims.call(ClaimCall {
            id: id.clone(),
            fingerprint: fingerprint.map(str::to_owned),
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
        }))
    }

    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(self.completions.call(CompleteCall {
            id: id.clone(),
            attempts,
            result: result.clone(),
        }))
    }

    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(self.guarded(async move {
            let status = match failure.dead {
                Some(_) => Status::Dead,
                None => Status::Failed,
            };
            self.inner
                .fenced(
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
                    ],
                )
                .await
        }))
    }

    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        Box::pin(self.guarded(async move {
            let client = self.client().await?;
            let stmt = client.prepare_cached(LOOKUP).await.map_err(db_error)?;
            let row = client
                .query_opt(&stmt, &[&&*id.provider, &&*id.key])
                .await
                .map_err(db_error)?;
            row.map(|row| record(&row)).transpose()
        }))
    }

    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>> {
        Box::pin(self.guarded(async move {
            let client = self.client().await?;
            let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
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
                })
            })
            .transpose()
        }))
    }

    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventRecord>> {
        Box::pin(self.guarded(async move {
            let client = self.client().await?;
            let rows = client
                .query(DEAD_LETTERS, &[&provider, &i64::from(limit)])
                .await
                .map_err(db_error)?;
            rows.iter().map(record).collect()
        }))
    }

    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        Box::pin(self.guarded(async move {
            let client = self.client().await?;
            let age_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
            client
                .execute(SWEEP, &[&status.as_str(), &age_ms, &i64::from(batch)])
                .await
                .map_err(db_error)
        }))
    }
}

pub(crate) fn claim_result(row: &Row) -> Result<ClaimResult, StoreError> {
    let won: bool = get(row, "won")?;
    let attempts: i32 = get(row, "attempts")?;
    if won {
        let path = parse_path(&get::<String>(row, "last_path")?)?;
        return Ok(ClaimResult::Won { attempts, path });
    }
    Ok(ClaimResult::Existing(RowState {
        status: parse_status(&get::<String>(row, "status")?)?,
        attempts,
        fingerprint: get(row, "fingerprint")?,
        lease_left: lease_left(row)?,
        result: stored_result(row)?,
    }))
}

fn record(row: &Row) -> Result<EventRecord, StoreError> {
    Ok(EventRecord {
        id: EventId::new(
            get::<String>(row, "provider")?,
            get::<String>(row, "event_key")?,
        ),
        status: parse_status(&get::<String>(row, "status")?)?,
        attempts: get(row, "attempts")?,
        last_path: Path::parse(&get::<String>(row, "last_path")?),
        fingerprint: get(row, "fingerprint")?,
        result: stored_result(row)?,
        payload: get(row, "payload")?,
        last_error: get(row, "last_error")?,
        dead_reason: get(row, "dead_reason")?,
        content_type: get(row, "content_type")?,
        request_headers: get(row, "request_headers")?,
        lease_left: lease_left(row)?,
        created_at: get(row, "created_at")?,
        updated_at: get(row, "updated_at")?,
    })
}

fn stored_result(row: &Row) -> Result<Option<StoredResult>, StoreError> {
    let status: Option<i16> = get(row, "result_status")?;
    Ok(match status {
        Some(status) => Some(StoredResult {
            status: u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("result_status {status}")))?,
            content_type: get(row, "result_content_type")?,
            body: get::<Option<Vec<u8>>>(row, "result_body")?.unwrap_or_default(),
        }),
        None => None,
    })
}

fn lease_left(row: &Row) -> Result<Duration, StoreError> {
    let ms: Option<i64> = get(row, "lease_left_ms")?;
    Ok(Duration::from_millis(
        ms.unwrap_or(0).max(0).try_into().unwrap_or(0),
    ))
}

pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    column: &str,
) -> Result<T, StoreError> {
    row.try_get(column)
        .map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))
}

fn parse_status(text: &str) -> Result<Status, StoreError> {
    Status::parse(text).ok_or_else(|| StoreError::Corrupt(format!("status {text:?}")))
}

fn parse_path(text: &str) -> Result<Path, StoreError> {
    Path::parse(text).ok_or_else(|| StoreError::Corrupt(format!("last_path {text:?}")))
}

/// Connection trouble is `Unavailable` (retry later, the sender will); anything the server
/// itself refused is a `Query` error.
pub(crate) fn db_error(e: tokio_postgres::Error) -> StoreError {
    let unavailable = match e.code() {
        None => true,
        Some(code) => {
            code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS
        }
    };
    if unavailable {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Query(e.to_string())
    }
}

fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => db_error(e),
        other => StoreError::Unavailable(other.to_string()),
    }
}
