//! Rows the node's scheduler took for this shard ([`Start`]), many rows in one statement:
//! each starts on an idle worker, or waits in the shard for one at most until its lease
//! would no longer cover a start, and is released (`failed`, due again at once, not
//! counted) past that — or at once, when its key is in flight here, its provider is held
//! or the node drains. Every attempt runs through the same attempt, fencing and records as
//! sync mode, renews its lease while it runs, and nobody waits on its answer.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::actor::Shard;
use super::attempt::Attempt;
use super::event::{Event, Traced};
use super::messages::Start;
use super::record::write_verdict_retrying;
use super::slots::{Pending, Running};
use crate::outcome::Verdict;
use crate::provider::Target;
use crate::store::{History, Store, Taken};

impl Shard {
    /// A row the scheduler took for this shard: started on an idle worker, or waiting for
    /// one, or given back unstarted (its key in flight here, its provider held, the node
    /// draining).
    pub(super) fn start_taken(&mut self, msg: Start, ctx: &mut Context<Self>) {
        let Start {
            taken,
            target,
            sent,
            hold,
        } = msg;
        // The scheduler reserved one of the provider's gate slots for the row.
        let gated = true;
        let event = self.taken_event(&taken, target);
        self.metrics.queue_taken(&event.id.provider);
        let attempt = self.queue_attempt(Arc::clone(&event), &taken, sent);
        if self.in_flight.contains(&event.id) {
            // Another attempt of this key is still running or being recorded here: this one
            // must not open a second at the target. Released, due again at once, not
            // counted; the entry stays the running attempt's. A safety net: the scheduler
            // skips the keys in flight here when its pass starts, and a key entered after
            // that holds a fresh lease, which no take overtakes.
            self.release(
                attempt,
                None,
                gated,
                "the key was in flight on this node",
                ctx,
            );
            return;
        }
        if let Some(why) = self.held_why(&event.id.provider) {
            // Paused after the scheduler's take: given back unstarted.
            self.release(attempt, None, gated, &why, ctx);
            return;
        }
        self.log_won(&attempt);
        let token = self.in_flight.begin(&event, Some(taken.attempts));
        // The entry holds the key from here on.
        drop(hold);
        let pending = Pending {
            attempt,
            token,
            gated,
        };
        match self.admission.take_idle() {
            Some(worker) => self.run_pending(pending, worker, ctx),
            None if self.busy.draining() => {
                let why = "released at shutdown";
                self.release(pending.attempt, Some(token), gated, why, ctx);
            }
            // A worker of this shard frees up soon (see `free_worker`).
            None => self.admission.hold(pending),
        }
    }

    /// The event a taken row holds; with tracing on, its attempts continue the trace its
    /// row keeps (or start one).
    pub(super) fn taken_event(&self, taken: &Taken, target: Arc<Target>) -> Arc<Event> {
        let mut event = Event::bare(taken.id.clone(), target).with_row(
            taken.payload.clone(),
            taken.content_type.clone(),
            taken.fingerprint.clone(),
        );
        if let Some(tracer) = &self.settings.tracer {
            event.trace = Some(Traced::from_kept(tracer, taken.trace_headers.as_deref()));
        }
        Arc::new(event)
    }

    /// Why `provider`'s deliveries may not start now, if they may not: an operator's pause,
    /// or the one its target asked for. A row taken for it is given back unstarted.
    pub(super) fn held_why(&self, provider: &str) -> Option<String> {
        let hold = self.gate.hold_of(provider)?;
        Some(format!("held: {}", hold.describe()))
    }

    /// The attempt a taken row is, its lease counted from `sent` (just before the take).
    pub(super) fn queue_attempt(&self, event: Arc<Event>, taken: &Taken, sent: Instant) -> Attempt {
        let lease = self.settings.lease;
        let horizon_left = event.target.horizon.saturating_sub(taken.age);
        let mut attempt = Attempt::held(event, taken.attempts, taken.path, sent, lease).renewed(
            lease,
            taken.tries,
            horizon_left,
        );
        attempt.unreadable = taken.unreadable.clone();
        attempt
    }

    /// Starts a taken row on `worker`, unless its lease no longer covers a start: then it
    /// is released and the worker goes to the next.
    pub(super) fn run_pending(&mut self, pending: Pending, worker: usize, ctx: &mut Context<Self>) {
        let Pending {
            attempt,
            token,
            gated,
        } = pending;
        let running = Running {
            attempt,
            token,
            worker,
            gated,
        };
        // Nobody waits on a queued attempt's answer; it is logged and counted.
        let (reply, _) = oneshot::channel();
        self.run_on_worker(running, reply, ctx);
    }

    /// The next taken row waiting for a worker that can still start in time; the rows whose
    /// lease ran too short meanwhile are released on the way.
    pub(super) fn next_pending(&mut self, ctx: &mut Context<Self>) -> Option<Pending> {
        while let Some(pending) = self.admission.next_pending() {
            let held = self.held_why(&pending.attempt.event.id.provider);
            if Instant::now() < pending.attempt.start_by()
                && !self.busy.draining()
                && held.is_none()
            {
                return Some(pending);
            }
            let why = match held {
                _ if self.busy.draining() => "released at shutdown".to_owned(),
                Some(why) => why,
                None => "no worker of this node freed up before its lease ran short".to_owned(),
            };
            let token = Some(pending.token);
            self.release(pending.attempt, token, pending.gated, &why, ctx);
        }
        None
    }

    /// Gives a taken row back without delivering it: `failed`, due again at once, not
    /// counted against the attempts (fenced, written however long the store takes); then
    /// forgets the in-flight entry `token` made, if it made one.
    pub(super) fn release(
        &mut self,
        attempt: Attempt,
        token: Option<u64>,
        gated: bool,
        why: &str,
        ctx: &mut Context<Self>,
    ) {
        let busy = self.busy.running();
        let store = Arc::clone(&self.store);
        let log = self.log.clone();
        let verdict = Verdict::Release { error: why.into() };
        let work = async move {
            let history = attempt.released(&verdict);
            write_verdict_retrying(
                &*store,
                &attempt.event,
                attempt.attempts,
                &verdict,
                history.as_ref(),
                None,
                &log,
            )
            .await;
            attempt
        };
        ctx.spawn(work.into_actor(self).map(move |attempt, act, _| {
            if gated {
                act.gate.release(&attempt.event.id.provider);
            }
            if let Some(token) = token {
                act.in_flight.forget(&attempt.event.id, token);
            }
            act.metrics.released(&attempt.event.id.provider);
            drop(busy);
        }));
    }
}

/// Gives back a row the scheduler took but could not hand to its shard (the mailbox was
/// full, or the shard is gone): `failed`, due again at once, not counted, fenced.
pub async fn release_taken(store: &dyn Store, start: Start, why: &str, log: &slog::Logger) {
    let event = Event::bare(start.taken.id.clone(), start.target).with_row(
        start.taken.payload,
        start.taken.content_type,
        start.taken.fingerprint,
    );
    let verdict = Verdict::Release { error: why.into() };
    let history = History {
        path: start.taken.path,
        node: crate::node::name(),
        outcome: "released",
        took: start.sent.elapsed(),
        target_status: None,
        error: None,
        answer: None,
    };
    write_verdict_retrying(
        store,
        &event,
        start.taken.attempts,
        &verdict,
        Some(&history),
        None,
        log,
    )
    .await;
}
