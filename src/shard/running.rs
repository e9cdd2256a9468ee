//! A shard's running attempts: the won claim goes to the worker reserved for it before the
//! claim (or, once the node is draining, is released without reaching the target); its
//! outcome is recorded through [`Attempt`]; then the shard gives the worker back, forgets
//! the key, caches a done result and answers.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::actor::Shard;
use super::answer::{Answer, Reply};
use super::cache::CachedDone;
use super::slots::Running;
use crate::outcome::{DeliveryOutcome, Verdict};
use crate::worker::Deliver;

impl Shard {
    /// A won claim: delivered, or released without reaching the target once the node is
    /// draining.
    pub(super) fn start(
        &mut self,
        running: Running,
        reply: oneshot::Sender<Answer>,
        ctx: &mut Context<Self>,
    ) {
        if self.busy.draining() {
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
        let log = self.log.clone();
        let attempt = running.attempt.clone();
        let work = async move { attempt.run(outcome, &*store, &settings.retry, &log).await };
        ctx.spawn(work.into_actor(self).map(move |recorded, act, ctx| {
            let attempt = running.attempt;
            let provider = &attempt.event.id.provider;
            if running.gated {
                act.gate.release(provider);
            }
            if let Verdict::Throttled { retry_after, .. } = recorded.verdict {
                // The event itself waits `retry_after`; the provider, a bounded part of it.
                let pause = Duration::from_secs(retry_after).min(act.settings.max_target_pause);
                act.gate.pause(provider, pause);
            }
            act.in_flight.forget(&attempt.event.id, running.token);
            act.free_worker(running.worker, ctx);
            let answer = attempt.answer(recorded, act.settings.lease, &act.metrics, &act.log);
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
}
