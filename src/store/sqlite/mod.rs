//! The embedded SQLite backend: one file, the zero-setup default for one node. It owns its
//! SQL, the single writer thread that runs every write in group-committed transactions,
//! the reader thread that runs operators' plain reads beside it, the checkpointer thread
//! that copies the WAL back into the file, and its migrations. This file only re-exports.
//!
//! The files import one another one way: `store` (the [`Store`](super::Store)
//! implementation) → `operator`, `queue`, `retention` → `search`, `reader`,
//! `checkpointer` → `writer`, `rows`.

mod checkpointer;
mod files;
mod operator;
mod operator_sql;
mod queue;
mod reader;
mod reseal;
mod retention;
mod rows;
mod search;
mod sql;
mod store;
mod writer;

pub use store::SqliteStore;
