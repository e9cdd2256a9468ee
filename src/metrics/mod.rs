//! Prometheus metrics for one node, served at `GET /metrics`. This file only re-exports.
//!
//! Each node owns its registry (no process-global recorder), so several nodes in one
//! process — the test suite — never mix their counts. Recording is a few atomic adds.
//!
//! Every label value comes from a closed set: configured provider names (the HTTP layer
//! passes `unknown` for any other name a request carries), and path, reason, outcome and
//! kind names written in the code. A request can never add a label value.

mod record;
mod registry;

pub use registry::{Metrics, TraceCounters};
