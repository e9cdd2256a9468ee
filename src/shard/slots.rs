//! What a shard keeps of an attempt it has taken on: [`Pending`] while the taken row
//! waits for a worker, [`Running`] once a worker has it. Plain records, used by the shard's
//! handlers in `actor`, `queue`, `claimed`, `operator` and `running`.

use super::attempt::Attempt;

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
