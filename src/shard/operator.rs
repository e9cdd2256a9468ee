//! The shard's operator-facing messages: replaying a dead letter, and releasing leases at
//! shutdown. Both go through the same claim, deliver and fenced-write steps as a sender's
//! delivery.

use std::sync::Arc;

use actix::prelude::*;
use actix_web::http::header::HeaderMap;
use futures_util::future::join_all;
use slog::{error, info};

use super::record::failure;
use super::{Answer, Event, ReleaseLeases, Replay, Reply, Shard, STORE_RETRY_AFTER_SECS};
use crate::claim::Path;
use crate::store::Fenced;

impl Handler<Replay> for Shard {
    type Result = ();

    fn handle(&mut self, msg: Replay, ctx: &mut Context<Self>) {
        let Replay { id, target, reply } = msg;
        let refused = || Answer {
            path: Path::Replay,
            attempts: None,
            reply: Reply::NotReplayable,
        };
        if self.in_flight.contains_key(&id) {
            let _ = reply.send(refused());
            return;
        }
        let store = Arc::clone(&self.store);
        let lease = self.settings.lease;
        let key = id.clone();
        let reopen = async move { store.replay(&key, lease).await };
        ctx.spawn(reopen.into_actor(self).map(move |reopened, act, ctx| {
            let reopened = match reopened {
                Ok(Some(reopened)) => reopened,
                Ok(None) => {
                    let _ = reply.send(refused());
                    return;
                }
                Err(e) => {
                    act.metrics.store_error(e.kind());
                    let _ = reply.send(Answer::unclaimed(
                        Path::StoreUnavailable,
                        Reply::RetryLater {
                            retry_after: STORE_RETRY_AFTER_SECS,
                            reason: "store_unavailable",
                        },
                    ));
                    return;
                }
            };
            let event = Arc::new(Event {
                id,
                body: reopened.payload,
                content_type: reopened.content_type,
                fingerprint: reopened.fingerprint,
                target,
                headers: HeaderMap::new(),
            });
            let token = act.track(&event, Some(reopened.attempts));
            act.log_claim(&event.id, Path::Replay, Some(reopened.attempts));
            act.deliver(event, token, reopened.attempts, Path::Replay, reply, ctx);
        }));
    }
}

impl Handler<ReleaseLeases> for Shard {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, _msg: ReleaseLeases, _ctx: &mut Context<Self>) -> Self::Result {
        let held: Vec<(Arc<Event>, i32)> = self
            .in_flight
            .values()
            .filter_map(|e| e.attempts.map(|a| (Arc::clone(&e.event), a)))
            .collect();
        let store = Arc::clone(&self.store);
        let log = self.log.clone();
        Box::pin(async move {
            let writes = held.iter().map(|(event, attempts)| {
                let store = Arc::clone(&store);
                let failure = failure(event, "released at shutdown", None);
                async move {
                    let written = store.fail(&event.id, *attempts, &failure).await;
                    (event, attempts, written)
                }
            });
            let mut released = 0;
            for (event, attempts, written) in join_all(writes).await {
                match written {
                    Ok(Fenced::Applied) => {
                        released += 1;
                        info!(log, "webhook.released";
                            "provider" => &*event.id.provider, "event_key" => &*event.id.key,
                            "attempts" => *attempts);
                    }
                    Ok(Fenced::Stale) => {}
                    Err(e) => error!(log, "webhook.release_failed";
                        "provider" => &*event.id.provider, "event_key" => &*event.id.key,
                        "error" => %e),
                }
            }
            released
        })
    }
}
