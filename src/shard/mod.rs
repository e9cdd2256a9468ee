//! The shard actor: owns a slice of the key space and serializes the claims for its keys.
//!
//! Every key hashes to exactly one shard ([`dispatcher`]), and a shard's state is touched
//! only by its own handlers, one at a time, so no lock guards it. Per key, a shard
//! answers from memory when it can — a key in its in-flight set is `in_progress_elsewhere`,
//! a key in its done cache is `duplicate_done` — and otherwise claims in the store, hands a
//! won claim to one of its supervised workers, and writes the outcome back fenced by the
//! attempt number. The store row stays the truth; memory only saves round trips.
//!
//! Claims for *different* keys run concurrently (their futures are spawned, not awaited
//! in the mailbox); two requests for the *same* key never reach the store together from
//! this node, because the first one's in-flight entry answers the second.

pub mod answer;
pub mod cache;
pub mod dispatcher;
mod event;
mod finish;
mod in_flight;
mod operator;
mod record;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{info, Logger};
use tokio::sync::oneshot;

use crate::claim::{classify, ClaimResult, Path, RowState};
use crate::key::EventId;
use crate::metrics::Metrics;
use crate::outcome::{judge, Verdict};
use crate::retry::RetryPolicy;
use crate::store::{Store, StoreError};
use crate::worker::{Deliver, DeliveryOutcome, DeliveryRequest, Worker};

use answer::log_mismatch;
pub use answer::{cached_answer, Answer, Reply};
use cache::{CachedDone, DoneCache, DoneWriter};
pub use dispatcher::Dispatcher;
pub use crate::provider::Target;
pub use event::Event;
use in_flight::InFlightSet;
pub use record::write_verdict;
use record::write_verdict_retrying;

/// Requests for one key that may wait on its pending claim; more are answered 409 at once.
/// Bounds a shard's memory under a flood of one key while the store is slow.
const MAX_WAITERS: usize = 1024;

/// `Retry-After` while the store is unreachable: about the longest reconnect backoff, so
/// a sender does not hammer a node that cannot answer yet.
const STORE_RETRY_AFTER_SECS: u64 = 5;

/// `Retry-After` when this node is too busy right now: a worker frees up within a target's
/// answer time, so a second is plenty.
const OVERLOADED_RETRY_AFTER_SECS: u64 = 1;

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
}

/// Handle one delivery; the answer comes back on `reply`.
///
/// The reply travels in the message (rather than as the handler's result) so that the
/// HTTP layer can use `try_send` and refuse at once when the mailbox is full.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ingest {
    /// The delivery.
    pub event: Arc<Event>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Answer>,
}

/// Replay a dead letter once (an operator's request); the answer says how it ended, or
/// [`Reply::NotReplayable`] when the row was not dead.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Replay {
    /// The dead letter's key.
    pub id: EventId,
    /// Where its provider delivers now.
    pub target: Arc<Target>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Answer>,
}

/// Shutdown, first step: claim nothing more. Requests waiting for a worker are refused;
/// a claim still on its way that is won is released (`failed`, fenced) without reaching
/// the target; deliveries already running go on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain;

/// Shutdown, second step: answered once every claim on its way has come back and every
/// running delivery has ended and been recorded.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drained;

/// A request admitted to wait for a free worker; nothing is claimed for it yet.
struct Waiting {
    event: Arc<Event>,
    reply: oneshot::Sender<Answer>,
    token: u64,
}

/// One shard.
pub struct Shard {
    index: usize,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    settings: Arc<ShardSettings>,
    workers: Vec<Addr<Worker>>,
    /// Workers that can start a delivery now. A worker is taken from here *before* its
    /// claim is made and given back when the attempt has been recorded, so a won claim
    /// never waits for a worker while its lease runs.
    idle: Vec<usize>,
    /// Requests waiting for a worker, oldest first; bounded by `admission_queue`.
    waiting: VecDeque<Waiting>,
    in_flight: InFlightSet,
    done: DoneWriter,
    /// Claims sent to the store and not answered yet.
    claiming: usize,
    /// Attempts between a won claim and their recorded outcome.
    running: usize,
    /// Set by [`Drain`]: nothing more is claimed.
    draining: bool,
    /// [`Drained`] callers, answered when `claiming` and `running` reach zero.
    drained: Vec<oneshot::Sender<()>>,
    log: Logger,
}

