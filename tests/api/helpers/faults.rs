//! A fault put into a real store: [`PanickingStore`] delegates every operation to the
//! store it wraps, and panics when asked to complete a key containing `panic` — a bug in
//! the code a shard runs, where no worker catches it.

use std::sync::Arc;
use std::time::Duration;

use hookgate::claim::{ClaimResult, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::store::{
    Enqueue, Enqueued, EventRecord, Failure, Fenced, QueueDepth, Reopened, Store, StoreFuture,
    Taken,
};

pub struct PanickingStore(pub Arc<dyn Store>);

impl Store for PanickingStore {
    fn migrate(&self) -> StoreFuture<'_, ()> {
        self.0.migrate()
    }
    fn ping(&self) -> StoreFuture<'_, ()> {
        self.0.ping()
    }
    fn durability_risks(&self) -> StoreFuture<'_, Vec<(String, String)>> {
        self.0.durability_risks()
    }
    fn claim<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
    ) -> StoreFuture<'a, ClaimResult> {
        self.0.claim(id, fingerprint, lease)
    }
    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
    ) -> StoreFuture<'a, Fenced> {
        assert!(!id.key.contains("panic"), "injected store panic for {id}");
        self.0.complete(id, attempts, result)
    }
    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced> {
        self.0.fail(id, attempts, failure)
    }
    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        self.0.lookup(id)
    }
    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>> {
        self.0.replay(id, lease)
    }
    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventRecord>> {
        self.0.dead_letters(provider, limit)
    }
    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        self.0.sweep(status, older_than, batch)
    }
    fn enqueue<'a>(&'a self, item: &'a Enqueue) -> StoreFuture<'a, Enqueued> {
        self.0.enqueue(item)
    }
    fn take<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Taken>> {
        self.0.take(id, lease)
    }
    fn due<'a>(&'a self, provider: &'a str, limit: u32) -> StoreFuture<'a, Vec<EventId>> {
        self.0.due(provider, limit)
    }
    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced> {
        self.0.renew(id, attempts, lease)
    }
    fn abandon<'a>(
        &'a self,
        provider: &'a str,
        horizon: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        self.0.abandon(provider, horizon, batch)
    }
    fn orphan<'a>(
        &'a self,
        known: &'a [String],
        grace: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        self.0.orphan(known, grace, batch)
    }
    fn list<'a>(
        &'a self,
        provider: Option<&'a str>,
        status: Option<Status>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventRecord>> {
        self.0.list(provider, status, limit)
    }
    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>> {
        self.0.queue_depth()
    }
}
