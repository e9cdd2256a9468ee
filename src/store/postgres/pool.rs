//! The Postgres pool as both the store and its group-commit batches use it: every
//! operation under the statement deadline ([`Inner::run`]: past it the statement is
//! cancelled on the server and its connection closed once the backend has let go, the
//! pool opening no replacement before), the reconnect backoff, connections retired when a
//! server turns read-only, and the single-row claim and completion that a batch falls back
//! to.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Client, Object, Pool, PoolError, TimeoutType};
use tokio_postgres::CancelToken;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::connection::end_cancelled;
pub(crate) use super::ring_view::RingView;
use super::routed::{claim_rows, key, on_slots};
pub(crate) use super::routed::{ClaimCall, EnqueueCall};
use super::rows::{claim_result, db_error, get, is_read_only, pool_error};
use super::sql::{on_slot, CLAIM, COMPLETE, COMPLETE_PLAIN};
use crate::claim::{ClaimResult, StoredResult};
use crate::key::EventId;
use crate::store::reconnect::Reconnect;
use crate::store::{millis, Fenced, History, Routed, StoreError};

/// One completion: run alone here, or in a batch (`batch.rs`).
pub(crate) struct CompleteCall {
    pub(crate) id: EventId,
    pub(crate) attempts: i32,
    pub(crate) result: StoredResult,
    /// Its history row, written in the same statement.
    pub(crate) history: Option<History>,
}

/// The pool and the reconnect state, shared with the batching tasks.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) schema: String,
    /// `store.statement_timeout`: the client-side deadline of every operation.
    pub(crate) deadline: Duration,
    pub(crate) reconnect: Reconnect,
    /// For cancel requests: they are made like connections, TLS included.
    pub(crate) tls: MakeRustlsConnect,
    /// Connections checked out while their cancelled statement ends (`end_cancelled`):
    /// still counted by the pool, so it opens no replacement for them.
    pub(crate) ending: Arc<AtomicUsize>,
    /// Commits any connection saw committed without a synchronous standby's confirmation
    /// (the pool's `Connector` counts them).
    pub(crate) unconfirmed: Arc<AtomicU64>,
    /// Connections opened before this are not reused (the pool's pre-recycle hook).
    pub(crate) retired: Arc<Retired>,
    /// The ring as this node last read it: completions, failures and renewals run on the
    /// current slot's partition first ([`Inner::fenced_on_slot`]), and batched claims probe
    /// the slots that are not empty (`batch_sql::claim_on_slots`).
    pub(crate) ring: RingView,
}

/// The instant before which no pooled connection is reused: set when a statement met a
/// read-only server (SQLSTATE 25006). Its connection, and likely its neighbours, are on a
/// server that is, or has just become, a standby or a fenced old primary; new connections
/// look for a read-write server again (`target_session_attrs=read-write`, or whatever the
/// host name now points at). A plain mutex: held for an instant, never across an `.await`.
#[derive(Debug, Default)]
pub(crate) struct Retired(Mutex<Option<Instant>>);

impl Retired {
    /// Whether a connection opened at `created` may be reused.
    pub(crate) fn fit(&self, created: Instant) -> bool {
        let before = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        before.is_none_or(|before| created > before)
    }

    fn now(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }
}

/// The answer of an operation that succeeded while a commit lost its standby's
/// confirmation. Reported as a missed deadline: it may or may not be the operation's own,
/// and either way it took effect but may not survive a failover.
const UNCONFIRMED: &str = "a commit took effect on the primary without a synchronous \
    standby's confirmation (its wait was cancelled); a failover may lose it";

impl Inner {
    /// A pooled connection for work outside the statement deadline (migrations).
    pub(crate) async fn client(&self) -> Result<Object, StoreError> {
        self.checkout().await
    }

    /// A pooled connection. Waiting past `pool_timeout` is `Busy` (overload) — unless
    /// connections are held by cancelled statements: then the database is at fault, and
    /// with every one of them held the answer is immediate.
    async fn checkout(&self) -> Result<Object, StoreError> {
        let size = self.pool.status().max_size;
        let ending = || self.ending.load(Ordering::SeqCst);
        let held = |n: usize| {
            StoreError::Unavailable(
                format!(
                    "{n} of {size} connections wait for the server to end a statement \
                     cancelled at its deadline"
                )
                .into(),
            )
        };
        if ending() >= size {
            return Err(held(ending()));
        }
        self.pool.get().await.map_err(|e| match e {
            PoolError::Timeout(TimeoutType::Wait) if ending() > 0 => held(ending()),
            e => pool_error(e),
        })
    }

