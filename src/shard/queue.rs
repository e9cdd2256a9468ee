//! Queue mode in a shard: a sender's event is written with its payload and answered 202
//! once durable; its attempts are taken — at once after the 202, or later when the
//! scheduler offers the row — only when a worker is idle and the provider's limits allow,
//! through the same claim rule (the store's `take`), attempt, fencing and records as sync
//! mode. A queued attempt renews its lease while it runs; nobody waits on its answer.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::actor::{Shard, MAX_WAITERS};
use super::answer::{cached_answer, mismatch_with, Answer, Reply, RetryReason};
use super::attempt::Attempt;
use super::event::Event;
use super::messages::{Due, Enqueue};
use super::running::Running;
use crate::claim::{Path, RowState};
use crate::config::Mode;
use crate::deadline::after;
use crate::store::{Enqueued, StoreError, Taken};

impl Handler<Enqueue> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Enqueue, ctx: &mut Context<Self>) {
        self.metrics.mailbox(self.index, -1);
        let Enqueue { event, reply } = msg;
        if let Some(entry) = self.in_flight.get_mut(&event.id) {
            if entry.attempts.is_none() && entry.waiters.len() < MAX_WAITERS {
                entry.waiters.push((event, reply));
                return;
            }
        }
        if let Some(answer) = self.queued_from_memory(&event) {
            self.log_claim(&event, answer.path, answer.attempts);
            let _ = reply.send(answer);
            return;
        }
        if self.draining {
            let cause = "the node is shutting down";
            self.refuse(vec![(event, reply)], RetryReason::ShuttingDown, cause);
            return;
        }
        let token = self.in_flight.begin(&event, None);
        self.claiming += 1;
        let store = Arc::clone(&self.store);
        let item = event.to_queue_row();
        let write = async move { store.enqueue(&item).await };
        ctx.spawn(write.into_actor(self).map(move |result, act, ctx| {
            act.claiming -= 1;
            act.answer_enqueue(event, reply, token, result, ctx);
            act.notify_drained();
        }));
    }
}

impl Handler<Due> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Due, ctx: &mut Context<Self>) {
        self.metrics.mailbox(self.index, -1);
        let event = Arc::new(Event::bare(msg.id, msg.target).in_queue_mode());
        self.try_take(event, Some(msg.started), ctx);
    }
}

impl Shard {
    /// A queue request answered from memory: an attempt of the key running here, or a done
    /// result in the cache.
    fn queued_from_memory(&self, event: &Event) -> Option<Answer> {
        if let Some(entry) = self.in_flight.get(&event.id) {
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
    /// it, then start the first attempt at once if it may.
    fn answer_enqueue(
        &mut self,
        event: Arc<Event>,
        reply: oneshot::Sender<Answer>,
        token: u64,
        result: Result<Enqueued, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let waiters = self.in_flight.forget(&event.id, token);
        match result {
            Ok(Enqueued::Inserted) => {
                self.log_claim(&event, Path::Queued, None);
                let _ = reply.send(Answer {
                    path: Path::Queued,
                    attempts: None,
                    reply: Reply::Queued,
                });
                for (waiter, waiter_reply) in waiters {
                    let answer = self.duplicate_queued(&waiter, &event, None);
                    self.log_claim(&waiter, answer.path, answer.attempts);
                    let _ = waiter_reply.send(answer);
                }
                self.try_take(event, None, ctx);
            }
            Ok(Enqueued::Existing(row)) => {
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    let answer = self.answer_existing_queued(&event, row.clone());
                    self.log_claim(&event, answer.path, answer.attempts);
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
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

    /// The answer for a known key in queue mode: as in sync mode for a done or dead row or
    /// another payload; 202 `duplicate_queued` while hookgate still delivers it.
    fn answer_existing_queued(&mut self, event: &Event, row: RowState) -> Answer {
        let answer = self.answer_existing(event, row);
        match answer.path {
            Path::InProgressElsewhere => Answer {
                path: Path::DuplicateQueued,
                attempts: answer.attempts,
                reply: Reply::Queued,
            },
            _ => answer,
        }
    }

    /// Takes `event`'s row for an attempt if a worker is idle and the provider's limits
    /// allow; otherwise leaves it due for the scheduler. Nothing is claimed without a
    /// worker to start it. `started` (the scheduler's) is told whether an attempt started.
    pub(super) fn try_take(
        &mut self,
        event: Arc<Event>,
        started: Option<oneshot::Sender<bool>>,
        ctx: &mut Context<Self>,
    ) {
        let not_started = |started: Option<oneshot::Sender<bool>>| {
            if let Some(started) = started {
                let _ = started.send(false);
            }
        };
        if self.draining || self.in_flight.contains(&event.id) {
            return not_started(started);
        }
        let provider = Arc::clone(&event.id.provider);
        if !self.gate.try_acquire(&provider) {
            return not_started(started);
        }
        let Some(worker) = self.take_idle() else {
            self.gate.release(&provider);
            return not_started(started);
        };
        let token = self.in_flight.begin(&event, None);
        self.claiming += 1;
        let store = Arc::clone(&self.store);
        let lease = self.settings.lease;
        let id = event.id.clone();
        let sent = Instant::now();
        let take = async move { store.take(&id, lease).await };
        ctx.spawn(take.into_actor(self).map(move |result, act, ctx| {
            act.claiming -= 1;
            if let Some(started) = started {
                let _ = started.send(matches!(result, Ok(Some(_))));
            }
            act.answer_take(event, token, worker, sent, result, ctx);
            act.notify_drained();
        }));
    }

    /// The store answered a take: start the attempt, or give the worker and the provider's
    /// slot back.
    fn answer_take(
        &mut self,
        event: Arc<Event>,
        token: u64,
        worker: usize,
        sent: Instant,
        result: Result<Option<Taken>, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let taken = match result {
            Ok(Some(taken)) => taken,
            Ok(None) | Err(_) => {
                if let Err(e) = &result {
                    self.metrics.store_error(e.kind());
                    slog::warn!(self.log, "queue.take_failed";
                        "provider" => &*event.id.provider, "event_key" => &*event.id.key,
                        "error" => %e);
                }
                let waiters = self.in_flight.forget(&event.id, token);
                self.free_worker(worker, ctx);
                self.gate.release(&event.id.provider);
                for (waiter, reply) in waiters {
                    let _ = reply.send(self.duplicate_queued(&waiter, &event, None));
                }
                return;
            }
        };
        self.metrics.queue_taken(&event.id.provider);
        let event = Arc::new(event.with_row(taken.payload, taken.content_type, taken.fingerprint));
        self.log_claim(&event, taken.path, Some(taken.attempts));
        let waiters = self.in_flight.won(&event, token, taken.attempts);
        for (waiter, reply) in waiters {
            let _ = reply.send(self.duplicate_queued(&waiter, &event, Some(taken.attempts)));
        }
        let lease = self.settings.lease;
        let horizon_left = event.target.horizon.saturating_sub(taken.age);
        let attempt = Attempt::held(event, taken.attempts, taken.path, after(sent, lease)).renewed(
            lease,
            taken.tries,
            horizon_left,
        );
        let running = Running {
            attempt,
            token,
            worker,
            gated: true,
        };
        // Nobody waits on a queued attempt's answer; it is logged and counted.
        let (reply, _) = oneshot::channel();
        self.start(running, reply, ctx);
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
        }
    }

    /// This (bare) event in queue mode.
    fn in_queue_mode(mut self) -> Self {
        self.mode = Mode::Queue;
        self
    }

    /// The event as its taken row holds it (the kept headers stay on the row).
    fn with_row(
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
        }
    }
}
