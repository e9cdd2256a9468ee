//! One delegating wrapper around a real store, for every test that puts faults into it:
//! [`Wrapped`] passes every operation to the store it wraps, and the calls a fault can
//! strike (claims, takes, replays, renewals, outcome writes, lookups, pings) through its
//! [`Hooks`] first; a retention pass's answer goes through them after the store gave it. The seeded chaos of the runner-fault suite (`chaos.rs`) and the
//! targeted faults of single tests (`faults.rs`) are two hooks over this one wrapper.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use hookgate::claim::{ClaimResult, Path, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::store::{
    Enqueued, EventRecord, EventSummary, Failure, Fenced, History, Kept, MigrationWait, PageCursor,
    QueueDepth, QueueRow, Reopened, Retained, Retention, Routed, Store, StoreError, StoreFuture,
    TableSize, Taken,
};

/// A store operation a hook sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Ping,
    Due,
    Take,
    Claim,
    Replay,
    Renew,
    Complete,
    Fail,
    Lookup,
}

/// One hooked call: what it is, the key it names and the attempt number it is fenced by.
#[derive(Debug, Clone, Copy)]
pub struct CallOf<'a> {
    pub op: Op,
    pub id: Option<&'a EventId>,
    pub attempts: Option<i32>,
}

/// What an answer said, for a journal: the words, whether it won or was applied, and the
/// attempt number a claim, take or replay won.
pub type Read<T> = fn(&T) -> (String, bool, Option<i32>);

/// What a test does to the calls that pass through a [`Wrapped`] store. `run` makes the
/// call (nothing reaches the store before it is called); the default runs it untouched.
pub trait Hooks: Send + Sync + 'static {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: CallOf<'a>,
        run: impl FnOnce() -> StoreFuture<'a, T> + Send + 'a,
        read: Read<T>,
    ) -> StoreFuture<'a, T> {
        let _ = (call, read);
        run()
    }

    /// What a retention pass answers, given what the store answered (which it did: the
    /// pass ran); the default answers it untouched.
    fn retained(&self, answer: Result<Retained, StoreError>) -> Result<Retained, StoreError> {
        answer
    }
}

/// A real store with `H` between its callers and it. Derefs to `H`, so a test reaches its
/// hook's controls (`calm`, `hold_writes`, counters) on the store itself.
pub struct Wrapped<H> {
    inner: Arc<dyn Store>,
    hooks: H,
}

impl<H: Hooks> Wrapped<H> {
    pub fn wrap(inner: Arc<dyn Store>, hooks: H) -> Self {
        Self { inner, hooks }
    }

    fn hooked<'a, T: Send + 'a>(
        &'a self,
        op: Op,
        id: Option<&'a EventId>,
        attempts: Option<i32>,
        run: impl FnOnce() -> StoreFuture<'a, T> + Send + 'a,
        read: Read<T>,
    ) -> StoreFuture<'a, T> {
        let call = CallOf { op, id, attempts };
        self.hooks.around(call, run, read)
    }
}

impl<H> Deref for Wrapped<H> {
    type Target = H;

    fn deref(&self) -> &H {
        &self.hooks
    }
}

fn fenced(f: &Fenced) -> (String, bool, Option<i32>) {
    (format!("{f:?}"), *f == Fenced::Applied, None)
}

