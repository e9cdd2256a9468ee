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
mod operator;
mod record;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{error, info, Logger};
use tokio::sync::oneshot;

use crate::claim::{classify, ClaimResult, Path, RowState};
use crate::key::EventId;
use crate::metrics::Metrics;
use crate::outcome::judge;
use crate::retry::RetryPolicy;
use crate::store::{Store, StoreError};
use crate::worker::{Deliver, DeliveryOutcome, DeliveryRequest, Worker};

use answer::log_mismatch;
pub use answer::{cached_answer, Answer, Reply};
use cache::{CachedDone, DoneCache, DoneWriter};
pub use dispatcher::Dispatcher;
pub use event::{Event, Target};
pub use record::write_verdict;
use record::write_verdict_retrying;

/// Requests for one key that may wait on its pending claim; more are answered 409 at once.
/// Bounds a shard's memory under a flood of one key while the store is slow.
const MAX_WAITERS: usize = 1024;

/// `Retry-After` while the store is unreachable: about the longest reconnect backoff, so
/// a sender does not hammer a node that cannot answer yet.
const STORE_RETRY_AFTER_SECS: u64 = 5;

/// Settings shared by every shard of a node.
#[derive(Debug, Clone)]
pub struct ShardSettings {
    /// The claim lease.
    pub lease: Duration,
    /// Backoff and attempt cap.
    pub retry: RetryPolicy,
    /// Done results each shard caches.
    pub cache_capacity: usize,
    /// Messages each shard's mailbox holds.
    pub mailbox_capacity: usize,
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

/// Shutdown: mark every attempt still running on this shard `failed`, so senders' retries
/// can claim the keys at once instead of waiting for the leases. Answers how many.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct ReleaseLeases;

/// A key this shard is working on now.
struct InFlight {
    /// Tells this entry from a later one for the same key (see [`Shard::forget`]).
    token: u64,
    /// `None` while the claim is on its way to the store.
    attempts: Option<i32>,
    since: Instant,
    event: Arc<Event>,
    /// Requests for the same key that arrived while the claim was pending; they get the
    /// answer the claim's row implies instead of a blind 409.
    waiters: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
}

/// One shard.
pub struct Shard {
    index: usize,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    settings: Arc<ShardSettings>,
    workers: Vec<Addr<Worker>>,
    /// Deliveries sent to each worker and not yet answered; picks the least busy.
    outstanding: Vec<usize>,
    in_flight: HashMap<EventId, InFlight>,
    done: DoneWriter,
    next_token: u64,
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
            outstanding: vec![0; workers.len()],
            workers,
            in_flight: HashMap::new(),
            done: done.writer(settings.cache_capacity),
            settings,
            next_token: 0,
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

    /// Enters `event` in the in-flight set (replacing any stale entry for its key) and
    /// answers the token that tells this entry from later ones.
    fn track(&mut self, event: &Arc<Event>, attempts: Option<i32>) -> u64 {
        self.next_token += 1;
        let token = self.next_token;
        self.in_flight.insert(
            event.id.clone(),
            InFlight {
                token,
                attempts,
                since: Instant::now(),
                event: Arc::clone(event),
                waiters: Vec::new(),
            },
        );
        token
    }

    /// Drops the in-flight entry for `id` if it is still the one `token` created.
    fn forget(&mut self, id: &EventId, token: u64) {
        if self.in_flight.get(id).is_some_and(|e| e.token == token) {
            self.in_flight.remove(id);
        }
    }

    /// Labels one request with its path: the `webhook.claim` line and the metric.
    fn log_claim(&self, id: &EventId, path: Path, attempts: Option<i32>) {
        self.metrics.attempt(&id.provider, path);
        info!(self.log, "webhook.claim";
            "provider" => &*id.provider, "event_key" => &*id.key, "path" => path.as_str(),
            "attempts" => attempts);
    }

    /// The store answered the claim: answer it and every request that waited on it.
    fn claimed(
        &mut self,
        event: Arc<Event>,
        token: u64,
        reply: oneshot::Sender<Answer>,
        result: Result<ClaimResult, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let waiters = match self.in_flight.get_mut(&event.id) {
            Some(entry) if entry.token == token => std::mem::take(&mut entry.waiters),
            _ => Vec::new(),
        };
        match result {
            Ok(ClaimResult::Won { attempts, path }) => {
                self.log_claim(&event.id, path, Some(attempts));
                if let Some(entry) = self.in_flight.get_mut(&event.id) {
                    entry.attempts = Some(attempts);
                }
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
                self.deliver(event, token, attempts, path, reply, ctx);
            }
            Ok(ClaimResult::Existing(row)) => {
                self.forget(&event.id, token);
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    let answer = self.existing(&event, row.clone());
                    self.log_claim(&event.id, answer.path, answer.attempts);
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                self.forget(&event.id, token);
                self.metrics.store_error(e.kind());
                error!(self.log, "webhook.store_error";
                    "provider" => &*event.id.provider, "event_key" => &*event.id.key,
                    "error" => %e);
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    self.log_claim(&event.id, Path::StoreUnavailable, None);
                    let _ = reply.send(Answer::unclaimed(
                        Path::StoreUnavailable,
                        Reply::RetryLater {
                            retry_after: STORE_RETRY_AFTER_SECS,
                            reason: "store_unavailable",
                        },
                    ));
                }
            }
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
                None => Reply::RetryLater {
                    retry_after: 1,
                    reason: "result_missing",
                },
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

    fn pick_worker(&self) -> usize {
        (0..self.outstanding.len())
            .min_by_key(|&i| self.outstanding[i])
            .unwrap_or(0)
    }

    /// Hands a won claim to a worker, then records and answers its outcome.
    fn deliver(
        &mut self,
        event: Arc<Event>,
        token: u64,
        attempts: i32,
        path: Path,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        let worker = self.pick_worker();
        self.outstanding[worker] += 1;
        let request = DeliveryRequest {
            url: Arc::clone(&event.target.url),
            timeout: event.target.timeout,
            body: event.body.clone(),
            content_type: event.content_type.clone(),
            idempotency_key: event.id.header_value(),
            attempt: attempts,
        };
        let sent = self.workers[worker].send(Deliver(request));
        let store = Arc::clone(&self.store);
        let settings = Arc::clone(&self.settings);
        let ev = Arc::clone(&event);
        let started = Instant::now();
        let log = self.log.clone();
        let work = async move {
            let outcome = sent
                .await
                .unwrap_or_else(|e| DeliveryOutcome::Crashed(format!("worker unreachable: {e}")));
            let verdict = judge(outcome, attempts, &settings.retry, path == Path::Replay);
            // The lease was taken just before the delivery started; past it, another
            // attempt may hold the row and the write would be stale anyway.
            let deadline = started + settings.lease;
            let written =
                write_verdict_retrying(&*store, &ev, attempts, &verdict, deadline, &log).await;
            (verdict, written, started.elapsed())
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |(verdict, written, took), act, _ctx| {
                    act.outstanding[worker] -= 1;
                    act.forget(&event.id, token);
                    let answer = act.finished(&event, attempts, path, verdict, written, took);
                    let _ = reply.send(answer);
                }),
        );
    }
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
        let token = self.track(&event, None);
        let store = Arc::clone(&self.store);
        let lease = self.settings.lease;
        let ev = Arc::clone(&event);
        let claim = async move { store.claim(&ev.id, ev.fingerprint.as_deref(), lease).await };
        ctx.spawn(claim.into_actor(self).map(move |result, act, ctx| {
            act.claimed(event, token, reply, result, ctx);
        }));
    }
}
