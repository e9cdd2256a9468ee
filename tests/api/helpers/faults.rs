//! Faults put into a real store: [`FaultyStore`] delegates every operation to the store it
//! wraps, counts the pings, and panics when asked to complete a key containing `panic` — a
//! bug in the code a shard runs, where no worker catches it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookgate::claim::{ClaimResult, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::store::{
    Enqueued, EventRecord, Failure, Fenced, History, Kept, QueueDepth, QueueRow, Reopened, Store,
    StoreFuture, Taken,
};

pub struct FaultyStore {
    inner: Arc<dyn Store>,
    /// `ping` calls so far.
    pub pings: AtomicUsize,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            pings: AtomicUsize::new(0),
        }
    }
}

impl Store for FaultyStore {
    fn migrate(&self) -> StoreFuture<'_, ()> {
        self.inner.migrate()
    }
    fn ping(&self) -> StoreFuture<'_, ()> {
        self.pings.fetch_add(1, Ordering::SeqCst);
        self.inner.ping()
    }
    fn durability_risks(&self) -> StoreFuture<'_, Vec<(String, String)>> {
        self.inner.durability_risks()
    }
    fn claim<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
        keep: Option<&'a Kept>,
    ) -> StoreFuture<'a, ClaimResult> {
        self.inner.claim(id, fingerprint, lease, keep)
    }
    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
        history: Option<&'a History>,
    ) -> StoreFuture<'a, Fenced> {
        assert!(!id.key.contains("panic"), "injected store panic for {id}");
        self.inner.complete(id, attempts, result, history)
    }
    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced> {
        self.inner.fail(id, attempts, failure)
    }
    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        self.inner.lookup(id)
    }
    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>> {
        self.inner.replay(id, lease)
    }
    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        after: Option<&'a hookgate::store::PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventRecord>> {
        self.inner.dead_letters(provider, after, limit)
    }
    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        self.inner.sweep(status, older_than, batch)
    }
    fn enqueue<'a>(&'a self, item: &'a QueueRow) -> StoreFuture<'a, Enqueued> {
        self.inner.enqueue(item)
    }
    fn take<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Taken>> {
        self.inner.take(id, lease)
    }
    fn due<'a>(&'a self, provider: &'a str, limit: u32) -> StoreFuture<'a, Vec<EventId>> {
        self.inner.due(provider, limit)
    }
    fn take_due<'a>(
        &'a self,
        provider: &'a str,
        limit: u32,
        lease: Duration,
    ) -> StoreFuture<'a, Vec<Taken>> {
        self.inner.take_due(provider, limit, lease)
    }
    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced> {
        self.inner.renew(id, attempts, lease)
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
    ) -> StoreFuture<'a, Vec<EventRecord>> {
        self.inner.list(provider, status, limit)
    }
    fn operator(&self) -> &dyn hookgate::store::operator::OperatorStore {
        self.inner.operator()
    }
    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>> {
        self.inner.queue_depth()
    }
}
