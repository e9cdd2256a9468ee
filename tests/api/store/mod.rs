//! The store itself, on both backends: the conformance suite, the model check of the row
//! protocol, the Postgres slot ring, the hot statements' plans, TLS to the database and to
//! targets, schema upgrades.

mod model;
mod plans;
mod ring;
mod store_conformance;
mod tls;
mod upgrades;
