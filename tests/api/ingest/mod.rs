//! What a sender meets: every path answered and labelled, bad input refused with nothing
//! claimed, each provider's signatures, duplicates answered from their rows, one key
//! delivered once under parallel deliveries, keys read as written, headers kept without
//! credentials, events a target's filter does not take, traces.
//!
//! * `bad_input.rs` — bad requests refused with their codes, nothing claimed.
//! * `concurrency.rs` — one key delivered once under parallel deliveries, on one node or two.
//! * `duplicates.rs` — redeliveries answered from their rows leave the rows unwritten.
//! * `filters.rs` — a target's filter: events it does not take answered `filtered`, once.
//! * `kept_headers.rs` — the request headers kept with an event, credentials dropped.
//! * `keys.rs` — an event's key as the sender wrote it.
//! * `paths.rs` — every path a delivery can take, answered and labelled.
//! * `providers.rs` — each provider preset's signatures, rotation, fingerprints.
//! * `traces.rs` — OpenTelemetry traces from the sender through each attempt to the target.

mod bad_input;
mod concurrency;
mod duplicates;
mod filters;
mod kept_headers;
mod keys;
mod paths;
mod providers;
mod traces;
