//! An operator's replay of a dead letter in its shard: a worker is taken before the row is
//! reopened, and the reopened row runs as an [`Attempt`] like a sender's delivery (joining
//! `claimed.rs` at [`Shard::run_on_worker`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::actor::Shard;
use super::answer::{Answer, Reply, RetryReason};
use super::attempt::{ceil_secs, Attempt};
use super::event::{Event, Traced};
use super::gate::Hold;
use super::messages::Replay;
use super::slots::Running;
use crate::claim::Path;
use crate::key::EventId;
use crate::provider::Target;
use crate::store::{Reopened, StoreError};

/// The answer to a replay of a row that is not a dead letter (or is being replayed).
fn not_replayable() -> Answer {
    Answer {
        path: Path::Replay,
        attempts: None,
        reply: Reply::NotReplayable,
    }
}

/// A replay on its way to the store.
struct Reopening {
    id: EventId,
    target: Arc<Target>,
    reply: oneshot::Sender<Answer>,
    token: u64,
    worker: usize,
    sent: Instant,
}

impl Shard {
    /// An operator's replay of a dead letter: a worker is taken before the row is reopened;
    /// refused while the key is in flight here, the node drains or the provider is held.
    pub(super) fn replay(&mut self, msg: Replay, ctx: &mut Context<Self>) {
        let Replay { id, target, reply } = msg;
        if self.in_flight.contains(&id) {
            let _ = reply.send(not_replayable());
            return;
        }
        if self.busy.draining() {
            let _ = reply.send(Answer::refused(RetryReason::ShuttingDown));
            return;
        }
        // A replay is a delivery like any other: held while its provider is.
        if let Some(hold) = self.gate.hold_of(&id.provider) {
            let retry_after = match hold {
                Hold::Operator => self.settings.paused_retry_after,
                Hold::Target(left) => ceil_secs(left),
            };
            let _ = reply.send(Answer::paused(retry_after));
            return;
        }
        let Some(worker) = self.admission.take_idle() else {
            let _ = reply.send(Answer::refused(RetryReason::Overloaded));
            return;
        };
        // In flight from now on: a concurrent replay of the key is refused at once, and a
        // sender's delivery waits on this one's answer.
        let token = self.in_flight.begin(
            &Arc::new(Event::bare(id.clone(), Arc::clone(&target))),
            None,
        );
        // Trusted however old, from the start: a reopen held up past a lease must not let
        // a sender's request replace the entry, and once won the replay renews its lease.
        self.in_flight.renews(&id, token);
        let busy = self.busy.claiming();
        let store = Arc::clone(&self.store);
        let lease = self.settings.lease;
        let key = id.clone();
        let reopening = Reopening {
            id,
            target,
            reply,
            token,
            worker,
            sent: Instant::now(),
        };
        let reopen = async move { store.replay(&key, lease).await };
        ctx.spawn(reopen.into_actor(self).map(move |reopened, act, ctx| {
            act.answer_replay(reopening, reopened, ctx);
            drop(busy);
        }));
    }

    /// The store answered a replay: run it as an attempt, or say why there is none.
    fn answer_replay(
        &mut self,
        r: Reopening,
        reopened: Result<Option<Reopened>, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        match reopened {
            Ok(Some(row)) => {
                let event = Arc::new(Event {
                    id: r.id,
                    body: row.payload,
                    content_type: row.content_type,
                    fingerprint: row.fingerprint,
                    target: r.target,
                    headers: Default::default(),
                    mode: row.mode,
                    filtered: false,
                    others: Vec::new(),
                    fingerprinter: None,
                    // An operator's replay starts a trace of its own.
                    trace: self.settings.tracer.as_ref().map(Traced::root),
                });
                let waiters = self.in_flight.won(&event, r.token, row.attempts);
                let lease = self.settings.lease;
                let attempt = replay_attempt(Arc::clone(&event), row.attempts, r.sent, lease);
                self.log_won(&attempt);
                self.answer_waiters_of_won(&event, row.attempts, waiters);
                let running = Running {
                    attempt,
                    token: r.token,
                    worker: r.worker,
                    gated: false,
                };
                self.run_on_worker(running, r.reply, ctx);
            }
            Ok(None) => {
                let waiters = self.in_flight.forget(&r.id, r.token);
                self.free_worker(r.worker, ctx);
                let _ = r.reply.send(not_replayable());
                // Senders' deliveries that waited on this replay ask again shortly.
                let cause = "waited on a replay that found no dead letter";
                self.refuse(waiters, RetryReason::Overloaded, cause);
            }
            Err(e) => {
                let waiters = self.in_flight.forget(&r.id, r.token);
                self.free_worker(r.worker, ctx);
                self.metrics.store_error(e.kind());
                let event = Arc::new(Event::bare(r.id, r.target));
                let requests = std::iter::once((event, r.reply)).chain(waiters).collect();
                self.refuse(requests, RetryReason::StoreUnavailable, &e.to_string());
            }
        }
    }
}

/// The attempt of a reopened dead letter, in either mode: it renews its lease while it
/// runs, as queue deliveries do. No sender waits on a replay, and the target it goes to is
/// the provider's today — whose timeout may be longer than the lease, where the provider
/// is now in queue mode — so it may outlast the lease, and no scheduler or sender's claim
/// takes the row meanwhile.
pub fn replay_attempt(event: Arc<Event>, attempts: i32, sent: Instant, lease: Duration) -> Attempt {
    Attempt::held(event, attempts, Path::Replay, sent, lease).renewed(
        lease,
        attempts,
        Duration::MAX,
    )
}
