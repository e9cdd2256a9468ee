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
//! * `redeliveries.rs` — a sender's redelivery while hookgate runs the event itself.
//! * `renewals.rs` — long attempts live on renewals; a held outcome write still lands.
//! * `throttles.rs` — a target's `Retry-After`, bounded and not counted as an attempt.

use std::time::Duration;

use hookgate::claim::Mode;
use hookgate::config::Config;

mod mode;
mod provider_changes;
mod redeliveries;
mod renewals;
mod throttles;

const TOKEN: &str = "queue-admin-token";

/// Queue mode with a lease (2 s) shorter than the target's timeout (30 s): every long
/// delivery lives on renewals.
fn long_deliveries(c: &mut Config) {
    c.providers[0].mode = Some(Mode::Queue);
    c.queue.poll_interval = Duration::from_secs(3600);
    c.lease.duration = Duration::from_secs(2);
    c.retry.base = Duration::from_secs(3);
    c.retry.cap = Duration::from_secs(30);
    c.store.statement_timeout = Some(Duration::from_secs(1));
    c.providers[0].target.timeout = Duration::from_secs(30);
}
