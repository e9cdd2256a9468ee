//! The embedded SQLite backend: one file, the zero-setup default for one node. It owns its
//! SQL, the single writer thread that runs every operation in group-committed
//! transactions, and its migrations. This file only re-exports.
//!
//! The files import one another one way: `store` (the [`Store`](super::Store)
//! implementation) → `queue` → `writer`, `rows`.

mod operator;
mod queue;
mod rows;
mod store;
mod writer;

pub use store::SqliteStore;
