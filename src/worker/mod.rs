//! The worker actor: runs one delivery at a time for its shard, and is the crash boundary.
//!
//! A panic in delivery code is caught here (an actix `Supervisor` does not restart an actor
//! that panics: its thread would die and its address with it). The worker answers
//! [`DeliveryOutcome::Crashed`] and stops itself; its supervisor then starts a fresh
//! instance behind the same address, and messages queued behind the crash reach it. The
//! worker never touches the store: the shard records every outcome.

pub mod delivery;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::FutureExt;

pub use delivery::{Delivery, DeliveryOutcome, DeliveryRequest, HttpDelivery};

/// One supervised delivery worker.
pub struct Worker {
    delivery: Arc<dyn Delivery>,
    log: slog::Logger,
}

impl Worker {
    /// A worker delivering through `delivery`.
    pub fn new(delivery: Arc<dyn Delivery>, log: slog::Logger) -> Self {
        Self { delivery, log }
    }
}

impl Actor for Worker {
    type Context = Context<Self>;
}

impl Supervised for Worker {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        slog::warn!(self.log, "worker.restarted");
    }
}

/// Deliver one event; answered when the target answered (or the delivery crashed).
#[derive(Message)]
#[rtype(result = "DeliveryOutcome")]
pub struct Deliver(pub DeliveryRequest);

impl Handler<Deliver> for Worker {
    /// Atomic: the worker's next message waits until this delivery ends, so a worker runs
    /// one delivery at a time and a crash takes down no other delivery with it.
    type Result = AtomicResponse<Self, DeliveryOutcome>;

    fn handle(&mut self, msg: Deliver, _ctx: &mut Context<Self>) -> Self::Result {
        let delivery = Arc::clone(&self.delivery);
        let attempt = AssertUnwindSafe(async move { delivery.deliver(msg.0).await });
        AtomicResponse::new(Box::pin(attempt.catch_unwind().into_actor(self).map(
            |result, act, ctx| match result {
                Ok(outcome) => outcome,
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    slog::error!(act.log, "worker.crashed"; "error" => &message);
                    ctx.stop();
                    DeliveryOutcome::Crashed(message)
                }
            },
        )))
    }
}

/// The text of a panic payload (`&str` or `String`), or a placeholder.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-text payload".into())
}
