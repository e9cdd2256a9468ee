//! hookgate: a webhook receiver that turns senders' at-least-once delivery into
//! effectively-once processing, by claiming every event's idempotency key atomically in the
//! store before the application (the *target*) sees it.
//!
//! # Layout
//!
//! Imports go one way, down the layers that `docs/design.md` draws (the one place they are
//! written, checked by `scripts/check-docs.sh`); no module imports one above it. Every file
//! and what it owns: `docs/design.md`.
//!
//! | pattern | where |
//! |---|---|
//! | row states and modes, named paths, the not-won and mismatch rules (core) | [`claim`] |
//! | the idempotency key and its sources (core) | [`key`] |
//! | canonical JSON, payload fingerprints (core) | [`canonical`] |
//! | which events a route wants: conditions on the body and headers (core) | [`filter`] |
//! | signature schemes, bounded header parsing (core) | [`signature`] |
//! | backoff with jitter and the attempt cap (core) | [`retry`] |
//! | what a delivery's outcome means for the row (core) | [`outcome`] |
//! | a secret that never prints (core) | [`secret`] |
//! | values sealed at rest, keyed fingerprints (core) | [`seal`] |
//! | instants after a duration, never overflowing (core) | [`deadline`] |
//! | this process's name in the rows it writes (core) | [`node`] |
//! | settings, env layering, rules, loading | [`config`] |
//! | presets resolved into a provider's runtime | [`provider`] |
//! | Prometheus metrics, one registry per node; JSON logs and every event name | [`metrics`], [`logging`], [`logging::EVENTS`] |
//! | TLS clients: system roots or a CA file, libpq's levels | [`tls`] |
//! | W3C trace context, spans, the OTLP/HTTP exporter | [`trace`] |
//! | the store interface; atomic claim, fenced complete/fail | [`store::api`] |
//! | Postgres (group commit) and the embedded SQLite store | [`store::postgres`], [`store::sqlite`] |
//! | shard actors: memory answers, admission, claims | [`shard`] |
//! | one attempt: deliver → judge → record → answer | [`shard::attempt`] |
//! | the done cache read by HTTP handlers; routing | [`shard::cache`], [`shard::dispatcher`] |
//! | supervised workers, the delivery seam | [`worker`], [`worker::delivery`] |
//! | the retention sweeper, and giving up on events no sender retries (`run_once`) | [`retention`] |
//! | the queue scheduler (`run_once`) | [`scheduler`] |
//! | provider pauses and bulk replay jobs, as a node takes part in them (`run_once`) | [`operator_work`] |
//! | HTTP routes, ingest, the one error type | [`http`] |
//! | building and stopping a node | [`startup`] |
//! | the command line | [`cli`] |

pub mod canonical;
pub mod claim;
pub mod cli;
pub mod config;
pub mod deadline;
pub mod filter;
pub mod http;
pub mod key;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod operator_work;
pub mod outcome;
pub mod provider;
pub mod retention;
pub mod retry;
pub mod scheduler;
pub mod seal;
pub mod secret;
pub mod shard;
pub mod signature;
pub mod startup;
pub mod store;
pub mod tls;
pub mod trace;
pub mod worker;
