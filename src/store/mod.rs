//! The store: the narrow interface to the row that is the truth about every event
//! ([`api`]), and its two backends, a folder each: [`postgres`] (production, several
//! nodes) and [`sqlite`] (embedded, the zero-setup default). Both pass the one conformance
//! suite in `tests/api/store/conformance/`. [`open`] picks one from the URL.
//!
//! This file only re-exports (the store's types are imported through it, by one path);
//! what each file owns is in `docs/design.md`'s file map, which `scripts/check-docs.sh`
//! holds to the folder.

pub mod api;
mod batcher;
mod error;
mod open;
pub mod operator;
mod page;
pub mod postgres;
mod reconnect;
pub mod reseal;
pub mod retain;
mod sealed;
mod search;
pub mod sqlite;
mod types;

pub use api::Store;
pub use error::{chain, Cause, StoreError};
pub use open::{check, open};
pub use page::PageCursor;
pub use reseal::Resealer;
pub use retain::{Retained, Retention, SlotFilter, TableSize};
pub use sealed::sealed;
pub use search::{SearchPage, SCAN_BUDGET};
pub(crate) use types::{millis, storable, within};
pub use types::{
    AttemptRecord, Enqueued, EventRecord, EventSummary, Failure, Fenced, History, Kept,
    MigrationWait, QueueDepth, QueueRow, Reopened, Routed, StoreFuture, Taken,
};
