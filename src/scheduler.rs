//! The queue scheduler of one node: finds due queue rows (new ones not started at once,
//! `failed` ones whose backoff has passed, `in_progress` ones whose lease expired) and
//! offers each to the shard that owns its key, which takes it through the claim rule only
//! if a worker is idle and the provider's limits allow.
//!
//! It serves the queue rows of every configured provider, whatever mode the provider is in
//! now: a row keeps the mode it was accepted in. Bounded: a pass asks the store for no more
//! rows than the node's idle workers and the provider's gate allow, and offers go through
//! the shards' bounded mailboxes — no queue builds up in memory. It backs off while the
//! store is unavailable, and offers nothing once the node drains. [`Scheduler::run_once`]
//! is one pass (tests call it by hand); the node runs it every `queue.poll_interval`, and
//! at once again only after a pass that started attempts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use slog::{warn, Logger};

use crate::metrics::Metrics;
use crate::provider::Target;
use crate::shard::Dispatcher;
use crate::store::{Store, StoreError};

/// How often the queue depth metrics are refreshed at most.
const DEPTH_EVERY: Duration = Duration::from_secs(5);

/// Longest pause after the store failed: a returning database is noticed within it.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The scheduler of one node.
pub struct Scheduler {
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    /// Every configured provider, by name, with its target.
    providers: Vec<(Arc<str>, Arc<Target>)>,
    metrics: Arc<Metrics>,
    log: Logger,
    poll: Duration,
}

impl Scheduler {
    /// A scheduler offering `providers`' due rows to `dispatcher`'s shards.
    pub fn new(
        store: Arc<dyn Store>,
        dispatcher: Dispatcher,
        providers: Vec<(Arc<str>, Arc<Target>)>,
        metrics: Arc<Metrics>,
        log: Logger,
        poll: Duration,
    ) -> Self {
        Self {
            store,
            dispatcher,
            providers,
            metrics,
            log,
            poll,
        }
    }

    /// One pass: offers each provider's due rows, as many as can start now; answers how
    /// many attempts started (rows offered but not taken — another node had them, or the
    /// worker was gone by then — do not count).
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        if self.dispatcher.draining() {
            return Ok(0);
        }
        self.metrics.scheduler_poll();
        let mut taken = 0;
        for (provider, target) in &self.providers {
            let room = self
                .dispatcher
                .gate()
                .available(provider)
                .min(self.dispatcher.idle_workers());
            if room == 0 {
                continue;
            }
            let limit = u32::try_from(room).unwrap_or(u32::MAX);
            let due = self.store.due(provider, limit).await?;
            let offers = due
                .into_iter()
                .map(|id| self.dispatcher.offer(id, Arc::clone(target)));
            taken += join_all(offers).await.into_iter().filter(|&t| t).count();
        }
        Ok(taken)
    }

    /// Refreshes the queue depth metrics.
    pub async fn measure(&self) -> Result<(), StoreError> {
        for depth in self.store.queue_depth().await? {
            self.metrics
                .queue_depth(&depth.provider, depth.rows, depth.oldest_due.as_secs_f64());
        }
        Ok(())
    }

    /// Runs passes until the task is dropped: at once again after a pass that started
    /// attempts, after `queue.poll_interval` otherwise, backing off while the store fails.
    pub async fn run_forever(self: Arc<Self>) {
        if self.providers.is_empty() {
            return;
        }
        let mut backoff = self.poll;
        let mut measured: Option<Instant> = None;
        loop {
            if measured.is_none_or(|t| t.elapsed() >= DEPTH_EVERY) {
                if let Err(e) = self.measure().await {
                    warn!(self.log, "queue.measure_failed"; "error" => %e);
                }
                measured = Some(Instant::now());
            }
            let pause = match self.run_once().await {
                // Attempts started: there may be more due rows and idle workers.
                Ok(n) if n > 0 => Duration::ZERO,
                Ok(_) => self.poll,
                Err(e) => {
                    warn!(self.log, "queue.poll_failed"; "error" => %e,
                        "retry_in_ms" => u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX));
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    tokio::time::sleep(backoff).await;
                    continue;
                }
            };
            backoff = self.poll;
            if pause.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(pause).await;
            }
        }
    }
}
