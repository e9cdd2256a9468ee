//! The settings of one hookgate node, section by section, with their defaults: plain
//! structs deserialized from the config file. Every key and its default is documented in
//! `config/hookgate.toml`. Loading and checking them live beside (`load`, `validate`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::provider::{preset_horizon, ProviderConfig};
use super::store::StoreConfig;
use crate::retry::RetryPolicy;
use crate::secret::Secret;

/// The whole configuration of one hookgate node.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// HTTP listener, sharding and request limits.
    pub server: ServerConfig,
    /// Where the event rows live.
    pub store: StoreConfig,
    /// The claim lease.
    pub lease: LeaseConfig,
    /// Backoff and the attempt cap.
    pub retry: RetryConfig,
    /// The shards' done caches.
    pub cache: CacheConfig,
    /// Log format and level.
    pub log: LogConfig,
    /// Graceful shutdown.
    pub shutdown: ShutdownConfig,
    /// How long finished rows are kept.
    pub retention: RetentionConfig,
    /// The operator's HTTP API under `/admin/`.
    pub admin: AdminConfig,
    /// The queue-mode scheduler.
    pub queue: QueueConfig,
    /// OpenTelemetry traces (off unless an endpoint is set).
    pub tracing: TracingConfig,
    /// The senders hookgate accepts, one `POST /webhooks/{name}` each.
    pub providers: Vec<ProviderConfig>,
}

/// `[server]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the HTTP server binds, `host:port`.
    pub listen: String,
    /// Number of shard actors; `None` means two per CPU.
    pub shards: Option<usize>,
    /// Supervised delivery workers per shard; each runs one delivery at a time.
    pub workers_per_shard: usize,
    /// Requests per shard that may wait for a free worker *before* claiming; more are
    /// answered 503 `overloaded` at once. `None` means `workers_per_shard`.
    pub admission_queue: Option<usize>,
    /// Longest wait for a free worker before a request is answered 503 `overloaded`.
    #[serde(with = "humantime_serde")]
    pub admission_wait: Duration,
    /// Deadline for reading a request's head and body; a sender that stalls longer gets
    /// 408 and its connection is closed. A client that leaves its answer unread for this
    /// long has its connection closed too (`TCP_USER_TIMEOUT`).
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    /// How long a connection may wait for its next request after an answer; zero closes
    /// every connection after its answer. A connection idle (or stuck in a request head
    /// that never ends) for this plus `read_timeout` after its last answer is closed.
    #[serde(with = "humantime_serde")]
    pub keep_alive: Duration,
    /// Open connections the node accepts at once (over all HTTP workers).
    pub max_connections: usize,
    /// Messages a shard's mailbox holds before new requests are refused with 503.
    pub mailbox_capacity: usize,
    /// Largest accepted request body; larger bodies are refused with 413. A byte size.
    #[serde(deserialize_with = "byte_size")]
    pub max_body_bytes: usize,
    /// Request bodies held at once over the node (each is read whole before its
    /// signature is checked); past it requests get 503 `overloaded`. A byte size.
    #[serde(deserialize_with = "byte_size")]
    pub max_body_bytes_in_flight: usize,
    /// HTTP worker threads; `None` means one per CPU.
    pub http_workers: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            shards: None,
            workers_per_shard: 32,
            admission_queue: None,
            admission_wait: Duration::from_secs(1),
            read_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(5),
            max_connections: 10_000,
            mailbox_capacity: 1024,
            max_body_bytes: 1024 * 1024,
            max_body_bytes_in_flight: 64 * 1024 * 1024,
            http_workers: None,
        }
    }
}

impl ServerConfig {
    /// Whether `listen` is a loopback address (`127.0.0.0/8`, `::1`, `localhost`): only
    /// this machine can reach it. Anything else, `0.0.0.0` included, is a network.
    pub fn on_loopback(&self) -> bool {
        match self.listen.parse::<std::net::SocketAddr>() {
            Ok(addr) => addr.ip().is_loopback(),
            Err(_) => self
                .listen
                .rsplit_once(':')
                .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
        }
    }

    /// The effective shard count: the configured one, or two per CPU.
    pub fn shard_count(&self) -> usize {
        self.shards.unwrap_or_else(|| 2 * cpus())
    }
}

