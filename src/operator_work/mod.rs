//! Operators' work as a node takes part in it: the pauses operators set in the store, the
//! bulk replay jobs they start, each run by one node at a time, and rekeys of the store's
//! sealed bodies (`rekey`). This file only re-exports.

pub mod jobs;
pub mod rekey;
mod runner;

pub use runner::OperatorWork;