    /// Records how an operation went: the reconnect backoff, and a read-only server
    /// retires the connections opened so far.
    pub(crate) fn observe<T>(&self, result: &Result<T, StoreError>) {
        self.reconnect.observe(result);
        if let Err(e) = result {
            self.note_read_only(e);
        }
    }

    /// A ping's answer from a server that takes no writes: its connections are retired,
    /// and the store is unavailable until a read-write server answers.
    pub(crate) fn read_only_server(&self) -> StoreError {
        self.retired.now();
        StoreError::Unavailable("the server accepts no writes (a standby, or read-only)".into())
    }

    /// Runs `op` (an operation on this pool, [`run`](Self::run)) unless a reconnect backoff
    /// is running, and records how it went ([`observe`](Self::observe)): the one guard of
    /// every operation that is not part of a group-commit batch, the store's and the
    /// operators' alike, so a read-only server met by either retires the connections.
    pub(crate) async fn guarded<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.reconnect.check()?;
        let result = op.await;
        self.observe(&result);
        result
    }

    /// Retires the connections opened so far if `e` came from a read-only server.
    pub(crate) fn note_read_only(&self, e: &StoreError) {
        if is_read_only(e) {
            self.retired.now();
        }
    }

    /// Runs `op` on a pooled connection within the statement deadline. Waiting for the
    /// connection is bounded by `pool_timeout` (`Busy`); a connection that comes only once
    /// the deadline has passed is given back unused (`Unavailable`); past the deadline the
    /// caller gets
    /// `TimedOut` at once, and the statement is cancelled on the server and its connection
    /// closed in the background (`end_cancelled`), as it is if the caller drops this
    /// future while the statement runs. A success while some commit lost its standby's
    /// confirmation is answered `TimedOut` too ([`UNCONFIRMED`]).
    pub(crate) async fn run<T>(
        &self,
        op: impl AsyncFnOnce(&Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let until = tokio::time::Instant::from_std(crate::deadline::from_now(self.deadline));
        let client = self.checkout().await?;
        if tokio::time::Instant::now() >= until {
            // Opening the connection took the whole deadline (a slow network, a standby
            // just promoted): it goes back to the pool unused and serves the next
            // operation, instead of carrying a statement that is cancelled at once and
            // then being closed, which would leave every later operation opening one.
            drop(client);
            return Err(StoreError::Unavailable(
                format!(
                    "no connection within the {} ms deadline; nothing was sent",
                    millis(self.deadline)
                )
                .into(),
            ));
        }
        let unconfirmed = self.unconfirmed.load(Ordering::SeqCst);
        let held = Held {
            token: client.cancel_token(),
            client: Some(client),
            inner: self,
        };
        let Some(result) = held.answer(until, op).await else {
            drop(held);
            return Err(StoreError::TimedOut(
                format!(
                    "no answer within the {} ms deadline; the statement is being cancelled \
                     (a commit waiting for a synchronous standby then takes effect \
                     unconfirmed) and its connection closed",
                    millis(self.deadline)
                )
                .into(),
            ));
        };
        held.give_back();
        match result {
            Ok(_) if self.unconfirmed.load(Ordering::SeqCst) != unconfirmed => {
                Err(StoreError::TimedOut(UNCONFIRMED.into()))
            }
            result => result,
        }
    }

    /// The single-row claim, retried while a concurrent insert hides the row from the
    /// statement's snapshot.
    pub(crate) async fn claim(&self, call: &ClaimCall) -> Result<Routed<ClaimResult>, StoreError> {
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
            return self.fenced_on_slot(COMPLETE_PLAIN, &params, false).await;
        };
        let history = Some(history);
        self.fenced_on_slot(
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
            true,
        )
        .await
    }

    async fn claim_once(
        &self,
        call: &ClaimCall,
    ) -> Result<Option<Routed<ClaimResult>>, StoreError> {
        if !call.others.is_empty() {
            // With its other routes' rows: the batch statement, for one call.
            return self
                .run(async |client| {
                    let mut reported = claim_rows(client, &[call], None)
                        .await
                        .map_err(|(e, _)| e)?;
                    reported.remove(&key(&call.id)).transpose()
                })
                .await;
        }
        let keep = call.keep.as_ref();
        let payload = keep.map(|k| &k.payload[..]);
        let content_type = keep.and_then(|k| k.content_type.as_deref());
        let headers = keep.and_then(|k| k.headers.as_deref());
        self.run(async |client| {
            // On the filled slots of the node's view, as a batch is (see `claim_on_slots`):
            // a ring that has outgrown the view answers nothing, and the caller's next try
            // runs on the view read again here.
            let filled = match self.ring.filled() {
                Some(filled) => filled,
                None => {
                    self.ring.read(client).await?;
                    self.ring.filled().unwrap_or_default()
                }
            };
            let (sql, skips) = match &filled[..] {
                [] => (CLAIM, None),
                slots => (on_slots(CLAIM, slots), Some(self.ring.skips([&call.id]))),
            };
            let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
            let (provider, key, first) = (&*call.id.provider, &*call.id.key, call.first.as_str());
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
                &provider,
                &key,
                &call.fingerprint,
                &call.lease_ms,
                &payload,
                &content_type,
                &headers,
                &first,
            ];
            if let Some(skips) = &skips {
                params.extend([
                    &skips.masks[0] as &(dyn tokio_postgres::types::ToSql + Sync),
                    &skips.sealed,
                ]);
            }
            let row = client.query_opt(&stmt, &params).await.map_err(db_error)?;
            let Some(answer) = row.map(|row| claim_result(&row)).transpose()? else {
                self.ring.refresh(client).await;
                return Ok(None);
            };
            Ok(Some(Routed {
                answer,
                written: Vec::new(),
            }))
        })
        .await
    }

    /// Runs fenced statement `sql` on the current slot's partition first, then — when
    /// that changed no row, or the slot is not known — on the whole table, reading the
    /// current slot again (a turn since it was read leaves the rows in flight in the slot
    /// before). With `counted` the statement answers how many rows it `changed` (a CTE that
    /// also writes history); otherwise its row count says it. A row is in one slot only,
    /// and a statement that changed nothing wrote nothing, so the two together change the
    /// row at most once, as the whole statement alone would. The current slot is never
    /// one whose keepers are moving (that is a sealed slot a retention period old), so the
    /// slotted form never meets a row moving to the keep slot.
    pub(crate) async fn fenced_on_slot(
        &self,
        sql: &'static str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        counted: bool,
    ) -> Result<Fenced, StoreError> {
        self.run(async |client| {
            let slot = match self.ring.current() {
                Some(slot) => Some(slot),
                None => self.ring.read(client).await?,
            };
            if let Some(text) = slot.and_then(|slot| on_slot(sql, slot)) {
                match changed(client, text, params, counted).await {
                    Ok(true) => return Ok(Fenced::Applied),
                    Ok(false) => self.ring.refresh(client).await,
                    // A view that named a slot whose rows are moving (or any other error):
                    // read afresh before the next statement names a slot.
                    Err(e) => {
                        self.ring.forget();
                        return Err(e);
                    }
                }
            }
            Ok(if changed(client, sql, params, counted).await? {
                Fenced::Applied
            } else {
                Fenced::Stale
            })
        })
        .await
    }
}

