//! Queue mode: 202 once durable, hookgate as the redeliverer, and its promise in ordinary
//! operations — no two attempts of one key are ever open at the target at once, and a key
//! the target answered 2xx is never sent again while its process lives — through replays,
//! lost renewals, slow outcome writes, a target's `Retry-After`, redeliveries, and a
//! provider that left queue mode or was removed. The scheduler's background loop is slowed
//! to an hour; every pass is driven by hand (`run_once`). (A draining node takes no queue
//! rows: `resilience/shutdown.rs`; pauses: `operators/pauses.rs`.)
//!
//! * `mode.rs` — 202 once the row is durable, retries and dead letters, leases, the
//!   provider's limit, nodes killed with `kill -9`.
//! * `provider_changes.rs` — rows of a provider that left queue mode, or was removed.
//! * `ramp.rs` — the end of a pause (the target's, or an operator's): one delivery first,
//!   then more as deliveries succeed; a failed first delivery pauses again.
//! * `redeliveries.rs` — a sender's redelivery while hookgate runs the event itself.
//! * `renewals.rs` — long attempts live on renewals; a held outcome write still lands.
//! * `throttles.rs` — a target's `Retry-After`, bounded and not counted as an attempt.

mod mode;
mod provider_changes;
mod ramp;
mod redeliveries;
mod renewals;
mod throttles;

const TOKEN: &str = "queue-admin-token";
