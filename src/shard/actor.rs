//! The shard actor: owns a slice of the key space and serializes the claims for its keys.
//!
//! Every key hashes to exactly one shard (`dispatcher`), and a shard's state is touched
//! only by its own handlers, one at a time, so no lock guards it. Per key, a shard
//! answers from memory when it can — a key in its in-flight set is `in_progress_elsewhere`,
//! a key in its done cache is `duplicate_done` — and otherwise admits the request: a worker
//! is reserved *before* the claim is sent (or the request waits for one, bounded, with
//! nothing claimed, or is refused), so a won claim never waits while its lease runs.
//!
//! Claims for different keys run concurrently (their futures are spawned, not awaited in
//! the mailbox); two requests for the same key never reach the store together from this
//! node, because the first one's in-flight entry holds the second. What happens once the
//! store answers is in `claimed.rs`; a won claim's attempt in `running.rs`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{info, Logger};
use tokio::sync::oneshot;

use super::answer::{cached_answer, log_refusal, mismatch_with, Answer, Reply, RetryReason};
use super::attempt::ceil_secs;
use super::busy::BusyCounts;
use super::cache::{DoneCache, DoneWriter};
use super::event::Event;
use super::gate::Gate;
use super::in_flight::{InFlightSet, NodeKeys};
use super::messages::Ingest;
use super::signals::QueueSignals;
use super::slots::Pending;
use crate::claim::{Mode, Path};
use crate::metrics::Metrics;
use crate::retry::RetryPolicy;
use crate::store::{Kept, Store};
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
}

/// A request admitted to wait for a free worker; nothing is claimed for it yet.
pub(super) struct Waiting {
    pub(super) event: Arc<Event>,
    pub(super) reply: oneshot::Sender<Answer>,
    pub(super) token: u64,
    /// When it is refused if no worker has freed up.
    pub(super) until: Instant,
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

/// A claim on its way to the store, with what is needed when the answer comes back.
pub(super) struct Claiming {
    /// The request that made it.
    pub(super) event: Arc<Event>,
    /// Where its answer goes.
    pub(super) reply: oneshot::Sender<Answer>,
    /// Its in-flight entry's token.
    pub(super) token: u64,
    /// The worker reserved for its attempt.
    pub(super) worker: usize,
    /// Taken just before the claim left: the store's lease starts no earlier.
    pub(super) sent: Instant,
}

/// One shard.
pub struct Shard {
    pub(super) index: usize,
    pub(super) store: Arc<dyn Store>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) settings: Arc<ShardSettings>,
    pub(super) workers: Vec<Addr<Worker>>,
    /// Workers that can start a delivery now. A worker is taken from here *before* its
    /// claim is made and given back when the attempt has been recorded, so a won claim
    /// never waits for a worker while its lease runs.
    pub(super) idle: Vec<usize>,
    /// Queue rows per shard of the node that the scheduler may take (this shard writes its
    /// own slot whenever `idle` or `pending` changes; see [`Shared::room`]).
    pub(super) room: Arc<[AtomicUsize]>,
    /// The queue-mode providers' rate and in-flight limits, shared by the node.
    pub(super) gate: Gate,
    /// Requests waiting for a worker, oldest first; bounded by `admission_queue`. Every
    /// request waits the same `admission_wait`, so their deadlines come in queue order.
    pub(super) waiting: VecDeque<Waiting>,
    /// Queue rows the scheduler took for this shard while none of its workers was free,
    /// oldest first: each starts when a worker frees up, or is released once its lease
    /// would no longer cover a start. Bounded by what the scheduler takes: at most the
    /// node's idle workers a pass.
    pub(super) pending: VecDeque<Pending>,
    /// Wakes the queue scheduler when a worker frees up.
    pub(super) signals: Arc<QueueSignals>,
    /// Whether the one timer that refuses expired waits is set (see [`Shard::expire_waits`]).
    pub(super) expiry_set: bool,
    pub(super) in_flight: InFlightSet,
    pub(super) done: DoneWriter,
    /// Claims and attempts in flight, each counted by a guard its future owns; whether
    /// [`Drain`] came (nothing more is claimed); the [`Drained`] callers.
    pub(super) busy: BusyCounts,
    pub(super) log: Logger,
}

