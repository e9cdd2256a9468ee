//! Queue mode in a shard, a sender's side: the event is written with its payload and
//! answered 202 once durable. When a worker is idle and the provider's limits allow, the
//! same statement writes the row already taken for its first attempt, which starts at
//! once; otherwise the row is due and the node's scheduler takes it later (`taken.rs`). A
//! request whose key is a sync row (accepted before its provider moved to queue mode) is
//! handled as a sync one.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::actor::{Shard, MAX_WAITERS};
use super::answer::{
    cached_answer, mismatch_with, Answer, Reply, RetryReason, BUSY_RETRY_AFTER_SECS,
};
use super::attempt::Attempt;
use super::event::Event;
use super::slots::Pending;
use crate::claim::{Mode, Path};
use crate::store::{Enqueued, StoreError};

impl Shard {
    /// A sender's queue request: answered from memory, waiting on the write of its key on
    /// its way, handled as a sync request (its row is a sync row), or written — taken at
    /// once for its first attempt when a worker is free and the provider's limits allow.
    pub(super) fn enqueue(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        if let Some(entry) = self.in_flight.get_mut(&event.id) {
            if entry.attempts.is_none() && entry.waiters.len() < MAX_WAITERS {
                entry.waiters.push((event, reply));
                return;
            }
            if entry.event.mode == Mode::Sync {
                // A sync attempt of the key (a sync row's, or a replay's) is here: the
                // request is answered as a sync one (409), never 202 — no scheduler takes
                // a sync row.
                self.sync_redelivery(event, reply, ctx);
                return;
            }
        }
        if let Some(answer) = self.queued_from_memory(&event) {
            self.log_claim(&event, answer.path, answer.attempts);
            let _ = reply.send(answer);
            return;
        }
        if self.busy.draining() {
            let cause = "the node is shutting down";
            self.refuse(vec![(event, reply)], RetryReason::ShuttingDown, cause);
            return;
        }
        // A worker free now, and room under the provider's limits: the row is written
        // taken, and its first attempt starts as soon as it is durable.
        let worker = if self.gate.try_acquire(&event.id.provider) {
            let worker = self.admission.take_idle();
            if worker.is_none() {
                self.gate.release(&event.id.provider);
            }
            worker
        } else {
            None
        };
        let token = self.in_flight.begin(&event, None);
        let busy = self.busy.claiming();
        let store = Arc::clone(&self.store);
        let mut item = event.to_queue_row();
        item.start = worker.map(|_| self.settings.lease);
        let sent = Instant::now();
        let others = self.reserve_others(&event);
        let rows = others.rows.clone();
        let write = async move { store.enqueue_routed(&item, &rows).await };
        ctx.spawn(write.into_actor(self).map(move |result, act, ctx| {
            let written = result.as_ref().map_or(Vec::new(), |r| r.written.clone());
            let result = result.map(|r| r.answer);
            act.answer_enqueue(event, reply, token, worker.map(|w| (w, sent)), result, ctx);
            act.start_others(others, &written, sent, ctx);
            drop(busy);
        }));
    }

    /// A queue request answered from memory: an attempt of the key running here, or a done
    /// result in the cache. While the key's first enqueue is still on its way (an entry
    /// with no attempt, whose waiters are full), the row is not known durable: 409, as a
    /// sync request is answered — a 202 would tell the sender to stop, and the enqueue may
    /// yet fail.
    fn queued_from_memory(&self, event: &Event) -> Option<Answer> {
        if let Some(entry) = self.in_flight.get(&event.id) {
            if entry.attempts.is_none() {
                let busy = Answer {
                    path: Path::InProgressElsewhere,
                    attempts: None,
                    reply: Reply::Busy {
                        retry_after: BUSY_RETRY_AFTER_SECS,
                    },
                };
                return Some(mismatch_with(&self.log, event, &entry.event, None).unwrap_or(busy));
            }
            return Some(self.duplicate_queued(event, &entry.event, entry.attempts));
        }
        cached_answer(
            self.done.cache(),
            &event.id,
            event.fingerprint.as_deref(),
            &self.log,
        )
    }

    /// A redelivery of a key that is queued, failed or in progress: 202, nothing changes —
    /// or 422 when its payload differs from `stored`'s.
    fn duplicate_queued(&self, event: &Event, stored: &Event, attempts: Option<i32>) -> Answer {
        mismatch_with(&self.log, event, stored, attempts).unwrap_or(Answer {
            path: Path::DuplicateQueued,
            attempts,
            reply: Reply::Queued,
        })
    }

