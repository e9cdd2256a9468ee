//! hookgate's integration suite: one binary, real PostgreSQL (a schema per test), a real
//! HTTP target that counts deliveries. Run it with `scripts/test.sh`.

mod bad_input;
mod concurrency;
mod failures;
mod helpers;
mod operators;
mod paths;
mod providers;
mod store_conformance;