impl Shard {
    /// Shard number `index`, delivering through `workers` and filling its part of
    /// `done`; `log` carries the number.
    pub fn new(index: usize, workers: Vec<Addr<Worker>>, node: &Shared, log: Logger) -> Self {
        let settings = Arc::clone(&node.settings);
        node.room[index].store(2 * workers.len(), Ordering::Relaxed);
        Self {
            index,
            store: Arc::clone(&node.store),
            metrics: Arc::clone(&node.metrics),
            gate: node.gate.clone(),
            room: Arc::clone(&node.room),
            idle: (0..workers.len()).rev().collect(),
            workers,
            waiting: VecDeque::new(),
            pending: VecDeque::new(),
            signals: Arc::clone(&node.signals),
            expiry_set: false,
            in_flight: InFlightSet::new(node.in_flight.clone()),
            done: node
                .done
                .writer(settings.cache_capacity, settings.cache_bytes),
            busy: BusyCounts::default(),
            settings,
            log,
        }
    }

    /// Answers from the in-flight set or the done cache, without the store.
    fn answer_from_memory(&self, event: &Event) -> Option<Answer> {
        if let Some(entry) = self.in_flight.get(&event.id) {
            let held = entry.since.elapsed();
            // A sync entry older than the lease is not trusted: the store decides. A queue
            // attempt's entry, or any that renews its lease (a replay, see `Entry::renews`),
            // is: it lives on renewals, and until its outcome is written however long the
            // store takes, and a claim now would fence that write out.
            let renews = entry.renews || entry.event.mode == Mode::Queue;
            if held < self.settings.lease || renews {
                let attempts = entry.attempts;
                let busy = Answer {
                    path: Path::InProgressElsewhere,
                    attempts,
                    reply: Reply::Busy {
                        retry_after: ceil_secs(self.settings.lease.saturating_sub(held)),
                    },
                };
                return Some(
                    mismatch_with(&self.log, event, &entry.event, attempts).unwrap_or(busy),
                );
            }
        }
        // The HTTP handler already asked the cache; ask again, as the key may have
        // finished while this request waited in the mailbox.
        cached_answer(
            self.done.cache(),
            &event.id,
            event.fingerprint.as_deref(),
            &self.log,
        )
    }

    /// Labels one request with its path: the `webhook.claim` line and the metric.
    pub(super) fn log_claim(&self, event: &Event, path: Path, attempts: Option<i32>) {
        let id = &event.id;
        self.metrics.attempt(&id.provider, path);
        info!(self.log, "webhook.claim";
            "provider" => &*id.provider, "event_key" => &*id.key, "path" => path.as_str(),
            "attempts" => attempts, "mode" => event.mode.as_str());
    }

    /// Answers the requests (one, and those that waited on the same key) with a refusal
    /// that claimed nothing, and logs its cause (an operator who sees a 503 finds why).
    pub(super) fn refuse(
        &self,
        requests: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
        reason: RetryReason,
        cause: &str,
    ) {
        for (event, reply) in requests {
            let answer = Answer::refused(reason);
            log_refusal(&self.log, &event.id, &answer, cause);
            self.log_claim(&event, answer.path, None);
            let _ = reply.send(answer);
        }
    }

    /// A new request that memory could not answer: claim at once if a worker is idle,
    /// else wait (bounded) for one without claiming, else refuse.
    fn admit(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        if self.busy.draining() {
            let cause = "the node is shutting down";
            self.refuse(vec![(event, reply)], RetryReason::ShuttingDown, cause);
            return;
        }
        let token = self.in_flight.begin(&event, None);
        if let Some(worker) = self.take_idle() {
            self.claim(event, reply, token, worker, ctx);
        } else if self.waiting.len() < self.settings.admission_queue {
            self.waiting.push_back(Waiting {
                event,
                reply,
                token,
                until: crate::deadline::from_now(self.settings.admission_wait),
            });
            self.metrics.admission_waiting(self.index, 1);
            if !self.expiry_set {
                self.expiry_set = true;
                ctx.run_later(self.settings.admission_wait, Self::expire_waits);
            }
        } else {
            let waiters = self.in_flight.forget(&event.id, token);
            let cause = format!(
                "all {} workers busy and {} requests waiting",
                self.workers.len(),
                self.waiting.len()
            );
            let requests = std::iter::once((event, reply)).chain(waiters).collect();
            self.refuse(requests, RetryReason::Overloaded, &cause);
        }
    }

    /// Refuses the waiting requests whose `admission_wait` ran out before a worker freed
    /// up, then sets the timer again for the oldest one left. One timer per shard, not one
    /// per request: an actor's context polls every timer it holds whenever it wakes, and a
    /// timer per waiting request (each living the whole wait) cost more CPU at 6k first
    /// runs a second than any other part of the shard.
    fn expire_waits(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let cause = format!(
            "no worker freed up within {} ms",
            self.settings.admission_wait.as_millis()
        );
        while self.waiting.front().is_some_and(|w| w.until <= now) {
            if let Some(w) = self.waiting.pop_front() {
                self.refuse_waiting(w, RetryReason::Overloaded, &cause);
            }
        }
        self.expiry_set = match self.waiting.front() {
            Some(oldest) => {
                ctx.run_later(oldest.until - now, Self::expire_waits);
                true
            }
            None => false,
        };
    }

