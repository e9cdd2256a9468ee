//! Faults put into a real store: [`FaultyStore`] delegates every operation to the store it
//! wraps, counts the pings, panics when asked to complete a key containing `panic` — a
//! bug in the code a shard runs, where no worker catches it — and, while the test holds
//! them ([`FaultyStore::hold_writes`]), keeps outcome writes and lease renewals from
//! reaching the store, as a database that stalls would; and fails the next replays it is
//! told to ([`FaultyStore::fail_replays`]) as a store that did not answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookgate::claim::{ClaimResult, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::store::{
    Enqueued, EventRecord, Failure, Fenced, History, Kept, QueueDepth, QueueRow, Reopened, Store,
    StoreError, StoreFuture, Taken,
};

pub struct FaultyStore {
    inner: Arc<dyn Store>,
    /// `ping` calls so far.
    pub pings: AtomicUsize,
    /// Whether `complete` and `renew` calls wait before they reach the store.
    hold: tokio::sync::watch::Sender<bool>,
    /// `complete` calls waiting on the hold now.
    held: AtomicUsize,
    /// `replay` calls still to fail with `StoreError::Unavailable`, reaching nothing.
    replays_to_fail: AtomicUsize,
    /// `replay` calls failed so far.
    pub replays_failed: AtomicUsize,
}

/// Outcome writes and renewals are held while this lives; dropping it lets them through.
pub struct WritesHeld<'a>(&'a FaultyStore);

impl Drop for WritesHeld<'_> {
    fn drop(&mut self) {
        self.0.hold.send_replace(false);
    }
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            pings: AtomicUsize::new(0),
            hold: tokio::sync::watch::channel(false).0,
            held: AtomicUsize::new(0),
            replays_to_fail: AtomicUsize::new(0),
            replays_failed: AtomicUsize::new(0),
        }
    }

    /// Fails the next `n` `replay` calls as a store that did not answer (nothing reopened).
    pub fn fail_replays(&self, n: usize) {
        self.replays_to_fail.store(n, Ordering::SeqCst);
    }

    /// Holds every `complete` (an outcome write) and `renew` call before it reaches the
    /// store until the answer is dropped.
    pub fn hold_writes(&self) -> WritesHeld<'_> {
        self.hold.send_replace(true);
        WritesHeld(self)
    }

    /// Waits while writes are held; `complete` calls waiting are counted.
    async fn pass_hold(&self, counted: bool) {
        let mut hold = self.hold.subscribe();
        if !*hold.borrow_and_update() {
            return;
        }
        if counted {
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        let _ = hold.wait_for(|held| !held).await;
        if counted {
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// How many `complete` calls are waiting on the hold now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

impl Store for FaultyStore {
    fn migrate_reporting<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&hookgate::store::MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        self.inner.migrate_reporting(on_wait)
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
        Box::pin(async move {
            self.pass_hold(true).await;
            self.inner.complete(id, attempts, result, history).await
        })
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
        let fail = self
            .replays_to_fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            self.replays_failed.fetch_add(1, Ordering::SeqCst);
            return Box::pin(async { Err(StoreError::Unavailable("injected outage".into())) });
        }
        self.inner.replay(id, lease)
    }
    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        after: Option<&'a hookgate::store::PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<hookgate::store::EventSummary>> {
        self.inner.dead_letters(provider, after, limit)
    }
    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        self.inner.sweep(status, older_than, batch)
    }
    fn retain<'a>(
        &'a self,
        policy: &'a hookgate::store::Retention,
    ) -> StoreFuture<'a, hookgate::store::Retained> {
        self.inner.retain(policy)
    }
    fn table_sizes(&self) -> StoreFuture<'_, Vec<hookgate::store::TableSize>> {
        self.inner.table_sizes()
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
        busy: &'a [Arc<str>],
    ) -> StoreFuture<'a, Vec<Taken>> {
        self.inner.take_due(provider, limit, lease, busy)
    }
    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced> {
        Box::pin(async move {
            self.pass_hold(false).await;
            self.inner.renew(id, attempts, lease).await
        })
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
    ) -> StoreFuture<'a, Vec<hookgate::store::EventSummary>> {
        self.inner.list(provider, status, limit)
    }
    fn operator(&self) -> &dyn hookgate::store::operator::OperatorStore {
        self.inner.operator()
    }
    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>> {
        self.inner.queue_depth()
    }
}
