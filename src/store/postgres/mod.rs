//! The Postgres backend: production, high volume, several hookgate nodes on one database.
//! It owns its SQL (each statement says what it locks), group commit of claims and
//! completions, the pool under the statement deadline, TLS with libpq's meanings, and its
//! migrations. This file only re-exports.
//!
//! The files import one another one way: `store` (the [`Store`](super::Store)
//! implementation) → `pools`, `operator`, `search`, `batch`, `queue`, `migrate`,
//! `tables` → `pool` → `connection`, `sql`, `queue_sql`, `rows`, `tls`.

mod batch;
mod batch_sql;
mod connection;
mod durability;
mod migrate;
mod operator;
mod operator_sql;
mod pool;
mod pools;
mod queue;
mod queue_sql;
mod reseal;
mod ring;
mod ring_view;
mod routed;
mod rows;
mod search;
mod sql;
mod store;
mod tables;
mod tls;

pub use store::PgStore;
pub use tls::tls_warning;