/// Whether fenced statement `sql` changed its row (see [`Inner::fenced_on_slot`]).
async fn changed(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    counted: bool,
) -> Result<bool, StoreError> {
    let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
    if counted {
        let row = client.query_one(&stmt, params).await.map_err(db_error)?;
        Ok(get::<i64>(&row, "changed")? == 1)
    } else {
        Ok(client.execute(&stmt, params).await.map_err(db_error)? == 1)
    }
}

/// A connection with a statement on it: back to the pool once answered
/// ([`Held::give_back`]); dropped before that, the statement is cancelled and the
/// connection ended in the background, still counted by the pool.
struct Held<'a> {
    client: Option<Object>,
    token: CancelToken,
    inner: &'a Inner,
}

impl Held<'_> {
    /// `op`'s answer on the held connection, or `None` past `until`.
    async fn answer<T>(
        &self,
        until: tokio::time::Instant,
        op: impl AsyncFnOnce(&Client) -> Result<T, StoreError>,
    ) -> Option<Result<T, StoreError>> {
        let client = self.client.as_ref()?;
        tokio::time::timeout_at(until, op(client)).await.ok()
    }

    fn give_back(mut self) {
        self.client = None;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let ending = Arc::clone(&self.inner.ending);
                ending.fetch_add(1, Ordering::SeqCst);
                let (token, tls) = (self.token.clone(), self.inner.tls.clone());
                runtime.spawn(end_cancelled(client, token, tls, ending));
            }
            // No runtime left to cancel on (the process is ending): close it.
            Err(_) => drop(Object::take(client)),
        }
    }
}
