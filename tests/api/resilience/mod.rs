//! The promise when things go wrong: pressure, slow clients and shutdown, panics and a
//! store that goes away, failover to a standby, the attempt runner under injected faults.
//!
//! * `failover.rs` — a Postgres primary lost to its standby, under load.
//! * `failures.rs` — panics, late completions, a store that goes away, targets that stall.
//! * `pressure.rs` — overload, a frozen database, large answers.
//! * `runner_faults/` — the attempt runner under seeded store faults.
//! * `shutdown.rs` — a node told to stop drains: what runs finishes, nothing new starts.
//! * `slow_clients.rs` — slow and stalled senders and readers hold no connection for long.

mod failover;
mod failures;
mod pressure;
mod runner_faults;
mod shutdown;
mod slow_clients;

use crate::helpers::TestApp;

/// The value of the first `/metrics` sample whose line starts with `prefix`, or 0.
async fn metric(app: &TestApp, prefix: &str) -> f64 {
    app.metric(prefix).await
}
