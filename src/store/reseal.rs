//! What a rekey asks of a store ([`Resealer`]): the stored bodies not sealed by the sealing
//! key, a bounded page at a time in each table's key order, and a compare-and-set that
//! writes one value's new seal only if the value is still the one read — so a rekey runs
//! beside live traffic, on several nodes at once, and can be stopped and run again. Both
//! see the raw stored bytes, under any decorator; the job itself is in `operator_work`.

use crate::seal::Column;

use super::types::StoreFuture;

/// A table holding sealed bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `webhook_events`: payloads, cached answers, kept headers.
    Events,
    /// `webhook_attempts`: history excerpts.
    Attempts,
}

impl Table {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Events => "webhook_events",
            Self::Attempts => "webhook_attempts",
        }
    }
}

/// A row's place in its table's key order: provider, key, slot (Postgres; 0 on SQLite),
/// attempt (history rows; 0 for events).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowKey {
    /// The row's scope.
    pub provider: String,
    /// Its event key.
    pub key: String,
    /// Its slot.
    pub slot: i16,
    /// Its attempt (history rows).
    pub attempt: i32,
}

/// A stored body, as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// A byte column's value.
    Bytes(Vec<u8>),
    /// A text column's value.
    Text(String),
}

/// A body not sealed by the sealing key: plaintext, or sealed by another key.
#[derive(Debug, Clone)]
pub struct Stale {
    /// Its row.
    pub row: RowKey,
    /// Its column.
    pub column: Column,
    /// Its stored value.
    pub value: Stored,
}

/// One page of a table read for a rekey.
#[derive(Debug, Clone, Default)]
pub struct StalePage {
    /// The stale bodies of the rows read.
    pub stale: Vec<Stale>,
    /// Rows read.
    pub read: u64,
    /// The last row read, where the next page starts; `None` once the table is read.
    pub last: Option<RowKey>,
}

/// What every body sealed by the sealing key starts with.
#[derive(Debug, Clone)]
pub struct SealedBy {
    /// A byte value's prefix.
    pub bytes: Vec<u8>,
    /// A text value's prefix.
    pub text: String,
}

/// A store's side of a rekey.
pub trait Resealer: Send + Sync {
    /// Reads at most `limit` rows of `table` after `after` (from the start: `None`), in
    /// key order, answering their bodies that do not start with `current`'s prefix.
    fn stale<'a>(
        &'a self,
        table: Table,
        after: Option<&'a RowKey>,
        limit: u32,
        current: &'a SealedBy,
    ) -> StoreFuture<'a, StalePage>;

    /// Writes `new` over one body if it still is `old` (the row's other columns, its
    /// status and its times untouched); `false` when it changed meanwhile.
    fn reseal<'a>(
        &'a self,
        row: &'a RowKey,
        column: Column,
        old: &'a Stored,
        new: &'a Stored,
    ) -> StoreFuture<'a, bool>;
}

/// The column's name in its table.
pub fn column_name(column: Column) -> &'static str {
    match column {
        Column::Payload => "payload",
        Column::ResultBody => "result_body",
        Column::RequestHeaders => "request_headers",
        Column::Answer(_) => "answer",
    }
}