/// A byte size: a plain integer, or a string with units (`"64MiB"`, `"1MB"`, `"512 KiB"`).
fn byte_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let size = <bytesize::ByteSize as Deserialize>::deserialize(d)?;
    usize::try_from(size.as_u64()).map_err(serde::de::Error::custom)
}

/// Number of CPUs this process may use (at least 1).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `[lease]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// How long a won claim holds its key before another attempt may retake it.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(30),
        }
    }
}

/// `[retry]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// The first backoff; must exceed the lease.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Growth per attempt.
    pub factor: f64,
    /// Largest backoff.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// Fraction of the delay added or removed at random, `0.0..1.0`.
    pub jitter: f64,
    /// Won claims an event may use before it becomes a dead letter.
    pub max_attempts: u32,
    /// How long senders keep retrying (sync mode): a `failed` row, or an expired
    /// `in_progress` one, untouched longer becomes a `sender_gave_up` dead letter.
    #[serde(with = "humantime_serde")]
    pub sender_horizon: Duration,
}

impl RetryConfig {
    /// The core's retry policy for these settings.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy::new(
            self.base,
            self.factor,
            self.cap,
            self.jitter,
            self.max_attempts,
        )
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(45),
            factor: 2.0,
            cap: Duration::from_secs(6 * 3600),
            jitter: 0.2,
            max_attempts: 8,
            sender_horizon: Duration::from_secs(3 * 24 * 3600),
        }
    }
}

/// `[queue]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// How often the scheduler looks for due rows when it found none (a new event starts at
    /// once, without waiting for a poll).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Longest a target's `Retry-After` holds its whole provider on a node: the answered
    /// event itself waits as long as the header says (up to `retry.cap`), but one event's
    /// absurd header must not stop every other event of the provider for hours.
    #[serde(with = "humantime_serde")]
    pub max_target_pause: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            max_target_pause: Duration::from_secs(60),
        }
    }
}

/// `[tracing]`: spans exported over OTLP/HTTP (protobuf). Off while `endpoint` is unset;
/// then no request allocates anything for traces.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's traces URL, e.g. `http://localhost:4318/v1/traces` (used as
    /// written, like `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). Unset: tracing is off.
    pub endpoint: Option<String>,
    /// Headers sent with every export, each read from the environment variable named:
    /// `{ "x-honeycomb-team" = "HONEYCOMB_API_KEY" }`. Unset or empty variables stop the
    /// node at start, naming them.
    pub headers_env: std::collections::BTreeMap<String, String>,
    /// The values read from `headers_env` (never from the file).
    #[serde(skip)]
    pub headers: Vec<(String, Secret)>,
    /// A PEM file of the CA to trust for an `https://` endpoint; unset: the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// Share of the traces that start here which are recorded (0.0–1.0). A request whose
    /// `traceparent` says sampled (or not) keeps its sender's decision while
    /// `trust_incoming` holds.
    pub sampling_ratio: f64,
    /// Whether a sender's `traceparent` is continued (the request's span its child, its
    /// sampling decision kept). `false` (the trust boundary): every request starts a trace
    /// of hookgate's own, sampled by `sampling_ratio`, its span linked to the sender's.
    pub trust_incoming: bool,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Most spans in one export request.
    pub batch_size: usize,
    /// Spans waiting for the exporter; past it, spans are dropped and counted
    /// (`hookgate_trace_spans_total{outcome="dropped"}`), never waited for.
    pub queue_size: usize,
    /// Longest a finished span waits for a batch to fill before it is sent.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Time limit of one export request.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl TracingConfig {
    /// The endpoint as logs and `check-config` show it: no user, password or query (a
    /// backend's key may ride in either).
    pub fn endpoint_shown(&self) -> Option<String> {
        let url = self.endpoint.as_deref()?;
        let Some((scheme, rest)) = url.split_once("://") else {
            return Some("(not a URL)".into());
        };
        let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (path, query) = path
            .split_once('?')
            .map_or((path, false), |(p, _)| (p, true));
        Some(format!(
            "{scheme}://{host}{path}{}",
            if query { "?***" } else { "" }
        ))
    }
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            headers_env: Default::default(),
            headers: Vec::new(),
            ca_file: None,
            sampling_ratio: 1.0,
            trust_incoming: true,
            service_name: "hookgate".into(),
            batch_size: 512,
            queue_size: 8192,
            flush_interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

