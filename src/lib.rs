//! hookgate: a webhook receiver that turns senders' at-least-once delivery into
//! effectively-once processing, by claiming every event's idempotency key atomically in the
//! store before the application (the *target*) sees it.
//!
//! # Layout
//!
//! | pattern | where |
//! |---|---|
//! | config file + env layering, validation rules | [`config`] |
//! | the idempotency key: header, JSON pointer, fields hash (pure) | [`key`] |
//! | canonical JSON, payload fingerprints (pure) | [`canonical`] |
//! | signature schemes: generic HMAC, Stripe, Standard Webhooks | [`signature`] |
//! | presets resolved into a provider's runtime | [`provider`] |
//! | row states, named paths, the not-won rule (pure) | [`claim`] |
//! | backoff with jitter and the attempt cap (pure) | [`retry`] |
//! | what a delivery's outcome means for the row (pure) | [`outcome`] |
//! | the store trait; atomic claim, fenced complete/fail | [`store`] |
//! | Postgres (group commit) and the embedded SQLite store | [`store::postgres`], [`store::sqlite`] |
//! | shard actors: in-flight set, claim → deliver → record | [`shard`] |
//! | the done cache read by HTTP handlers; routing | [`shard::cache`], [`shard::dispatcher`] |
//! | supervised workers, the delivery seam | [`worker`], [`worker::delivery`] |
//! | HTTP routes, ingest, the one error type | [`http`] |
//! | JSON logs through an async drain | [`logging`] |
//! | Prometheus metrics, one registry per node | [`metrics`] |
//! | the retention sweeper (`run_once`) | [`retention`] |
//! | building and stopping a node | [`startup`] |
//! | the command line | [`cli`] |

pub mod canonical;
pub mod claim;
pub mod cli;
pub mod config;
pub mod http;
pub mod key;
pub mod logging;
pub mod metrics;
pub mod outcome;
pub mod provider;
pub mod retention;
pub mod retry;
pub mod secret;
pub mod shard;
pub mod signature;
pub mod startup;
pub mod store;
pub mod worker;
