//! A node's metrics registry: every family hookgate exports, with its labels and buckets,
//! registered once ([`Metrics::new`]), primed so the shipped alerts see every series from
//! the first scrape, and rendered as Prometheus text. What records into them is
//! `record.rs`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PathLabels {
    pub(super) provider: String,
    pub(super) route: String,
    pub(super) path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    pub(super) provider: String,
    pub(super) route: String,
    pub(super) outcome: &'static str,
}

/// A provider and one of its routes, from a row's scope (`stripe`: its main route;
/// `stripe.analytics`: the route `analytics`). Both come from the config: bounded.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ProviderLabels {
    pub(super) provider: String,
    pub(super) route: String,
}

impl ProviderLabels {
    pub(super) fn of(scope: &str) -> Self {
        Self {
            provider: crate::key::provider_of(scope).to_owned(),
            route: crate::key::route_of(scope).to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DeadLabels {
    pub(super) provider: String,
    pub(super) route: String,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) provider: String,
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShardLabels {
    pub(super) shard: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ActorLabels {
    pub(super) actor: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) kind: &'static str,
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
pub(super) const RECENT_MINUTES: u64 = 60;

/// Minutes since the Unix epoch.
pub(super) fn unix_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// The metrics of one node.
pub struct Metrics {
    /// Paths per (minute, provider) over the last hour, for the console.
    pub(super) recent:
        dashmap::DashMap<(u64, String), std::collections::HashMap<&'static str, u64>>,
    pub(super) registry: Registry,
    pub(super) attempts: Family<PathLabels, Counter>,
    pub(super) deliveries: Family<OutcomeLabels, Counter>,
    pub(super) latency: Family<ProviderLabels, Histogram, fn() -> Histogram>,
    pub(super) writing: Family<ProviderLabels, Histogram, fn() -> Histogram>,
    pub(super) dead: Family<DeadLabels, Counter>,
    pub(super) rejected: Family<ReasonLabels, Counter>,
    pub(super) cache_hits: Counter,
    pub(super) cache_misses: Counter,
    pub(super) mailbox: Family<ShardLabels, Gauge>,
    pub(super) store_errors: Family<KindLabels, Counter>,
    pub(super) swept: Family<KindLabels, Counter>,
    pub(super) admission: Family<ShardLabels, Gauge>,
    pub(super) cache_bytes: Gauge,
    pub(super) body_bytes: Gauge,
    pub(super) queue_rows: Family<ProviderLabels, Gauge>,
    pub(super) queue_oldest: Family<ProviderLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(super) scheduler_polls: Counter,
    pub(super) queue_taken: Family<ProviderLabels, Counter>,
    pub(super) panics: Family<ActorLabels, Counter>,
    pub(super) paused: Family<ProviderLabels, Gauge>,
    pub(super) target_pause: Family<ProviderLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(super) gate_window: Family<ProviderLabels, Gauge>,
    pub(super) retention_backlog: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(super) retention_failed: Counter,
    pub(super) retention_lock: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(super) slot_filter_bytes: Gauge,
    pub(super) table_bytes: Family<TableLabels, Gauge>,
    pub(super) spans: TraceCounters,
}

/// The exporter's counts of spans, by what became of them: `hookgate_trace_spans_total`.
#[derive(Debug, Clone)]
pub struct TraceCounters {
    /// Sent to the collector, which took them.
    pub exported: Counter,
    /// Dropped because the exporter's queue was full.
    pub dropped: Counter,
    /// Sent in an export the collector refused or that failed.
    pub failed: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SpanLabels {
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TableLabels {
    pub(super) table: &'static str,
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
        let dead = Family::<DeadLabels, Counter>::default();
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
        let retention_failed = Counter::default();
        registry.register(
            "retention_failed_passes",
            "Retention passes that failed, wholly or in one of their steps: what they could \
             not remove is left for the next pass (see retention.pass_failed log lines)",
            retention_failed.clone(),
        );
        let retention_lock = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "retention_lock_seconds",
            "The longest time one transaction of the last retention pass held the tables' \
             lock that claims wait behind (0 for a store that takes none)",
            retention_lock.clone(),
        );
        let slot_filter_bytes = Gauge::default();
        registry.register(
            "slot_filter_bytes",
            "Bytes of memory this node's filters of the ring's sealed slots' keys take \
             (Postgres; store.slot_filter_keys bounds them), as of the last retention pass",
            slot_filter_bytes.clone(),
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
        let gate_window = Family::<ProviderLabels, Gauge>::default();
        registry.register(
            "gate_window",
            "Deliveries at once this node allows the route while it ramps up after a pause \
             (1 at first, one more per success; 0 when it is not ramping)",
            gate_window.clone(),
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
        let span_family = Family::<SpanLabels, Counter>::default();
        // Each counter has two owners: the family renders it, the exporter counts on it.
        let span = |outcome| span_family.get_or_create_owned(&SpanLabels { outcome });
        let spans = TraceCounters {
            exported: span("exported"),
            dropped: span("dropped"),
            failed: span("failed"),
        };
        registry.register(
            "trace_spans",
            "Spans of this node's traces, by what became of them: exported, dropped (the \
             exporter's queue was full) or failed (the collector refused or did not answer)",
            span_family,
        );
        Self {
            spans,
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
            gate_window,
            retention_backlog,
            retention_failed,
            retention_lock,
            slot_filter_bytes,
            table_bytes,
        }
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
            "sealed",
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
                "unreadable",
            ] {
                self.dead_letter_n(provider, reason, 0);
            }
            self.queue_depth(provider, 0, 0.0);
            self.paused(provider, false);
            self.target_pause(provider, 0.0);
            self.gate_window(provider, 0);
            self.queue_taken
                .get_or_create(&ProviderLabels::of(provider))
                .inc_by(0);
        }
    }

    /// The counters the trace exporter counts its spans on.
    pub fn trace_counters(&self) -> TraceCounters {
        self.spans.clone()
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
    use crate::claim::Path;

    #[test]
    fn counts_appear_in_the_text_exposition() {
        let m = Metrics::new();
        m.attempt("stripe", Path::FirstRun);
        m.attempt("stripe", Path::FirstRun);
        m.attempt("stripe.crm", Path::FirstRun);
        m.delivery("stripe", "delivered", 0.003);
        m.cache(true);
        let text = m.render();
        assert!(
            text.contains(
                r#"hookgate_attempts_total{provider="stripe",route="main",path="first_run"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"hookgate_attempts_total{provider="stripe",route="crm",path="first_run"} 1"#
            ),
            "a route's scope is its provider and route: {text}"
        );
        assert!(text.contains("hookgate_cache_hits_total 1"), "{text}");
        assert!(
            text.contains("hookgate_log_lines_dropped_total "),
            "served from the first scrape: {text}"
        );
        assert!(
            text.contains("hookgate_delivery_seconds_count{provider=\"stripe\",route=\"main\"} 1")
        );
    }
}
