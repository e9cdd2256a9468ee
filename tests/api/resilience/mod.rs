//! The promise when things go wrong: pressure and shutdown, panics and a store that goes
//! away, failover to a standby, the attempt runner under injected faults.
//!
//! * `failover.rs` — a Postgres primary lost to its standby, under load.
//! * `failures.rs` — panics, late completions, a store that goes away, targets that stall.
//! * `pressure.rs` — overload, a frozen database, slow senders, large answers.
//! * `runner_faults.rs` — the attempt runner under seeded store faults.
//! * `shutdown.rs` — a node told to stop drains: what runs finishes, nothing new starts.

mod failover;
mod failures;
mod pressure;
mod runner_faults;
mod shutdown;
