//! The shard's operator-facing messages: replaying a dead letter, and the two steps of a
//! graceful shutdown. A replay goes through the same worker reservation, delivery and
//! fenced write as a sender's delivery.

use std::sync::Arc;

use actix::prelude::*;
use actix_web::http::header::HeaderMap;
use tokio::sync::oneshot;

use super::{Answer, Attempt, Drain, Drained, Event, Replay, Reply, Shard};
use crate::claim::Path;

impl Handler<Replay> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Replay, ctx: &mut Context<Self>) {
        let Replay { id, target, reply } = msg;
        let refused = || Answer {
            path: Path::Replay,
            attempts: None,
            reply: Reply::NotReplayable,
        };
        if self.in_flight.contains(&id) {
            let _ = reply.send(refused());
            return;
        }
        let busy = |reason| {
            Answer::unclaimed(
                Path::Overloaded,
                Reply::RetryLater {
                    retry_after: super::OVERLOADED_RETRY_AFTER_SECS,
                    reason,
                },
            )
        };
        if self.draining {
            let _ = reply.send(busy("shutting_down"));
            return;
        }
        let Some(worker) = self.idle.pop() else {
            let _ = reply.send(busy("overloaded"));
            return;
        };
        // In flight from now on: a concurrent replay of the key is refused at once, and a
        // sender's delivery waits on this one's answer.
        let token = self.in_flight.begin(
            &Arc::new(Event::bare(id.clone(), Arc::clone(&target))),
            None,
        );
        self.claiming += 1;
        let store = Arc::clone(&self.store);
        let lease = self.settings.lease;
        let key = id.clone();
        let sent = std::time::Instant::now();
        let reopen = async move { store.replay(&key, lease).await };
        ctx.spawn(reopen.into_actor(self).map(move |reopened, act, ctx| {
            act.claiming -= 1;
            match reopened {
                Ok(Some(reopened)) => {
                    let event = Arc::new(Event {
                        id,
                        body: reopened.payload,
                        content_type: reopened.content_type,
                        fingerprint: reopened.fingerprint,
                        target,
                        headers: HeaderMap::new(),
                    });
                    let waiters = act.in_flight.won(&event.id, token, reopened.attempts);
                    act.log_claim(&event.id, Path::Replay, Some(reopened.attempts));
                    act.answer_waiters_of_won(&event, reopened.attempts, waiters);
                    let attempt = Attempt {
                        event,
                        token,
                        attempts: reopened.attempts,
                        path: Path::Replay,
                        worker,
                        lease_ends: sent + act.settings.lease,
                    };
                    act.start(attempt, reply, ctx);
                }
                Ok(None) => {
                    let waiters = act.in_flight.forget(&id, token);
                    act.free_worker(worker, ctx);
                    let _ = reply.send(refused());
                    // Senders' deliveries that waited on this replay ask again shortly.
                    let cause = "waited on a replay that found no dead letter";
                    act.refuse(waiters, Path::Overloaded, "overloaded", cause);
                }
                Err(e) => {
                    let waiters = act.in_flight.forget(&id, token);
                    act.free_worker(worker, ctx);
                    act.metrics.store_error(e.kind());
                    let event = Arc::new(Event::bare(id, target));
                    let requests = std::iter::once((event, reply)).chain(waiters).collect();
                    act.refuse(
                        requests,
                        Path::StoreUnavailable,
                        "store_unavailable",
                        &e.to_string(),
                    );
                }
            }
            act.notify_drained();
        }));
    }
}

impl Handler<Drain> for Shard {
    type Result = ();

    fn handle(&mut self, _msg: Drain, _ctx: &mut Context<Self>) {
        self.draining = true;
        while let Some(w) = self.waiting.pop_front() {
            self.metrics.admission_waiting(self.index, -1);
            let waiters = self.in_flight.forget(&w.event.id, w.token);
            let requests = std::iter::once((w.event, w.reply)).chain(waiters).collect();
            self.refuse(
                requests,
                Path::Overloaded,
                "shutting_down",
                "the node is shutting down",
            );
        }
        self.notify_drained();
    }
}

impl Handler<Drained> for Shard {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _msg: Drained, _ctx: &mut Context<Self>) -> Self::Result {
        let (done, finished) = oneshot::channel();
        self.drained.push(done);
        self.notify_drained();
        Box::pin(async move {
            let _ = finished.await;
        })
    }
}