    /// The store wrote (or reported) the row: answer the request and those that waited on
    /// it; with a `worker` reserved (and the row written taken), start the first attempt.
    fn answer_enqueue(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        token: u64,
        worker: Option<(usize, Instant)>,
        result: Result<Enqueued, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let inserted = matches!(result, Ok(Enqueued::Inserted));
        let waiters = match worker {
            Some(_) if inserted => self.in_flight.won(&event, token, 1),
            _ => self.in_flight.forget(&event.id, token),
        };
        match result {
            Ok(Enqueued::Inserted) => {
                self.log_claim(&event, Path::Queued, None);
                let _ = reply.send(Answer {
                    path: Path::Queued,
                    attempts: None,
                    reply: Reply::Queued,
                });
                let attempts = worker.map(|_| 1);
                for (waiter, waiter_reply) in waiters {
                    let answer = self.duplicate_queued(&waiter, &event, attempts);
                    self.log_claim(&waiter, answer.path, answer.attempts);
                    let _ = waiter_reply.send(answer);
                }
                match worker {
                    Some((worker, sent)) => {
                        self.metrics.queue_taken(&event.id.provider);
                        let held = self.held_why(&event.id.provider);
                        let event = Arc::new(event.as_queued());
                        let lease = self.settings.lease;
                        let horizon = event.target.horizon;
                        let attempt = Attempt::held(event, 1, Path::FirstRun, sent, lease)
                            .renewed(lease, 1, horizon);
                        if held.is_none() {
                            self.log_won(&attempt);
                        }
                        match held {
                            // Paused while the row was written: given back unstarted.
                            Some(why) => {
                                self.release(attempt, Some(token), true, &why, ctx);
                                self.free_worker(worker, ctx);
                            }
                            None => {
                                let pending = Pending {
                                    attempt,
                                    token,
                                    gated: true,
                                };
                                self.run_pending(pending, worker, ctx);
                            }
                        }
                    }
                    // Due now: the scheduler takes it once a worker frees up.
                    None => self.signals.arrived(),
                }
            }
            // A sync row: each request is its sync attempt to make (or answered as a sync
            // request is), one claim for them all — the first claims, the rest wait on it.
            Ok(Enqueued::SyncRow(_)) => {
                self.give_back(worker.map(|(w, _)| w), &event, ctx);
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    self.sync_redelivery(event, reply, ctx);
                }
            }
            Ok(Enqueued::Existing(row)) => {
                self.give_back(worker.map(|(w, _)| w), &event, ctx);
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    // A queue row (the enqueue reports no other): as in sync mode for a done
                    // or dead row or another payload; 202 while hookgate delivers it.
                    let answer = self.answer_existing(&event, row.clone());
                    self.log_claim(&event, answer.path, answer.attempts);
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                self.give_back(worker.map(|(w, _)| w), &event, ctx);
                self.metrics.store_error(e.kind());
                let reason = match e {
                    StoreError::Busy(_) => RetryReason::StoreBusy,
                    _ => RetryReason::StoreUnavailable,
                };
                let requests = std::iter::once((event, reply)).chain(waiters).collect();
                self.refuse(requests, reason, &e.to_string());
            }
        }
    }

    /// A queue request for a key whose row is a sync row, handled as the sync request it
    /// is: 503 `paused` while its provider is paused (the sender keeps it), else claimed or
    /// answered as in sync mode. The provider's queue limits (`max_rate`, `max_in_flight`)
    /// do not count it, as they count no sync attempt.
    fn sync_redelivery(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        if self.gate.held(&event.id.provider) {
            let answer = Answer::paused(self.settings.paused_retry_after);
            self.log_claim(&event, answer.path, None);
            let _ = reply.send(answer);
            return;
        }
        self.ingest(Arc::new(event.as_sync()), reply, ctx);
    }

    /// A worker (and its provider's slot) reserved for an attempt that did not happen.
    fn give_back(&mut self, worker: Option<usize>, event: &Event, ctx: &mut Context<Self>) {
        if let Some(worker) = worker {
            self.gate.release(&event.id.provider);
            self.free_worker(worker, ctx);
        }
    }
}

impl Event {
    /// This event as a row to enqueue.
    fn to_queue_row(&self) -> crate::store::QueueRow {
        crate::store::QueueRow {
            id: self.id.clone(),
            fingerprint: self.fingerprint.clone(),
            payload: self.body.clone(),
            content_type: self.content_type.clone(),
            headers: super::record::kept_headers(self),
            keep_payload: self.target.keep_payload,
            start: None,
        }
    }

    /// This request as a sync one (its key's row is a sync row), headers and all.
    fn as_sync(&self) -> Self {
        Event {
            mode: Mode::Sync,
            filtered: false,
            ..self.clone()
        }
    }

    /// This event in queue mode, as its row holds it (the kept headers stay on the row).
    fn as_queued(&self) -> Self {
        Event {
            headers: Default::default(),
            mode: Mode::Queue,
            filtered: false,
            others: Vec::new(),
            ..self.clone()
        }
    }

    /// The event as its taken row holds it (the kept headers stay on the row).
    pub(super) fn with_row(
        &self,
        body: actix_web::web::Bytes,
        content_type: Option<String>,
        fingerprint: Option<String>,
    ) -> Self {
        Event {
            id: self.id.clone(),
            body,
            content_type,
            fingerprint,
            target: Arc::clone(&self.target),
            headers: Default::default(),
            mode: Mode::Queue,
            filtered: false,
            others: Vec::new(),
            fingerprinter: None,
            trace: None,
        }
    }
}