    /// Refuses a request taken off the waiting queue, and every request that waited on its
    /// key; nothing was claimed for any of them.
    pub(super) fn refuse_waiting(&mut self, w: Waiting, reason: RetryReason, cause: &str) {
        let requests = self.unwait(w);
        self.refuse(requests, reason, cause);
    }

    /// Answers a request taken off the waiting queue, and every request that waited on its
    /// key, 503 `paused`: its provider was paused while it waited; nothing was claimed.
    fn hold_waiting(&mut self, w: Waiting) {
        for (event, reply) in self.unwait(w) {
            let answer = Answer::paused(self.settings.paused_retry_after);
            self.log_claim(&event, answer.path, None);
            let _ = reply.send(answer);
        }
    }

    /// A request taken off the waiting queue without a claim, with every request that
    /// waited on its key.
    fn unwait(&mut self, w: Waiting) -> Vec<(Arc<Event>, oneshot::Sender<Answer>)> {
        self.metrics.admission_waiting(self.index, -1);
        let waiters = self.in_flight.forget(&w.event.id, w.token);
        std::iter::once((w.event, w.reply)).chain(waiters).collect()
    }

    /// Sends the claim for `event`, whose attempt `worker` will run if it is won.
    fn claim(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        token: u64,
        worker: usize,
        ctx: &mut Context<Self>,
    ) {
        let busy = self.busy.claiming();
        let store = Arc::clone(&self.store);
        let lease = self.settings.lease;
        let ev = Arc::clone(&event);
        // Taken before the claim leaves: the store's lease starts no earlier, so
        // `sent + lease` never overstates the time the lease has left.
        let sent = Instant::now();
        // A provider that keeps payloads always writes it with the claim.
        let keep = ev.target.keep_payload.then(|| Kept {
            payload: ev.body.clone(),
            content_type: ev.content_type.clone(),
            headers: super::record::kept_headers(&ev),
        });
        let claim = async move {
            store
                .claim(&ev.id, ev.fingerprint.as_deref(), lease, keep.as_ref())
                .await
        };
        let claiming = Claiming {
            event,
            reply,
            token,
            worker,
            sent,
        };
        ctx.spawn(claim.into_actor(self).map(move |result, act, ctx| {
            act.answer_claim(claiming, result, ctx);
            drop(busy);
        }));
    }

    /// Gives `worker` to the oldest waiting request (a sender waits on it), else to the
    /// oldest queue row taken for this shard, else back to the idle set — and then tells the
    /// scheduler a worker is free.
    pub(super) fn free_worker(&mut self, worker: usize, ctx: &mut Context<Self>) {
        // While draining nothing waits (`Drain` refused the queue) and nothing is claimed.
        while !self.busy.draining() {
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            if self.gate.held(&w.event.id.provider) {
                // Paused by an operator while it waited: the sender keeps it.
                self.hold_waiting(w);
                continue;
            }
            self.metrics.admission_waiting(self.index, -1);
            self.claim(w.event, w.reply, w.token, worker, ctx);
            return;
        }
        if let Some(pending) = self.next_pending(ctx) {
            self.start_pending(pending, worker, ctx);
            return;
        }
        self.idle.push(worker);
        self.publish_room();
        self.signals.freed();
    }

    /// Reserves an idle worker, if there is one.
    pub(super) fn take_idle(&mut self) -> Option<usize> {
        let worker = self.idle.pop();
        self.publish_room();
        worker
    }

    /// Writes this shard's room for queue rows (idle workers, plus a worker's worth of rows
    /// that may wait per worker, less those waiting) where the scheduler reads it.
    pub(super) fn publish_room(&self) {
        let room = (self.idle.len() + self.workers.len()).saturating_sub(self.pending.len());
        self.room[self.index].store(room, Ordering::Relaxed);
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

impl Shard {
    /// A sender's sync request: answered from memory, waiting on a claim of its key on its
    /// way, or claimed.
    pub(super) fn ingest(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        if let Some(entry) = self.in_flight.get_mut(&event.id) {
            let pending = entry.attempts.is_none() && entry.since.elapsed() < self.settings.lease;
            if pending && entry.waiters.len() < MAX_WAITERS {
                entry.waiters.push((event, reply));
                return;
            }
        }
        if let Some(answer) = self.answer_from_memory(&event) {
            self.log_claim(&event, answer.path, answer.attempts);
            let _ = reply.send(answer);
            return;
        }
        self.admit(event, reply, ctx);
    }
}
