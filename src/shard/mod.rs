//! Shards: each owns a slice of the key space and serializes the claims for its keys;
//! the dispatcher routes every event to its shard; a won claim runs as one [`attempt`].
//!
//! The files import one another one way (this one only re-exports):
//! `dispatcher` → `actor` (admission, memory answers) → `claimed` (the store's answer) →
//! `running` (the shard's attempts) → `attempt` (deliver, judge, record, answer: the one
//! home, also used by the command line) → `record` (fenced writes), `answer`, `cache`,
//! `in_flight`, `busy` (what a draining shard waits for), `event`, `messages`, `slots` (an
//! attempt waiting for or holding a worker); `operator` (replay, shutdown) and `queue`
//! beside them.

mod actor;
pub mod answer;
pub mod attempt;
mod busy;
pub mod cache;
mod claimed;
pub mod dispatcher;
mod event;
pub mod gate;
mod in_flight;
mod messages;
mod operator;
mod queue;
mod record;
mod running;
mod signals;
mod slots;

pub use actor::{Shard, ShardSettings, Shared};
pub use answer::{
    cached_answer, Answer, Reply, RetryReason, BUSY_RETRY_AFTER_SECS, STORE_RETRY_AFTER_SECS,
};
pub use attempt::{Attempt, Recorded};
pub use dispatcher::Dispatcher;
pub use event::Event;
pub use gate::Gate;
pub use in_flight::{KeyHold, NodeKeys};
pub use messages::{Drain, Drained, Enqueue, Ingest, Replay, Start};
pub use operator::replay_attempt;
pub use queue::release_taken;
pub use record::write_verdict;
pub use signals::QueueSignals;
