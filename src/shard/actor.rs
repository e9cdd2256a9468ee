//! The shard actor, and this folder's table of contents: the shard's state, and every
//! message it takes, each handed in a few lines to the stage that owns it.
//!
//! A shard owns a slice of the key space and serializes the claims for its keys: every key
//! hashes to exactly one shard (`dispatcher`), and a shard's state is touched only by its
//! own handlers, one at a time, so no lock guards it. Claims for different keys run
//! concurrently (their futures are spawned, not awaited in the mailbox); two requests for
//! the same key never reach the store together from this node, because the first one's
//! in-flight entry holds the second.
//!
//! | message | from | stage |
//! |---|---|---|
//! | [`Ingest`] | a sender's sync request | `sync.rs`: memory answers, admission, the claim → `claimed.rs`: the store's answer, the attempt on its worker, its record, the answer |
//! | [`Enqueue`] | a sender's queue request | `queue.rs`: the row written (taken at once when a worker is free) and 202 |
//! | [`Start`] | a row the scheduler took | `taken.rs`: started on a worker, waiting for one, or released |
//! | [`Replay`] | an operator | `replay.rs`: the dead letter reopened, then run as any attempt |
//! | [`Drain`], [`Drained`] | shutdown | here: nothing more is claimed; answered once nothing is in flight (`busy.rs`) |
//!
//! Admission (idle workers, waiting requests, waiting rows, the room published to the
//! scheduler) is a plain type of its own (`admission.rs`), as the in-flight set is
//! (`in_flight.rs`); one attempt, whatever started it, runs through `attempt.rs`.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use slog::Logger;

use super::admission::Admission;
use super::answer::RetryReason;
use super::busy::BusyCounts;
use super::cache::{DoneCache, DoneWriter};
use super::gate::Gate;
use super::in_flight::{InFlightSet, NodeKeys};
use super::messages::{Drain, Drained, Enqueue, Ingest, Replay, Start};
use super::signals::QueueSignals;
use super::slots::{Pending, Waiting};
use crate::metrics::Metrics;
use crate::retry::RetryPolicy;
use crate::store::Store;
use crate::worker::Worker;

/// Requests for one key that may wait on its pending claim; more are answered 409 at once.
/// Bounds a shard's memory under a flood of one key while the store is slow.
pub(super) const MAX_WAITERS: usize = 1024;

/// Settings shared by every shard of a node.
#[derive(Debug, Clone)]
pub struct ShardSettings {
    /// The claim lease.
    pub lease: Duration,
    /// Backoff and attempt cap.
    pub retry: RetryPolicy,
    /// Done results each shard caches.
    pub cache_capacity: usize,
    /// Bytes of done results each shard caches.
    pub cache_bytes: usize,
    /// Messages each shard's mailbox holds.
    pub mailbox_capacity: usize,
    /// Requests each shard lets wait for a free worker before claiming.
    pub admission_queue: usize,
    /// Longest such wait.
    pub admission_wait: Duration,
    /// `Retry-After` (seconds) of a 503 `paused` answer.
    pub paused_retry_after: u64,
    /// Longest a target's `Retry-After` holds its whole provider (`queue.max_target_pause`).
    pub max_target_pause: Duration,
    /// The node's tracer (`None`: tracing is off): rows taken from the queue continue the
    /// trace their row keeps.
    pub tracer: Option<Arc<crate::trace::Tracer>>,
}

/// What the shards of a node share: the store, their settings, the metrics, the done
/// cache, the queue gate and the idle-worker counts.
pub struct Shared {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Settings of every shard.
    pub settings: Arc<ShardSettings>,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The done cache.
    pub done: DoneCache,
    /// The queue gate.
    pub gate: Gate,
    /// Queue rows each shard can take now, one slot per shard: its idle workers, plus as
    /// many rows waiting for a worker as it has workers (the next batch is taken while the
    /// last one runs, so workers do not idle between a scheduler's passes).
    pub room: Arc<[AtomicUsize]>,
    /// What wakes the queue scheduler.
    pub signals: Arc<QueueSignals>,
    /// The keys in flight on this node, which the scheduler leaves alone.
    pub in_flight: NodeKeys,
}

/// One shard.
pub struct Shard {
    pub(super) index: usize,
    pub(super) store: Arc<dyn Store>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) settings: Arc<ShardSettings>,
    pub(super) workers: Vec<Addr<Worker>>,
    /// Idle workers, requests and taken rows waiting for one, the room published.
    pub(super) admission: Admission<Waiting, Pending>,
    /// The queue-mode providers' rate and in-flight limits, shared by the node.
    pub(super) gate: Gate,
    /// Wakes the queue scheduler when a worker frees up.
    pub(super) signals: Arc<QueueSignals>,
    pub(super) in_flight: InFlightSet,
    pub(super) done: DoneWriter,
    /// Claims and attempts in flight, each counted by a guard its future owns; whether
    /// [`Drain`] came (nothing more is claimed); the [`Drained`] callers.
    pub(super) busy: BusyCounts,
    /// Other routes' rows being written taken to wait for a worker here (see `routes.rs`):
    /// counted against the shard's room until their claims answer.
    pub(super) waiting_others: usize,
    pub(super) log: Logger,
}

impl Shard {
    /// Shard number `index`, delivering through `workers` and filling its part of
    /// `done`; `log` carries the number.
    pub fn new(index: usize, workers: Vec<Addr<Worker>>, node: &Shared, log: Logger) -> Self {
        let settings = Arc::clone(&node.settings);
        let admission = Admission::new(
            index,
            workers.len(),
            settings.admission_queue,
            Arc::clone(&node.room),
        );
        Self {
            index,
            store: Arc::clone(&node.store),
            metrics: Arc::clone(&node.metrics),
            gate: node.gate.clone(),
            admission,
            workers,
            signals: Arc::clone(&node.signals),
            in_flight: InFlightSet::new(node.in_flight.clone()),
            done: node
                .done
                .writer(settings.cache_capacity, settings.cache_bytes),
            busy: BusyCounts::default(),
            waiting_others: 0,
            settings,
            log,
        }
    }
}

impl Actor for Shard {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.settings.mailbox_capacity);
    }
}

impl Handler<Ingest> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Ingest, ctx: &mut Context<Self>) {
        self.metrics.mailbox(self.index, -1);
        self.ingest(msg.event, msg.reply, ctx);
    }
}

impl Handler<Enqueue> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Enqueue, ctx: &mut Context<Self>) {
        self.metrics.mailbox(self.index, -1);
        self.enqueue(msg.event, msg.reply, ctx);
    }
}

impl Handler<Start> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Start, ctx: &mut Context<Self>) {
        self.metrics.mailbox(self.index, -1);
        self.start_taken(msg, ctx);
    }
}

impl Handler<Replay> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Replay, ctx: &mut Context<Self>) {
        self.replay(msg, ctx);
    }
}

impl Handler<Drain> for Shard {
    type Result = ();

    fn handle(&mut self, _msg: Drain, _ctx: &mut Context<Self>) {
        self.busy.drain();
        while let Some(w) = self.admission.next_waiting() {
            self.refuse_waiting(w, RetryReason::ShuttingDown, "the node is shutting down");
        }
    }
}

impl Handler<Drained> for Shard {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _msg: Drained, _ctx: &mut Context<Self>) -> Self::Result {
        let finished = self.busy.when_drained();
        Box::pin(async move {
            let _ = finished.await;
        })
    }
}
