//! A sender's sync request in its shard, up to its claim: answered from memory when it can
//! be (a key in the in-flight set is `in_progress_elsewhere`, a key in the done cache is
//! `duplicate_done`), or waiting on a claim of its key already on its way, or admitted: a
//! worker is reserved *before* the claim is sent (or the request waits for one, bounded,
//! with nothing claimed, or is refused), so a won claim never waits while its lease runs.
//! The store's answer is `claimed.rs`'s.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::actor::{Shard, MAX_WAITERS};
use super::answer::{cached_answer, mismatch_with, Answer, Reply, RetryReason};
use super::attempt::ceil_secs;
use super::event::Event;
use super::slots::{Claiming, Waiting};
use crate::claim::{Mode, Path};
use crate::store::Kept;

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
        if let Some(worker) = self.admission.take_idle() {
            self.claim(event, reply, token, worker, ctx);
        } else {
            let until = crate::deadline::from_now(self.settings.admission_wait);
            match self.admission.wait(
                Waiting {
                    event,
                    reply,
                    token,
                },
                until,
            ) {
                Ok(set_timer) => {
                    self.metrics.admission_waiting(self.index, 1);
                    if set_timer {
                        ctx.run_later(self.settings.admission_wait, Self::expire_waits);
                    }
                }
                Err(w) => {
                    let waiters = self.in_flight.forget(&w.event.id, w.token);
                    let cause = format!(
                        "all {} workers busy and {} requests waiting",
                        self.workers.len(),
                        self.admission.waiting()
                    );
                    let requests = std::iter::once((w.event, w.reply)).chain(waiters).collect();
                    self.refuse(requests, RetryReason::Overloaded, &cause);
                }
            }
        }
    }

    /// Refuses the waiting requests whose `admission_wait` ran out before a worker freed
    /// up, then sets the timer again for the oldest one left. One timer per shard, not one
    /// per request: an actor's context polls every timer it holds whenever it wakes, and a
    /// timer per waiting request (each living the whole wait) cost more CPU at 6k first
    /// runs a second than any other part of the shard.
    fn expire_waits(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let (expired, next) = self.admission.expire(now);
        if !expired.is_empty() {
            let cause = format!(
                "no worker freed up within {} ms",
                self.settings.admission_wait.as_millis()
            );
            for w in expired {
                self.refuse_waiting(w, RetryReason::Overloaded, &cause);
            }
        }
        if let Some(next) = next {
            ctx.run_later(next - now, Self::expire_waits);
        }
    }

    /// Refuses a request taken off the waiting queue, and every request that waited on its
    /// key; nothing was claimed for any of them.
    pub(super) fn refuse_waiting(&mut self, w: Waiting, reason: RetryReason, cause: &str) {
        let requests = self.unwait(w);
        self.refuse(requests, reason, cause);
    }

    /// Answers a request taken off the waiting queue, and every request that waited on its
    /// key, 503 `paused`: its provider was paused while it waited; nothing was claimed.
    pub(super) fn hold_waiting(&mut self, w: Waiting) {
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
    pub(super) fn claim(
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
        // The other routes' rows commit with the claim that writes the event's row, before
        // its attempt starts.
        let others = self.reserve_others(&ev);
        let rows = others.rows.clone();
        // A new row is the event's record: claimed `filtered` when the main route's filter
        // refused this, its first delivery. A redelivery's filter decides nothing.
        let first = if ev.filtered {
            Path::Filtered
        } else {
            Path::FirstRun
        };
        let claim = async move {
            store
                .claim_routed(
                    &ev.id,
                    ev.fingerprint.as_deref(),
                    lease,
                    keep.as_ref(),
                    first,
                    &rows,
                )
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
            let written = result.as_ref().map_or(Vec::new(), |r| r.written.clone());
            act.answer_claim(claiming, result.map(|r| r.answer), ctx);
            act.start_others(others, &written, sent, ctx);
            drop(busy);
        }));
    }
}