impl Shard {
    /// Shard number `index`, delivering through `workers` and filling its part of
    /// `done`; `log` carries the number.
    pub fn new(
        index: usize,
        store: Arc<dyn Store>,
        settings: Arc<ShardSettings>,
        workers: Vec<Addr<Worker>>,
        done: &DoneCache,
        metrics: Arc<Metrics>,
        log: Logger,
    ) -> Self {
        Self {
            index,
            store,
            metrics,
            idle: (0..workers.len()).rev().collect(),
            workers,
            waiting: VecDeque::new(),
            in_flight: InFlightSet::default(),
            done: done.writer(settings.cache_capacity, settings.cache_bytes),
            claiming: 0,
            running: 0,
            draining: false,
            drained: Vec::new(),
            settings,
            log,
        }
    }

    /// Answers from the in-flight set or the done cache, without the store.
    fn answer_from_memory(&self, event: &Event) -> Option<Answer> {
        let mismatch = |stored: Option<&str>| match (stored, event.fingerprint.as_deref()) {
            (Some(stored), Some(incoming)) => stored != incoming,
            _ => false,
        };
        if let Some(entry) = self.in_flight.get(&event.id) {
            let held = entry.since.elapsed();
            // An entry older than the lease is not trusted: the store decides.
            if held < self.settings.lease {
                let attempts = entry.attempts;
                return Some(if mismatch(entry.event.fingerprint.as_deref()) {
                    log_mismatch(
                        &self.log,
                        &event.id,
                        event.fingerprint.as_deref(),
                        entry.event.fingerprint.as_deref(),
                    );
                    Answer {
                        path: Path::PayloadMismatch,
                        attempts,
                        reply: Reply::Mismatch,
                    }
                } else {
                    Answer {
                        path: Path::InProgressElsewhere,
                        attempts,
                        reply: Reply::Busy {
                            retry_after: ceil_secs(self.settings.lease - held),
                        },
                    }
                });
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
    fn log_claim(&self, id: &EventId, path: Path, attempts: Option<i32>) {
        self.metrics.attempt(&id.provider, path);
        info!(self.log, "webhook.claim";
            "provider" => &*id.provider, "event_key" => &*id.key, "path" => path.as_str(),
            "attempts" => attempts);
    }

    /// Answers `event`'s request and those that waited on the same key with a refusal that
    /// claimed nothing, and logs the cause (an operator who sees a 503 finds why).
    fn refuse(
        &self,
        requests: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
        path: Path,
        reason: &'static str,
        cause: &str,
    ) {
        let retry_after = match path {
            Path::StoreUnavailable => STORE_RETRY_AFTER_SECS,
            _ => OVERLOADED_RETRY_AFTER_SECS,
        };
        for (event, reply) in requests {
            answer::log_refusal(&self.log, &event.id, path, reason, retry_after, cause);
            self.log_claim(&event.id, path, None);
            let _ = reply.send(Answer::unclaimed(
                path,
                Reply::RetryLater {
                    retry_after,
                    reason,
                },
            ));
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
        if self.draining {
            let cause = "the node is shutting down";
            self.refuse(
                vec![(event, reply)],
                Path::Overloaded,
                "shutting_down",
                cause,
            );
            return;
        }
        let token = self.in_flight.begin(&event, None);
        if let Some(worker) = self.idle.pop() {
            self.claim(event, reply, token, worker, ctx);
        } else if self.waiting.len() < self.settings.admission_queue {
            self.waiting.push_back(Waiting {
                event,
                reply,
                token,
            });
            self.metrics.admission_waiting(self.index, 1);
            ctx.run_later(self.settings.admission_wait, move |act, _ctx| {
                act.give_up_waiting(token);
            });
        } else {
            let waiters = self.in_flight.forget(&event.id, token);
            let cause = format!(
                "all {} workers busy and {} requests waiting",
                self.workers.len(),
                self.waiting.len()
            );
            let requests = std::iter::once((event, reply)).chain(waiters).collect();
            self.refuse(requests, Path::Overloaded, "overloaded", &cause);
        }
    }

    /// A waiting request's `admission_wait` ran out before a worker freed up.
    fn give_up_waiting(&mut self, token: u64) {
        let Some(at) = self.waiting.iter().position(|w| w.token == token) else {
            return;
        };
        let Some(w) = self.waiting.remove(at) else {
            return;
        };
        self.metrics.admission_waiting(self.index, -1);
        let waiters = self.in_flight.forget(&w.event.id, token);
        let cause = format!(
            "no worker freed up within {} ms",
            self.settings.admission_wait.as_millis()
        );
        let requests = std::iter::once((w.event, w.reply)).chain(waiters).collect();
        self.refuse(requests, Path::Overloaded, "overloaded", &cause);
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
        self.claiming += 1;
        let store = Arc::clone(&self.store);
        let lease = self.settings.lease;
        let ev = Arc::clone(&event);
        // Taken before the claim leaves: the store's lease starts no earlier, so
        // `sent + lease` never overstates the time the lease has left.
        let sent = Instant::now();
        let claim = async move { store.claim(&ev.id, ev.fingerprint.as_deref(), lease).await };
        ctx.spawn(claim.into_actor(self).map(move |result, act, ctx| {
            act.claiming -= 1;
            act.claimed(event, reply, token, worker, sent, result, ctx);
            act.notify_drained();
        }));
    }

    /// Gives `worker` to the oldest waiting request, or back to the idle set.
    fn free_worker(&mut self, worker: usize, ctx: &mut Context<Self>) {
        match self.waiting.pop_front() {
            Some(w) if !self.draining => {
                self.metrics.admission_waiting(self.index, -1);
                self.claim(w.event, w.reply, w.token, worker, ctx);
            }
            _ => self.idle.push(worker),
        }
    }

    /// The store answered the claim: answer it and every request that waited on it.
    #[allow(clippy::too_many_arguments)]
    fn claimed(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        token: u64,
        worker: usize,
        sent: Instant,
        result: Result<ClaimResult, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        match result {
            Ok(ClaimResult::Won { attempts, path }) => {
                self.log_claim(&event.id, path, Some(attempts));
                let waiters = self.in_flight.won(&event.id, token, attempts);
                self.answer_waiters_of_won(&event, attempts, waiters);
                let attempt = Attempt {
                    event,
                    token,
                    attempts,
                    path,
                    worker,
                    lease_ends: sent + self.settings.lease,
                };
                self.start(attempt, reply, ctx);
            }
            Ok(ClaimResult::Existing(row)) => {
                let waiters = self.in_flight.forget(&event.id, token);
                self.free_worker(worker, ctx);
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    let answer = self.existing(&event, row.clone());
                    self.log_claim(&event.id, answer.path, answer.attempts);
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                let waiters = self.in_flight.forget(&event.id, token);
                self.free_worker(worker, ctx);
                self.metrics.store_error(e.kind());
                let (path, reason) = match e {
                    StoreError::Busy(_) => (Path::Overloaded, "store_busy"),
                    _ => (Path::StoreUnavailable, "store_unavailable"),
                };
                let requests = std::iter::once((event, reply)).chain(waiters).collect();
                self.refuse(requests, path, reason, &e.to_string());
            }
        }
    }

    /// Requests that waited on a claim that was won: the key is now in progress (409), or
    /// they carry another payload (422).
    fn answer_waiters_of_won(
        &self,
        event: &Event,
        attempts: i32,
        waiters: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
    ) {
        let retry_after = ceil_secs(self.settings.lease);
        for (waiter, waiter_reply) in waiters {
            let mismatch = matches!(
                (event.fingerprint.as_deref(), waiter.fingerprint.as_deref()),
                (Some(won), Some(waiting)) if won != waiting
            );
            let answer = if mismatch {
                log_mismatch(
                    &self.log,
                    &waiter.id,
                    waiter.fingerprint.as_deref(),
                    event.fingerprint.as_deref(),
                );
                Answer {
                    path: Path::PayloadMismatch,
                    attempts: Some(attempts),
                    reply: Reply::Mismatch,
                }
            } else {
                Answer {
                    path: Path::InProgressElsewhere,
                    attempts: Some(attempts),
                    reply: Reply::Busy { retry_after },
                }
            };
            self.log_claim(&waiter.id, answer.path, answer.attempts);
            let _ = waiter_reply.send(answer);
        }
    }

    /// The answer for a row the claim did not win; caches it when it is done.
    fn existing(&mut self, event: &Event, row: RowState) -> Answer {
        let path = classify(&row, event.fingerprint.as_deref());
        let attempts = Some(row.attempts);
        let reply = match path {
            Path::DuplicateDone => match row.result {
                Some(result) => {
                    let result = Arc::new(result);
                    self.done.insert(
                        event.id.clone(),
                        CachedDone {
                            attempts: row.attempts,
                            fingerprint: row.fingerprint,
                            result: Arc::clone(&result),
                        },
                    );
                    Reply::Result(result)
                }
                None => {
                    let cause = "a done row without its result";
                    answer::log_refusal(&self.log, &event.id, path, "result_missing", 1, cause);
                    Reply::RetryLater {
                        retry_after: 1,
                        reason: "result_missing",
                    }
                }
            },
            Path::DuplicateDead => Reply::DeadLettered,
            Path::PayloadMismatch => {
                log_mismatch(
                    &self.log,
                    &event.id,
                    event.fingerprint.as_deref(),
                    row.fingerprint.as_deref(),
                );
                Reply::Mismatch
            }
            _ => Reply::Busy {
                retry_after: ceil_secs(row.lease_left),
            },
        };
        Answer {
            path,
            attempts,
            reply,
        }
    }

    /// A won claim: delivered, or released without reaching the target once the node is
    /// draining.
    fn start(&mut self, attempt: Attempt, reply: oneshot::Sender<Answer>, ctx: &mut Context<Self>) {
        if self.draining {
            self.release(attempt, reply, ctx);
        } else {
            self.deliver(attempt, reply, ctx);
        }
    }

    /// Hands a won claim to its reserved worker, then records and answers its outcome.
    fn deliver(
        &mut self,
        attempt: Attempt,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        let event = &attempt.event;
        let request = DeliveryRequest {
            url: Arc::clone(&event.target.url),
            timeout: event.target.timeout,
            body: event.body.clone(),
            content_type: event.content_type.clone(),
            idempotency_key: event.id.header_value(),
            attempt: attempt.attempts,
        };
        // The last moment the delivery may start and still end (at its timeout) inside
        // the lease; a worker that gets it later refuses to start it.
        let start_by = attempt
            .lease_ends
            .checked_sub(event.target.timeout)
            .unwrap_or_else(Instant::now);
        let sent = self.workers[attempt.worker].send(Deliver { request, start_by });
        self.record(attempt, reply, ctx, async move {
            sent.await
                .unwrap_or_else(|e| DeliveryOutcome::Crashed(format!("worker unreachable: {e}")))
        });
    }

    /// A claim won after [`Drain`]: released (`failed`, fenced) without reaching the target.
    fn release(
        &mut self,
        attempt: Attempt,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        self.record(attempt, reply, ctx, async {
            DeliveryOutcome::NotStarted("released at shutdown".into())
        });
    }

    /// Runs `outcome` (the delivery, or its refusal), judges it, writes the verdict fenced
    /// (retried within the lease while the store is unreachable), then answers.
    fn record(
        &mut self,
        attempt: Attempt,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
        outcome: impl std::future::Future<Output = DeliveryOutcome> + 'static,
    ) {
        self.running += 1;
        let store = Arc::clone(&self.store);
        let settings = Arc::clone(&self.settings);
        let ev = Arc::clone(&attempt.event);
        let (attempts, path, lease_ends) = (attempt.attempts, attempt.path, attempt.lease_ends);
        let started = Instant::now();
        let log = self.log.clone();
        let work = async move {
            let outcome = outcome.await;
            let verdict: Verdict = judge(outcome, attempts, &settings.retry, path == Path::Replay);
            // Past the lease another attempt may hold the row and the write would be
            // stale anyway.
            let written =
                write_verdict_retrying(&*store, &ev, attempts, &verdict, lease_ends, &log).await;
            (verdict, written, started.elapsed())
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |(verdict, written, took), act, ctx| {
                    act.running -= 1;
                    act.in_flight.forget(&attempt.event.id, attempt.token);
                    act.free_worker(attempt.worker, ctx);
                    let answer =
                        act.finished(&attempt.event, attempts, path, verdict, written, took);
                    let _ = reply.send(answer);
                    act.notify_drained();
                }),
        );
    }

    /// Answers [`Drained`] callers once nothing is claiming or running.
    fn notify_drained(&mut self) {
        if self.draining && self.claiming == 0 && self.running == 0 {
            for done in self.drained.drain(..) {
                let _ = done.send(());
            }
        }
    }
}

/// A won claim on its way through a worker to its recorded outcome.
struct Attempt {
    event: Arc<Event>,
    /// The in-flight entry's token.
    token: u64,
    /// The fencing token.
    attempts: i32,
    path: Path,
    /// The worker reserved for it before the claim.
    worker: usize,
    /// When the lease ends at the latest, by this node's clock.
    lease_ends: Instant,
}

/// Whole seconds, rounded up, at least 1 (for `Retry-After`).
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
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
        let Ingest { event, reply } = msg;
        if let Some(entry) = self.in_flight.get_mut(&event.id) {
            let pending = entry.attempts.is_none() && entry.since.elapsed() < self.settings.lease;
            if pending && entry.waiters.len() < MAX_WAITERS {
                entry.waiters.push((event, reply));
                return;
            }
        }
        if let Some(answer) = self.answer_from_memory(&event) {
            self.log_claim(&event.id, answer.path, answer.attempts);
            let _ = reply.send(answer);
            return;
        }
        self.admit(event, reply, ctx);
    }
}
