//! The store: the narrow interface to the row that is the truth about every event
//! ([`api`]), and its two backends: [`postgres::PgStore`] (production, several nodes; group
//! commit in `postgres_batch`, the pool and deadline in `postgres_pool`) and
//! [`sqlite::SqliteStore`] (embedded, the zero-setup default; one writer thread in
//! `sqlite_writer`). Both pass the one conformance suite in
//! `tests/api/store_conformance.rs`. [`open`] picks one from the URL.
//!
//! The files import one another one way (this one only re-exports): `open` → the
//! backends → their helpers → `api`.

pub mod api;
mod batcher;
mod open;
mod page;
pub mod postgres;
mod postgres_batch;
mod postgres_pool;
mod postgres_queue;
mod postgres_queue_sql;
mod postgres_rows;
mod postgres_sql;
mod postgres_tls;
mod reconnect;
pub mod sqlite;
mod sqlite_queue;
mod sqlite_rows;
mod sqlite_writer;

pub use crate::outcome::DeadReason;
pub use api::{
    Enqueue, Enqueued, EventRecord, Failure, Fenced, QueueDepth, Reopened, Store, StoreError,
    StoreFuture, Taken,
};
pub use open::open;
pub use page::PageCursor;
