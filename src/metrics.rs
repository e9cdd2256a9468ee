//! Prometheus metrics for one node, served at `GET /metrics`.
//!
//! Each node owns its registry (no process-global recorder), so several nodes in one
//! process — the test suite — never mix their counts. Recording is a few atomic adds.
//!
//! Every label value comes from a closed set: configured provider names (the HTTP layer
//! passes `unknown` for any other name a request carries), and path, reason, outcome and
//! kind names written in the code. A request can never add a label value.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::claim::Path;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    provider: String,
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    provider: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    provider: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    shard: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActorLabels {
    actor: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Delivery latency buckets: 1 ms doubling to ~33 s, covering a local target up to the
/// longest sensible target timeout.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Outcome-write buckets: 0.5 ms doubling to ~16 s (a write waits for its group commit,
/// and through a store outage it is retried until it lands).
fn writing_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Minutes of paths kept for the console's chart.
const RECENT_MINUTES: u64 = 60;

/// Minutes since the Unix epoch.
fn unix_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// The metrics of one node.
pub struct Metrics {
    /// Paths per (minute, provider) over the last hour, for the console.
    recent: dashmap::DashMap<(u64, String), std::collections::HashMap<&'static str, u64>>,
    registry: Registry,
    attempts: Family<PathLabels, Counter>,
    deliveries: Family<OutcomeLabels, Counter>,
    latency: Family<ProviderLabels, Histogram, fn() -> Histogram>,
    writing: Family<ProviderLabels, Histogram, fn() -> Histogram>,
    dead: Family<ReasonLabels, Counter>,
    rejected: Family<ReasonLabels, Counter>,
    cache_hits: Counter,
    cache_misses: Counter,
    mailbox: Family<ShardLabels, Gauge>,
    store_errors: Family<KindLabels, Counter>,
    swept: Family<KindLabels, Counter>,
    admission: Family<ShardLabels, Gauge>,
    cache_bytes: Gauge,
    body_bytes: Gauge,
    queue_rows: Family<ProviderLabels, Gauge>,
    queue_oldest: Family<ProviderLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    scheduler_polls: Counter,
    queue_taken: Family<ProviderLabels, Counter>,
    panics: Family<ActorLabels, Counter>,
    paused: Family<ProviderLabels, Gauge>,
    target_pause: Family<ProviderLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    retention_backlog: Gauge<f64, std::sync::atomic::AtomicU64>,
    table_bytes: Family<TableLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("hookgate");
        let attempts = Family::<PathLabels, Counter>::default();
        let deliveries = Family::<OutcomeLabels, Counter>::default();
        let latency = Family::<ProviderLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let writing = Family::<ProviderLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            writing_histogram,
        );
        let dead = Family::<ReasonLabels, Counter>::default();
        let rejected = Family::<ReasonLabels, Counter>::default();
        let cache_hits = Counter::default();
        let cache_misses = Counter::default();
        let mailbox = Family::<ShardLabels, Gauge>::default();
        let store_errors = Family::<KindLabels, Counter>::default();
        let swept = Family::<KindLabels, Counter>::default();
        let admission = Family::<ShardLabels, Gauge>::default();
        let cache_bytes = Gauge::default();
        let body_bytes = Gauge::default();
        let queue_rows = Family::<ProviderLabels, Gauge>::default();
        let queue_oldest =
            Family::<ProviderLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let scheduler_polls = Counter::default();
        let queue_taken = Family::<ProviderLabels, Counter>::default();
        let panics = Family::<ActorLabels, Counter>::default();
        let paused = Family::<ProviderLabels, Gauge>::default();
        registry.register(
            "provider_paused",
            "Whether an operator paused the provider (1): nothing of it is delivered",
            paused.clone(),
        );
        let retention_backlog = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "retention_backlog_seconds",
            "How far past its retention the oldest kept done row or dead letter was after \
             the last retention pass (0: retention keeps up)",
            retention_backlog.clone(),
        );
        let table_bytes = Family::<TableLabels, Gauge>::default();
        registry.register(
            "table_bytes",
            "Bytes each of hookgate's tables takes in the store (rows, indexes, out-of-line \
             values), as of the last retention pass",
            table_bytes.clone(),
        );
        let target_pause =
            Family::<ProviderLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "target_pause_seconds",
            "Seconds left of the pause the provider's target asked for with Retry-After, on \
             this node (at most queue.max_target_pause; 0 when none)",
            target_pause.clone(),
        );
        registry.register(
            "log_lines_dropped",
            "Log records dropped because the log writer fell behind (this process)",
            crate::logging::dropped_total(),
        );
        registry.register(
            "actor_panics",
            "Panics caught in a worker (restarted) or seen in a shard (the node stops)",
            panics.clone(),
        );
        registry.register(
            "attempts",
            "Deliveries received, by provider and path",
            attempts.clone(),
        );
        registry.register(
            "deliveries",
            "Deliveries to the target, by outcome",
            deliveries.clone(),
        );
        registry.register(
            "delivery_seconds",
            "Time the target took to answer",
            latency.clone(),
        );
        registry.register(
            "outcome_write_seconds",
            "From the target's answer to the outcome written to the row: a crash in this \
             window sends the event again",
            writing.clone(),
        );
        registry.register(
            "dead_letters",
            "Events that became dead letters, by reason",
            dead.clone(),
        );
        registry.register(
            "rejected",
            "Requests refused before any claim, by reason",
            rejected.clone(),
        );
        registry.register(
            "cache_hits",
            "Duplicates answered from a shard's done cache",
            cache_hits.clone(),
        );
        registry.register(
            "cache_misses",
            "Requests the done cache could not answer",
            cache_misses.clone(),
        );
        registry.register(
            "shard_mailbox_depth",
            "Requests queued for each shard",
            mailbox.clone(),
        );
        registry.register(
            "store_errors",
            "Store operations that failed, by kind",
            store_errors.clone(),
        );
        registry.register(
            "swept_rows",
            "Rows deleted by the retention sweeper, by status",
            swept.clone(),
        );
        registry.register(
            "admission_waiting",
            "Requests waiting for a free worker before claiming, per shard",
            admission.clone(),
        );
        registry.register(
            "body_bytes_in_flight",
            "Request-body bytes the node holds now (server.max_body_bytes_in_flight bounds it)",
            body_bytes.clone(),
        );
        registry.register(
            "cache_bytes",
            "Bytes held by the done cache (estimated)",
            cache_bytes.clone(),
        );
        registry.register(
            "queue_rows",
            "Queue-mode rows not finished (queued, failed or in progress), by provider",
            queue_rows.clone(),
        );
        registry.register(
            "queue_oldest_due_seconds",
            "How long the oldest due queue row has waited, by provider",
            queue_oldest.clone(),
        );
        registry.register(
            "scheduler_polls",
            "Passes of the queue scheduler",
            scheduler_polls.clone(),
        );
        registry.register(
            "queue_taken",
            "Queue rows taken for an attempt, by provider",
            queue_taken.clone(),
        );
        Self {
            recent: dashmap::DashMap::new(),
            registry,
            attempts,
            deliveries,
            latency,
            writing,
            dead,
            rejected,
            cache_hits,
            cache_misses,
            mailbox,
            store_errors,
            swept,
            admission,
            cache_bytes,
            body_bytes,
            queue_rows,
            queue_oldest,
            scheduler_polls,
            queue_taken,
            panics,
            paused,
            target_pause,
            retention_backlog,
            table_bytes,
        }
    }

    /// A panic in an actor: `worker` (caught, restarted) or `shard` (the node stops).
    pub fn actor_panic(&self, actor: &'static str) {
        self.panics.get_or_create(&ActorLabels { actor }).inc();
    }

    /// A queue row of `provider` was taken for an attempt.
    pub fn queue_taken(&self, provider: &str) {
        self.queue_taken
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .inc();
    }

    /// One pass of the queue scheduler.
    pub fn scheduler_poll(&self) {
        self.scheduler_polls.inc();
    }

    /// `provider`'s unfinished queue rows and its oldest due row's wait.
    pub fn queue_depth(&self, provider: &str, rows: u64, oldest_due_seconds: f64) {
        let labels = ProviderLabels {
            provider: provider.to_owned(),
        };
        self.queue_rows
            .get_or_create(&labels)
            .set(i64::try_from(rows).unwrap_or(i64::MAX));
        self.queue_oldest
            .get_or_create(&labels)
            .set(oldest_due_seconds);
    }

    /// Creates the series whose label sets are known at start, at zero, so dashboards and
    /// alerts see every family from the first scrape: per-shard gauges, store error
    /// kinds, dead-letter reasons per provider, queue gauges per provider (any provider
    /// may hold queue rows: a row keeps the mode it was accepted in, and the shipped
    /// alerts read these families whatever the config).
    pub fn prime(&self, shards: usize, providers: &[&str]) {
        for shard in 0..shards {
            self.mailbox(shard, 0);
            self.admission_waiting(shard, 0);
        }
        for kind in [
            "unavailable",
            "timed_out",
            "busy",
            "transient",
            "query",
            "corrupt",
        ] {
            self.store_errors
                .get_or_create(&KindLabels { kind })
                .inc_by(0);
        }
        self.rejected
            .get_or_create(&ReasonLabels {
                provider: "unknown".into(),
                reason: "unknown_provider",
            })
            .inc_by(0);
        self.dead_letter_n("unknown", "provider_removed", 0);
        for actor in ["shard", "worker"] {
            self.panics.get_or_create(&ActorLabels { actor }).inc_by(0);
        }
        for &provider in providers {
            for reason in [
                "attempts_exhausted",
                "non_retryable",
                "replay_failed",
                "sender_gave_up",
                "throttled_too_long",
            ] {
                self.dead_letter_n(provider, reason, 0);
            }
            self.queue_depth(provider, 0, 0.0);
            self.paused(provider, false);
            self.target_pause(provider, 0.0);
            self.queue_taken
                .get_or_create(&ProviderLabels {
                    provider: provider.to_owned(),
                })
                .inc_by(0);
        }
    }

    /// The request-body bytes the node holds now (set when `/metrics` is read).
    pub fn body_bytes_in_flight(&self, bytes: usize) {
        self.body_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The gauge the done cache keeps its size in.
    pub fn cache_bytes_gauge(&self) -> Gauge {
        self.cache_bytes.clone()
    }

    /// A request started (`+1`) or stopped (`-1`) waiting for a worker of shard `shard`.
    pub fn admission_waiting(&self, shard: usize, delta: i64) {
        self.admission
            .get_or_create(&ShardLabels {
                shard: u32::try_from(shard).unwrap_or(u32::MAX),
            })
            .inc_by(delta);
    }

    /// One delivery received and labelled with `path`.
    pub fn attempt(&self, provider: &str, path: Path) {
        self.attempts
            .get_or_create(&PathLabels {
                provider: provider.to_owned(),
                path: path.as_str(),
            })
            .inc();
        let minute = unix_minute();
        match self.recent.get_mut(&(minute, provider.to_owned())) {
            Some(mut counts) => *counts.entry(path.as_str()).or_default() += 1,
            None => {
                self.recent
                    .entry((minute, provider.to_owned()))
                    .or_default()
                    .insert(path.as_str(), 1);
            }
        }
    }

    /// Paths a minute of `provider` over the last hour on this node, oldest first: each
    /// minute's start (Unix seconds) with its counts. Older minutes are forgotten.
    pub fn paths_per_minute(&self, provider: &str) -> Vec<(u64, Vec<(&'static str, u64)>)> {
        let now = unix_minute();
        self.recent
            .retain(|(minute, _), _| now.saturating_sub(*minute) < RECENT_MINUTES);
        let mut minutes: Vec<(u64, Vec<(&'static str, u64)>)> = self
            .recent
            .iter()
            .filter(|e| e.key().1 == provider)
            .map(|e| {
                let mut counts: Vec<(&'static str, u64)> =
                    e.value().iter().map(|(p, n)| (*p, *n)).collect();
                counts.sort_unstable();
                (e.key().0 * 60, counts)
            })
            .collect();
        minutes.sort_unstable_by_key(|(minute, _)| *minute);
        minutes
    }

    /// One delivery to the target ended with `outcome` after `seconds`.
    pub fn delivery(&self, provider: &str, outcome: &'static str, seconds: f64) {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                provider: provider.to_owned(),
                outcome,
            })
            .inc();
        self.latency
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .observe(seconds);
    }

    /// An attempt's outcome was written `seconds` after the target answered.
    pub fn outcome_written(&self, provider: &str, seconds: f64) {
        self.writing
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .observe(seconds);
    }

    /// Whether an operator paused `provider` (1) or not (0).
    pub fn paused(&self, provider: &str, paused: bool) {
        self.paused
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .set(i64::from(paused));
    }

    /// Seconds left of the pause `provider`'s target asked for (set when `/metrics` is
    /// read).
    pub fn target_pause(&self, provider: &str, seconds: f64) {
        self.target_pause
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .set(seconds);
    }

    /// How far past retention the oldest kept row is, after a retention pass.
    pub fn retention_backlog(&self, seconds: f64) {
        self.retention_backlog.set(seconds);
    }

    /// The bytes `table` takes in the store, as a retention pass read them.
    pub fn table_bytes(&self, table: &'static str, bytes: u64) {
        self.table_bytes
            .get_or_create(&TableLabels { table })
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// A taken queue row was given back without reaching the target.
    pub fn released(&self, provider: &str) {
        self.deliveries
            .get_or_create(&OutcomeLabels {
                provider: provider.to_owned(),
                outcome: "not_started",
            })
            .inc();
    }

    /// An event became a dead letter.
    pub fn dead_letter(&self, provider: &str, reason: &'static str) {
        self.dead
            .get_or_create(&ReasonLabels {
                provider: provider.to_owned(),
                reason,
            })
            .inc();
    }

    /// `n` events of `provider` became dead letters at once (the sweeper).
    pub fn dead_letter_n(&self, provider: &str, reason: &'static str, n: u64) {
        self.dead
            .get_or_create(&ReasonLabels {
                provider: provider.to_owned(),
                reason,
            })
            .inc_by(n);
    }

    /// A request was refused before any claim; `provider` is a configured name or
    /// `unknown`.
    pub fn rejected(&self, provider: &str, reason: &'static str) {
        self.rejected
            .get_or_create(&ReasonLabels {
                provider: provider.to_owned(),
                reason,
            })
            .inc();
    }

    /// A done-cache lookup.
    pub fn cache(&self, hit: bool) {
        if hit {
            self.cache_hits.inc();
        } else {
            self.cache_misses.inc();
        }
    }

    /// A request entered (`+1`) or left (`-1`) shard `shard`'s mailbox.
    pub fn mailbox(&self, shard: usize, delta: i64) {
        self.mailbox
            .get_or_create(&ShardLabels {
                shard: u32::try_from(shard).unwrap_or(u32::MAX),
            })
            .inc_by(delta);
    }

    /// A store operation failed.
    pub fn store_error(&self, kind: &'static str) {
        self.store_errors.get_or_create(&KindLabels { kind }).inc();
    }

    /// The sweeper deleted `n` rows of `status`.
    pub fn swept(&self, status: &'static str, n: u64) {
        self.swept
            .get_or_create(&KindLabels { kind: status })
            .inc_by(n);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_appear_in_the_text_exposition() {
        let m = Metrics::new();
        m.attempt("stripe", Path::FirstRun);
        m.attempt("stripe", Path::FirstRun);
        m.delivery("stripe", "delivered", 0.003);
        m.cache(true);
        let text = m.render();
        assert!(
            text.contains(r#"hookgate_attempts_total{provider="stripe",path="first_run"} 2"#),
            "{text}"
        );
        assert!(text.contains("hookgate_cache_hits_total 1"), "{text}");
        assert!(
            text.contains("hookgate_log_lines_dropped_total "),
            "served from the first scrape: {text}"
        );
        assert!(text.contains("hookgate_delivery_seconds_count{provider=\"stripe\"} 1"));
    }
}
