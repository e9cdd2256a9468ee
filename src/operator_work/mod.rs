//! Operators' work as a node takes part in it: the pauses operators set in the store, and
//! the bulk replay jobs they start, each run by one node at a time. This file only
//! re-exports.

pub mod jobs;
mod runner;

pub use runner::OperatorWork;
