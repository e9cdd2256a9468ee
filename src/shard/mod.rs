//! Shards: each owns a slice of the key space and serializes the claims for its keys;
//! the dispatcher routes every event to its shard; a won claim runs as one [`attempt`].
//!
//! This file only re-exports. Start reading at `actor.rs`: the shard's state and every
//! message it takes, with the stage file each goes to. A sync event reads forward:
//! `dispatcher` → `actor` → `sync` (memory answers, admission, the claim) → `claimed` (the
//! store's answer, the attempt on its worker, its record, the answer) → `attempt` (deliver,
//! judge, record: the one home, also used by the command line; its spans: `spans`) →
//! `record` (fenced writes) → `reply` (what the recorded verdict tells the sender) and
//! `answer`.

mod actor;
mod admission;
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
mod queue;
pub mod ramp;
mod record;
mod replay;
mod reply;
mod routes;
mod signals;
mod slots;
mod spans;
mod sync;
mod taken;

pub use actor::{Shard, ShardSettings, Shared};
pub use answer::{
    cached_answer, Answer, Reply, RetryReason, BUSY_RETRY_AFTER_SECS, STORE_RETRY_AFTER_SECS,
};
pub use attempt::{Attempt, Recorded};
pub use dispatcher::Dispatcher;
pub use event::{Event, Traced};
pub use gate::Gate;
pub use in_flight::{KeyHold, NodeKeys};
pub use messages::{Drain, Drained, Enqueue, Ingest, Replay, Start};
pub use record::write_verdict;
pub use replay::replay_attempt;
pub use signals::QueueSignals;
pub use taken::release_taken;
