//! Retention as every store takes it: what a pass keeps ([`Retention`]), what it did and
//! what it left past retention ([`Retained`]), and the sizes of the store's tables
//! ([`TableSize`]). How a backend removes a period's rows is its own: this file
//! only says what a pass must answer.

use std::time::Duration;

/// What retention keeps: `done` rows for `done` after they were done, dead letters for
/// `dead` after they died; the other statuses are never removed by retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long a done row is kept (and answers its redeliveries).
    pub done: Duration,
    /// How long a dead letter is kept for people to read and replay.
    pub dead: Duration,
    /// Rows one statement removes at most, where a store removes rows one by one: it
    /// bounds the locks and the work of one write.
    pub batch: u32,
    /// How long one pass may keep removing rows: a backlog larger than that is left for
    /// the next pass, and shows as [`Retained::backlog`].
    pub budget: Duration,
    /// How often passes run (`retention.sweep_interval`): a store that acts at a set age
    /// acts at the pass nearest to it where acting early is safe.
    pub interval: Duration,
}

/// What one retention pass did, and what it left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retained {
    /// Done rows removed.
    pub done: u64,
    /// Dead letters removed.
    pub dead: u64,
    /// How far past its retention the oldest row still kept is (zero: retention keeps
    /// up). A backlog that grows pass after pass is a node accepting more than its store
    /// removes.
    pub backlog: Duration,
    /// A step of the pass that failed while the rest of it went on (an emptying refused by
    /// the database, say), as the error's text: the pass counts as failed, and what it
    /// could not do is left for the next one (the backlog shows it). `None`: every step
    /// ran.
    pub failed: Option<String>,
    /// The longest time one of the pass's transactions held the tables' lock that claims
    /// wait behind (zero for a store that takes none).
    pub longest_lock: Duration,
    /// Filters of sealed slots' keys this node read during the pass (Postgres), so that
    /// claims of new keys skip those slots.
    pub filters: Vec<SlotFilter>,
    /// The bytes of all the filters the node holds after the pass.
    pub filter_bytes: u64,
}

/// A filter of one sealed slot's keys, read by a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotFilter {
    /// The slot.
    pub slot: i16,
    /// The keys it holds.
    pub keys: u64,
    /// Its size in memory.
    pub bytes: u64,
}

/// The bytes one of the store's tables takes on disk: rows, indexes and out-of-line values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSize {
    /// The table's name (one of hookgate's own).
    pub table: &'static str,
    /// Its bytes.
    pub bytes: u64,
}

/// hookgate's tables, as [`TableSize`] names them: the events, their history, paused
/// providers, bulk replay jobs and their results.
pub const TABLES: [&str; 5] = [
    "webhook_events",
    "webhook_attempts",
    "hookgate_paused",
    "hookgate_replay_jobs",
    "hookgate_replay_items",
];
