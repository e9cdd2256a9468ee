//! The promise when things go wrong: pressure and shutdown, panics and a store that goes
//! away, failover to a standby, the attempt runner under injected faults.

mod failover;
mod failures;
mod pressure;
mod runner_faults;
