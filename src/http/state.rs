//! The state every HTTP handler sees: providers, the shards, the store, limits, the
//! logger, the metrics, the admin token, the statistics kept for the console.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::metrics::Metrics;
use crate::provider::{Provider, Route};
use crate::secret::Secret;
use crate::shard::Dispatcher;
use crate::store::operator::StatusCount;
use crate::store::Store;

use super::stats_cache::StatsCache;

/// State shared by every handler.
pub struct AppState {
    /// Providers by name.
    pub providers: HashMap<String, Provider>,
    /// Every provider's routes by scope (`stripe`, `stripe.analytics`): what operators
    /// name when they pause, search or replay one route.
    pub routes: HashMap<String, Arc<Route>>,
    /// The shards.
    pub dispatcher: Dispatcher,
    /// The store (for `/readyz`).
    pub store: Arc<dyn Store>,
    /// `server.max_body_bytes`.
    pub max_body_bytes: usize,
    /// `server.max_body_bytes_in_flight`: request bodies held at once, over the node.
    pub body_budget: Arc<super::budget::BodyBudget>,
    /// `server.read_timeout`: the deadline for reading a request's body.
    pub read_timeout: std::time::Duration,
    /// Request-path logger.
    pub log: slog::Logger,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// `Retry-After` for a paused provider's sender (the pause poll, at least a second).
    pub paused_retry_after: u64,
    /// Pauses and bulk replays (a pause is applied here at once, and by every node at its
    /// next poll).
    pub operator_work: Arc<crate::operator_work::OperatorWork>,
    /// This node's rekey job, started from the admin API.
    pub rekey: crate::operator_work::rekey::RekeyJob,
    /// The admin bearer token; `None` disables `/admin/`.
    pub admin_token: Option<Secret>,
    /// `/readyz`'s last look at the store: when, and whether it answered (`None` before
    /// the first). A plain mutex: held for a copy, never across an `.await`.
    pub readiness: Mutex<Option<(Instant, Result<(), String>)>>,
    /// The rows per provider and status `/admin/api/stats` answers from, kept for
    /// `admin.stats_max_age`.
    pub stats: StatsCache<Vec<StatusCount>>,
    /// The node's tracer; `None` while tracing is off.
    pub tracer: Option<Arc<crate::trace::Tracer>>,
}
