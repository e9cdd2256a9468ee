//! The HTTP surface: the routes, the ingest handler, the admin API, health and metrics,
//! the one error type, and the operators' JSON. Handlers parse, verify and render; every
//! decision about an event is the shard's.
//!
//! This file only re-exports; what each file owns is in `docs/design.md`'s file map, which
//! `scripts/check-docs.sh` holds to the folder.

mod admin;
mod body;
mod budget;
mod conn_watch;
mod error;
mod event_json;
mod health;
mod ingest;
mod routes;
mod state;
mod stats_cache;

pub use budget::BodyBudget;
pub use conn_watch::{bound_writes, ConnWatch, Sent};
pub use error::ApiError;
pub use event_json::{attempt_json, event_json, route_json, summary_json};
pub use routes::routes;
pub use state::AppState;
pub use stats_cache::StatsCache;
