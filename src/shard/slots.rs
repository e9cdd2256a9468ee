//! What a shard keeps of a request or an attempt on its way: [`Waiting`] while a sync
//! request waits for a worker, [`Claiming`] while its claim is at the store, [`Pending`]
//! while a taken row waits for a worker, [`Running`] once a worker has an attempt. Plain
//! records.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::answer::Answer;
use super::attempt::Attempt;
use super::event::Event;

/// A request admitted to wait for a free worker; nothing is claimed for it yet.
pub(super) struct Waiting {
    pub(super) event: Arc<Event>,
    pub(super) reply: oneshot::Sender<Answer>,
    pub(super) token: u64,
}

/// A claim on its way to the store, with what is needed when the answer comes back.
pub(super) struct Claiming {
    /// The request that made it.
    pub(super) event: Arc<Event>,
    /// Where its answer goes.
    pub(super) reply: oneshot::Sender<Answer>,
    /// Its in-flight entry's token.
    pub(super) token: u64,
    /// The worker reserved for its attempt.
    pub(super) worker: usize,
    /// Taken just before the claim left: the store's lease starts no earlier.
    pub(super) sent: Instant,
}

/// A taken row waiting in its shard for a worker (the scheduler took it for this node).
pub(super) struct Pending {
    pub(super) attempt: Attempt,
    /// The in-flight entry's token.
    pub(super) token: u64,
    /// Whether it holds one of its provider's queue slots.
    pub(super) gated: bool,
}

/// An attempt with the shard's bookkeeping: its in-flight entry and its worker.
pub(super) struct Running {
    /// The attempt itself.
    pub(super) attempt: Attempt,
    /// The in-flight entry's token.
    pub(super) token: u64,
    /// The worker reserved for it before the claim.
    pub(super) worker: usize,
    /// Whether it holds one of its provider's queue slots (given back at the end).
    pub(super) gated: bool,
}
