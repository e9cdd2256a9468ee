//! What a shard does once the store has answered a claim: a won claim's attempt runs on the
//! worker reserved for it (or, once the node is draining, is released without reaching the
//! target), its outcome is recorded through [`Attempt`], and then the shard gives the
//! worker to the next request or row, forgets the key, caches a done result and answers.
//! A row the claim did not win is answered as it stands (and a done result cached); a
//! store failure frees the worker and refuses, nothing claimed. Every request that waited
//! on the same key gets the answer the row implies. Queue rows and replays join here too,
//! at [`Shard::run_on_worker`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use slog::info;
use tokio::sync::oneshot;

use super::actor::Shard;
use super::answer::{
    across, log_mismatch, log_refusal, mismatch_with, Across, Answer, Reply, RetryReason,
};
use super::attempt::{ceil_secs, Attempt};
use super::cache::CachedDone;
use super::event::Event;
use super::ramp::Report;
use super::slots::{Claiming, Running};
use crate::claim::{classify, ClaimResult, Path, RowState};
use crate::outcome::{DeliveryOutcome, Verdict};
use crate::store::StoreError;
use crate::worker::Deliver;

impl Shard {
    /// The store answered the claim: answer it and every request that waited on it.
    pub(super) fn answer_claim(
        &mut self,
        claiming: Claiming,
        result: Result<ClaimResult, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let Claiming {
            event,
            reply,
            token,
            worker,
            sent,
        } = claiming;
        match result {
            Ok(ClaimResult::Won { attempts, path }) => {
                // A filtered event wins its claim like any other, so it is recorded once
                // and its redeliveries are duplicates; its attempt delivers nothing. The
                // row says so (`path`), not this delivery's headers: a retry of an event
                // its main route has is delivered there whatever its filter says now.
                let lease = self.settings.lease;
                let mut attempt = Attempt::held(Arc::clone(&event), attempts, path, sent, lease);
                self.log_won(&attempt);
                let waiters = self.in_flight.won(&event, token, attempts);
                self.answer_waiters_of_won(&event, attempts, waiters);
                if attempt.event.target.timeout >= lease {
                    // Only a queue-mode provider's target may take that long (a sync row
                    // redelivered after its provider moved to queue mode): the attempt
                    // renews its lease, as a queue one does, and its entry is trusted.
                    attempt = attempt.renewed(lease, attempts, Duration::MAX);
                    self.in_flight.renews(&attempt.event.id, token);
                }
                let running = Running {
                    attempt,
                    token,
                    worker,
                    gated: false,
                };
                self.run_on_worker(running, reply, ctx);
            }
            Ok(ClaimResult::Existing(row)) => {
                if row.claimable() {
                    if let Some(Across::Same(fingerprint)) =
                        across(&event, row.fingerprint.as_deref())
                    {
                        // The same payload, fingerprinted under another key (or none)
                        // than the row's: claimed again with the row's kind of it. The
                        // statement never takes a row over across kinds.
                        let event = Arc::new(Event {
                            fingerprint: Some(fingerprint),
                            ..(*event).clone()
                        });
                        self.claim(event, reply, token, worker, ctx);
                        return;
                    }
                }
                let waiters = self.in_flight.forget(&event.id, token);
                self.free_worker(worker, ctx);
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    let answer = self.answer_existing(&event, row.clone());
                    self.log_claim(&event, answer.path, answer.attempts);
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                let waiters = self.in_flight.forget(&event.id, token);
                self.free_worker(worker, ctx);
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

    /// A won claim: delivered; recorded done without reaching the target when its row says
    /// the main route's filter did not accept the event (path `filtered`); a dead letter
    /// `unreadable` when its kept body did not open; or released without reaching the target once the node is draining.
    pub(super) fn run_on_worker(
        &mut self,
        running: Running,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        if let Some(why) = &running.attempt.unreadable {
            // Taken, but its body did not open: ended as a dead letter, never delivered.
            self.metrics.store_error("sealed");
            let unreadable = DeliveryOutcome::Unreadable(why.clone());
            self.record(running, reply, ctx, async move { unreadable });
        } else if running.attempt.path == Path::Filtered {
            let routed = !running.attempt.event.others.is_empty();
            let filtered = async move { DeliveryOutcome::Filtered { routed } };
            self.record(running, reply, ctx, filtered);
        } else if self.busy.draining() {
            let released = async { DeliveryOutcome::NotStarted("released at shutdown".into()) };
            self.record(running, reply, ctx, released);
        } else {
            // A renewed attempt may hang up: dropping its outcome future drops `hang_up`,
            // and the worker closes the target's connection.
            let (hang_up, hung_up) = oneshot::channel::<()>();
            let deliver = Deliver {
                request: running.attempt.request(),
                start_by: running.attempt.start_by(),
                hang_up: running.attempt.renew.map(|_| hung_up),
            };
            let sent = self.workers[running.worker].send(deliver);
            self.record(running, reply, ctx, async move {
                let _hang_up = hang_up;
                sent.await.unwrap_or_else(|e| {
                    DeliveryOutcome::Crashed(format!("worker unreachable: {e}"))
                })
            });
        }
    }

    /// Runs the attempt on `outcome`, then frees its worker and key and answers.
    fn record(
        &mut self,
        running: Running,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
        outcome: impl Future<Output = DeliveryOutcome> + 'static,
    ) {
        let busy = self.busy.running();
        let store = Arc::clone(&self.store);
        let settings = Arc::clone(&self.settings);
        let log = running.attempt.log(&self.log);
        let attempt = running.attempt.clone();
        let attempt_log = log.clone();
        let work = async move {
            attempt
                .run(outcome, &*store, &settings.retry, &attempt_log)
                .await
        };
        ctx.spawn(work.into_actor(self).map(move |recorded, act, ctx| {
            let attempt = running.attempt;
            let provider = &attempt.event.id.provider;
            if running.gated {
                act.gate.release(provider);
                // What the delivery says of its target moves the ramp after a pause.
                let (first_backoff, most) =
                    (act.settings.retry.delay(1), act.settings.max_target_pause);
                let report = Report::of(&recorded.verdict, first_backoff, most);
                act.gate.report(provider, report);
            }
            if let Verdict::Throttled { retry_after, .. } = recorded.verdict {
                // The event itself waits `retry_after`; the provider, a bounded part of it.
                let pause = Duration::from_secs(retry_after).min(act.settings.max_target_pause);
                act.gate.pause(provider, pause);
            }
            act.in_flight.forget(&attempt.event.id, running.token);
            act.free_worker(running.worker, ctx);
            let answer = attempt.answer(recorded, act.settings.lease, &act.metrics, &log);
            if let Reply::Result(result) = &answer.reply {
                act.done.insert(
                    attempt.event.id.clone(),
                    CachedDone {
                        attempts: attempt.attempts,
                        fingerprint: attempt.event.fingerprint.clone(),
                        result: Arc::clone(result),
                    },
                );
            }
            let _ = reply.send(answer);
            drop(busy);
        }));
    }

    /// Requests that waited on a claim that was won: the key is now in progress (409), or
    /// they carry another payload (422).
    pub(super) fn answer_waiters_of_won(
        &self,
        event: &Event,
        attempts: i32,
        waiters: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
    ) {
        let retry_after = ceil_secs(self.settings.lease);
        for (waiter, waiter_reply) in waiters {
            let answer =
                mismatch_with(&self.log, &waiter, event, Some(attempts)).unwrap_or(Answer {
                    path: Path::InProgressElsewhere,
                    attempts: Some(attempts),
                    reply: Reply::Busy { retry_after },
                });
            self.log_claim(&waiter, answer.path, answer.attempts);
            let _ = waiter_reply.send(answer);
        }
    }

    /// The answer for a row the claim did not win; caches it when it is done.
    pub(super) fn answer_existing(&mut self, event: &Event, row: RowState) -> Answer {
        let path = match across(event, row.fingerprint.as_deref()) {
            // Fingerprinted again under the row's kind: another payload is a mismatch
            // whatever the row's state; one that cannot be compared (the row's key is
            // gone) never takes a row over unchecked.
            Some(Across::Differs) => Path::PayloadMismatch,
            Some(Across::Unknown(why)) if row.claimable() => {
                slog::warn!(self.log, "webhook.payload_mismatch";
                    "provider" => &*event.id.provider, "event_key" => &*event.id.key,
                    "stored_fingerprint" => row.fingerprint.as_deref(),
                    "incoming_fingerprint" => event.fingerprint.as_deref(),
                    "error" => why);
                let attempts = Some(row.attempts);
                return Answer {
                    path: Path::PayloadMismatch,
                    attempts,
                    reply: Reply::Mismatch,
                };
            }
            Some(Across::Same(fingerprint)) => classify(&row, Some(&fingerprint)),
            _ => classify(&row, event.fingerprint.as_deref()),
        };
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
                    let answer = Answer {
                        path,
                        attempts,
                        reply: Reply::RetryLater {
                            retry_after: 1,
                            reason: RetryReason::ResultMissing,
                        },
                    };
                    let cause = "a done row without its result";
                    log_refusal(&self.log, &event.id, &answer, cause);
                    return answer;
                }
            },
            Path::DuplicateDead => Reply::DeadLettered,
            Path::DuplicateQueued => Reply::Queued,
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

    /// Gives `worker` to the oldest waiting request (a sender waits on it), else to the
    /// oldest queue row taken for this shard, else back to the idle set — and then tells the
    /// scheduler a worker is free.
    pub(super) fn free_worker(&mut self, worker: usize, ctx: &mut Context<Self>) {
        // While draining nothing waits (`Drain` refused the queue) and nothing is claimed.
        while !self.busy.draining() {
            let Some(w) = self.admission.next_waiting() else {
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
            self.run_pending(pending, worker, ctx);
            return;
        }
        self.admission.park(worker);
        self.signals.freed();
    }

    /// Labels one request with its path: the `webhook.claim` line and the metric. With
    /// tracing on, the line carries the ids of the span it belongs to (the request's).
    pub(super) fn log_claim(&self, event: &Event, path: Path, attempts: Option<i32>) {
        match &event.trace {
            None => self.claim_line(&self.log, event, path, attempts),
            Some(traced) => {
                let log = self.log.new(slog::o!(
                    "trace_id" => hex::encode(traced.parent.trace_id),
                    "span_id" => hex::encode(traced.parent.span_id)));
                self.claim_line(&log, event, path, attempts);
            }
        }
    }

    /// The `webhook.claim` line of a won claim (or a taken row): with tracing on, it
    /// carries its attempt's span.
    pub(super) fn log_won(&self, attempt: &Attempt) {
        let log = attempt.log(&self.log);
        self.claim_line(&log, &attempt.event, attempt.path, Some(attempt.attempts));
    }

    fn claim_line(&self, log: &slog::Logger, event: &Event, path: Path, attempts: Option<i32>) {
        let id = &event.id;
        self.metrics.attempt(&id.provider, path);
        info!(log, "webhook.claim";
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
}
