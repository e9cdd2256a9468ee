//! The store itself, on both backends: the conformance suite, the model check of the row
//! protocol, the Postgres slot ring, the hot statements' plans, TLS to the database and to
//! targets, schema upgrades.
//!
//! * `conformance/` — the conformance suite: every rule of the row, against each backend.
//! * `model.rs` — the row protocol against a reference model, by seeded random sequences
//!   (`model_regressions.txt`: every sequence that once failed, replayed first).
//! * `plans.rs` — the hot statements' plans, whatever the table's size and statistics.
//! * `ring.rs` — the Postgres slot ring: the promise across its boundaries, its upkeep.
//! * `tls.rs` — TLS to the database and to targets.
//! * `upgrades.rs` — schema upgrades, beside live claims and in place.

mod conformance;
mod model;
mod plans;
mod ring;
mod tls;
mod upgrades;
