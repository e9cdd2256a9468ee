//! What operators do: the admin API and the console, dead letters and their replay,
//! history, searches, pauses and bulk replays, retention and metrics. (Schema upgrades:
//! `store/upgrades.rs`.)
//!
//! * `admin.rs` — the admin API's door: the token, request limits, connections of its own.
//! * `bulk_replay.rs` — bulk replay jobs, by the API and the command line.
//! * `common.rs` — helpers shared by the history, search, bulk replay and pause tests.
//! * `console.rs` — the console in a real browser, and its security headers.
//! * `dead_letters.rs` — reading dead letters and replaying one, by the API and the CLI.
//! * `history.rs` — every event's attempts, as the API and the command line show them.
//! * `metrics.rs` — `/metrics` and `/readyz`.
//! * `pauses.rs` — a provider paused by an operator or by its target's `Retry-After`.
//! * `retention.rs` — the sweeper and a retention pass's backlog.
//! * `search.rs` — the search, lists without payloads, statistics, any key by query.

mod admin;
mod bulk_replay;
pub(crate) mod common;
mod console;
mod dead_letters;
mod history;
mod metrics;
mod pauses;
mod retention;
mod search;
