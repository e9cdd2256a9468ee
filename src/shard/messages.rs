//! The messages a shard takes: a sender's delivery (sync: [`Ingest`]; queue: [`Enqueue`]),
//! a queue row the scheduler took for this node ([`Start`]), an operator's replay, and the
//! two steps of a graceful shutdown.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::answer::Answer;
use super::event::Event;
use super::in_flight::KeyHold;
use crate::key::EventId;
use crate::provider::Target;
use crate::store::Taken;

/// Handle one delivery; the answer comes back on `reply`.
///
/// The reply travels in the message (rather than as the handler's result) so that the
/// HTTP layer can use `try_send` and refuse at once when the mailbox is full.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ingest {
    /// The delivery.
    pub event: Arc<Event>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Answer>,
}

/// Replay a dead letter once (an operator's request); the answer says how it ended, or
/// [`Reply::NotReplayable`](super::answer::Reply::NotReplayable) when the row was not dead.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Replay {
    /// The dead letter's key.
    pub id: EventId,
    /// Where its provider delivers now.
    pub target: Arc<Target>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Answer>,
}

/// Shutdown, first step: claim nothing more. Requests waiting for a worker are refused;
/// a claim still on its way that is won is released (`failed`, fenced) without reaching
/// the target; deliveries already running go on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain;

/// Shutdown, second step: answered once every claim on its way has come back and every
/// running delivery has ended and been recorded.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drained;

/// Queue mode: write a sender's event with its payload and answer 202 once it is durable
/// (or answer the row as it stands); then start its first attempt at once if a worker and
/// the provider's limits allow.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Enqueue {
    /// The delivery.
    pub event: Arc<Event>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Answer>,
}

/// Queue mode: the scheduler took this row for this node, with one of the provider's gate
/// slots reserved for it; start its attempt when a worker of the shard is free (or release it if none frees up while its lease allows a start).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Start {
    /// The taken row.
    pub taken: Taken,
    /// Where its provider delivers.
    pub target: Arc<Target>,
    /// Taken just before the take left: the lease starts no earlier.
    pub sent: Instant,
    /// Keeps the key from the scheduler's next passes until the shard has entered it in
    /// its in-flight set (or the row is released).
    pub hold: KeyHold,
}