impl<H: Hooks> Store for Wrapped<H> {
    fn migrate_reporting<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        self.inner.migrate_reporting(on_wait)
    }
    fn ping(&self) -> StoreFuture<'_, ()> {
        let run = move || self.inner.ping();
        self.hooked(Op::Ping, None, None, run, |_| ("pong".into(), false, None))
    }
    fn durability_risks(&self) -> StoreFuture<'_, Vec<(String, String)>> {
        self.inner.durability_risks()
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
        let run = move || {
            self.inner
                .claim_routed(id, fingerprint, lease, keep, first, others)
        };
        self.hooked(Op::Claim, Some(id), None, run, |r| match &r.answer {
            ClaimResult::Won { attempts, path } => {
                (format!("won ({})", path.as_str()), true, Some(*attempts))
            }
            ClaimResult::Existing(row) => (format!("not won ({:?})", row.status), false, None),
        })
    }
    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
        history: Option<&'a History>,
    ) -> StoreFuture<'a, Fenced> {
        let run = move || self.inner.complete(id, attempts, result, history);
        self.hooked(Op::Complete, Some(id), Some(attempts), run, fenced)
    }
    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced> {
        let run = move || self.inner.fail(id, attempts, failure);
        self.hooked(Op::Fail, Some(id), Some(attempts), run, fenced)
    }
    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        let run = move || self.inner.lookup(id);
        self.hooked(Op::Lookup, Some(id), None, run, |r| {
            let said = r.as_ref().map_or("no row".into(), |r| {
                format!("{} #{}", r.status.as_str(), r.attempts)
            });
            (said, false, None)
        })
    }
    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>> {
        let run = move || self.inner.replay(id, lease);
        self.hooked(Op::Replay, Some(id), None, run, |r| match r {
            Some(r) => ("reopened".into(), true, Some(r.attempts)),
            None => ("not a dead letter".into(), false, None),
        })
    }
    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        self.inner.dead_letters(provider, after, limit)
    }
    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        self.inner.sweep(status, older_than, batch)
    }
    fn retain<'a>(&'a self, policy: &'a Retention) -> StoreFuture<'a, Retained> {
        Box::pin(async move { self.hooks.retained(self.inner.retain(policy).await) })
    }
    fn table_sizes(&self) -> StoreFuture<'_, Vec<TableSize>> {
        self.inner.table_sizes()
    }
    fn enqueue_routed<'a>(
        &'a self,
        item: &'a QueueRow,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<Enqueued>> {
        self.inner.enqueue_routed(item, others)
    }
    fn take<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Taken>> {
        let run = move || self.inner.take(id, lease);
        self.hooked(Op::Take, Some(id), None, run, |r| match r {
            Some(t) => (
                format!("taken ({})", t.path.as_str()),
                true,
                Some(t.attempts),
            ),
            None => ("not due".into(), false, None),
        })
    }
    fn take_due<'a>(
        &'a self,
        provider: &'a str,
        limit: u32,
        lease: Duration,
        busy: &'a [Arc<str>],
    ) -> StoreFuture<'a, Vec<Taken>> {
        let run = move || self.inner.take_due(provider, limit, lease, busy);
        self.hooked(Op::Take, None, None, run, |rows| match rows.first() {
            Some(t) => (
                format!("taken {} ({})", t.id, t.path.as_str()),
                true,
                Some(t.attempts),
            ),
            None => ("none due".into(), false, None),
        })
    }
    fn due<'a>(&'a self, provider: &'a str, limit: u32) -> StoreFuture<'a, Vec<EventId>> {
        let run = move || self.inner.due(provider, limit);
        self.hooked(Op::Due, None, None, run, |ids| {
            (format!("{} due", ids.len()), false, None)
        })
    }
    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced> {
        let run = move || self.inner.renew(id, attempts, lease);
        self.hooked(Op::Renew, Some(id), Some(attempts), run, fenced)
    }
    fn abandon<'a>(
        &'a self,
        provider: &'a str,
        horizon: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        self.inner.abandon(provider, horizon, batch)
    }
    fn orphan<'a>(
        &'a self,
        known: &'a [String],
        grace: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        self.inner.orphan(known, grace, batch)
    }
    fn list<'a>(
        &'a self,
        provider: Option<&'a str>,
        status: Option<Status>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        self.inner.list(provider, status, limit)
    }
    fn operator(&self) -> &dyn hookgate::store::operator::OperatorStore {
        self.inner.operator()
    }
    fn resealer(&self) -> &dyn hookgate::store::Resealer {
        self.inner.resealer()
    }
    fn keyring(&self) -> Option<&Arc<hookgate::seal::Keyring>> {
        self.inner.keyring()
    }
    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>> {
        self.inner.queue_depth()
    }
}