/// `[cache]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Done results kept in memory across all shards; 0 turns the cache off.
    pub capacity: usize,
    /// Bytes of cached answers kept across all shards (bodies, keys, fingerprints). A
    /// byte size.
    #[serde(deserialize_with = "byte_size")]
    pub max_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `json` (one object a line) or `term` (human-readable).
    pub format: LogFormat,
    /// `trace`, `debug`, `info`, `warning`, `error` or `critical`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Json,
            level: "info".into(),
        }
    }
}

/// The log line format.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object a line on stdout.
    Json,
    /// Human-readable lines on stdout.
    Term,
}

/// `[shutdown]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// How long in-flight requests may run after SIGTERM before their leases are released.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(15),
        }
    }
}

/// `[retention]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Done rows older than this are deleted; must cover the senders' retry horizon.
    #[serde(with = "humantime_serde")]
    pub done: Duration,
    /// Dead letters older than this are deleted.
    #[serde(with = "humantime_serde")]
    pub dead: Duration,
    /// How often the sweeper runs.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Rows deleted per statement, so no sweep holds many row locks at once.
    pub sweep_batch: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            done: Duration::from_secs(7 * 24 * 3600),
            dead: Duration::from_secs(30 * 24 * 3600),
            sweep_interval: Duration::from_secs(60),
            sweep_batch: 1000,
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Name of the environment variable holding the bearer token; unset disables `/admin/`.
    pub token_env: Option<String>,
    /// The token itself, read from `token_env` by [`Config::resolve_secrets`] (tests set
    /// it directly). Never read from the file.
    #[serde(skip)]
    pub token: Option<Secret>,
    /// How long this node answers `/admin/api/stats` from the counts it last read: counting
    /// rows per provider and status reads the whole table, and each open console asks every
    /// five seconds. Zero: counted on every call (one at a time).
    #[serde(with = "humantime_serde")]
    pub stats_max_age: Duration,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            token_env: None,
            token: None,
            // Three of the console's polls: with a few tabs open, the table is counted
            // once in this long instead of once per tab every five seconds.
            stats_max_age: Duration::from_secs(15),
        }
    }
}

/// The config file used when none is named.
pub const DEFAULT_PATH: &str = "config/hookgate.toml";

impl Config {
    /// How long a stop may take: the HTTP server lets requests in flight finish for the
    /// configured grace, but never less than the longest target timeout plus the store's
    /// deadline, so a delivery that reached the target is recorded and answered.
    pub fn shutdown_limit(&self) -> Duration {
        let longest = self
            .providers
            .iter()
            .map(|p| p.target.timeout)
            .max()
            .unwrap_or_default();
        self.shutdown.grace.max(
            longest
                .saturating_add(self.store.deadline())
                .saturating_add(Duration::from_secs(1)),
        )
    }

    /// How long `provider`'s sender retries: its own setting, its preset's, else
    /// `retry.sender_horizon`.
    pub fn sender_horizon(&self, provider: &ProviderConfig) -> Duration {
        provider
            .sender_horizon
            .or_else(|| preset_horizon(provider.preset()))
            .unwrap_or(self.retry.sender_horizon)
    }

    /// The store deadline when `store.statement_timeout` is not written: a third of the
    /// lease (so an outcome write fits inside it with room to retry), at most
    /// [`DEFAULT_DEADLINE`](super::store::DEFAULT_DEADLINE).
    pub fn derived_deadline(&self) -> Duration {
        let third = (self.lease.duration / 3).min(super::store::DEFAULT_DEADLINE);
        // Whole milliseconds: the deadline is also Postgres's `statement_timeout`.
        Duration::from_millis(u64::try_from(third.as_millis()).unwrap_or(u64::MAX))
    }

    /// Fills what is derived from other settings when not written (the store deadline
    /// from the lease). Done once loaded and checked, so the rules still know what the
    /// operator wrote.
    pub fn settle(&mut self) {
        if self.store.statement_timeout.is_none() {
            self.store.statement_timeout = Some(self.derived_deadline());
        }
    }

    /// The provider called `name`.
    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }
}
