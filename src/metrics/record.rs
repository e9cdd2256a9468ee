//! What the node records into its metrics: one method a fact (an attempt's path, a
//! delivery's outcome and time, a refusal, a pause), each a few atomic adds.

use prometheus_client::metrics::gauge::Gauge;

use super::registry::{
    unix_minute, ActorLabels, DeadLabels, KindLabels, Metrics, OutcomeLabels, PathLabels,
    ProviderLabels, ReasonLabels, ShardLabels, TableLabels, RECENT_MINUTES,
};
use crate::claim::Path;

impl Metrics {
    /// A panic in an actor: `worker` (caught, restarted) or `shard` (the node stops).
    pub fn actor_panic(&self, actor: &'static str) {
        self.panics.get_or_create(&ActorLabels { actor }).inc();
    }

    /// A queue row of `provider` was taken for an attempt. (Every `provider` here is a
    /// row's scope: it is labelled as its provider and route.)
    pub fn queue_taken(&self, provider: &str) {
        self.queue_taken
            .get_or_create(&ProviderLabels::of(provider))
            .inc();
    }

    /// One pass of the queue scheduler.
    pub fn scheduler_poll(&self) {
        self.scheduler_polls.inc();
    }

    /// `provider`'s unfinished queue rows and its oldest due row's wait.
    pub fn queue_depth(&self, provider: &str, rows: u64, oldest_due_seconds: f64) {
        let labels = ProviderLabels::of(provider);
        self.queue_rows
            .get_or_create(&labels)
            .set(i64::try_from(rows).unwrap_or(i64::MAX));
        self.queue_oldest
            .get_or_create(&labels)
            .set(oldest_due_seconds);
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
                provider: crate::key::provider_of(provider).to_owned(),
                route: crate::key::route_of(provider).to_owned(),
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
                provider: crate::key::provider_of(provider).to_owned(),
                route: crate::key::route_of(provider).to_owned(),
                outcome,
            })
            .inc();
        self.latency
            .get_or_create(&ProviderLabels::of(provider))
            .observe(seconds);
    }

    /// An attempt's outcome was written `seconds` after the target answered.
    pub fn outcome_written(&self, provider: &str, seconds: f64) {
        self.writing
            .get_or_create(&ProviderLabels::of(provider))
            .observe(seconds);
    }

    /// Whether an operator paused `provider` (1) or not (0).
    pub fn paused(&self, provider: &str, paused: bool) {
        self.paused
            .get_or_create(&ProviderLabels::of(provider))
            .set(i64::from(paused));
    }

    /// Seconds left of the pause `provider`'s target asked for (set when `/metrics` is
    /// read).
    pub fn target_pause(&self, provider: &str, seconds: f64) {
        self.target_pause
            .get_or_create(&ProviderLabels::of(provider))
            .set(seconds);
    }

    /// The window of deliveries at once `provider` ramps up through after a pause, 0 when it
    /// does not ramp (set when `/metrics` is read).
    pub fn gate_window(&self, provider: &str, window: usize) {
        self.gate_window
            .get_or_create(&ProviderLabels::of(provider))
            .set(i64::try_from(window).unwrap_or(i64::MAX));
    }

    /// How far past retention the oldest kept row is, after a retention pass.
    pub fn retention_backlog(&self, seconds: f64) {
        self.retention_backlog.set(seconds);
    }

    /// A retention pass failed, wholly or in one of its steps.
    pub fn retention_failed(&self) {
        self.retention_failed.inc();
    }

    /// The longest time one transaction of the last retention pass held the tables' lock.
    pub fn retention_lock(&self, seconds: f64) {
        self.retention_lock.set(seconds);
    }

    /// The bytes the node's filters of sealed slots' keys take, after a retention pass.
    pub fn slot_filter_bytes(&self, bytes: u64) {
        self.slot_filter_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
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
                provider: crate::key::provider_of(provider).to_owned(),
                route: crate::key::route_of(provider).to_owned(),
                outcome: "not_started",
            })
            .inc();
    }

    /// An event became a dead letter.
    pub fn dead_letter(&self, provider: &str, reason: &'static str) {
        self.dead
            .get_or_create(&DeadLabels {
                provider: crate::key::provider_of(provider).to_owned(),
                route: crate::key::route_of(provider).to_owned(),
                reason,
            })
            .inc();
    }

    /// `n` events of `provider` became dead letters at once (the sweeper).
    pub fn dead_letter_n(&self, provider: &str, reason: &'static str, n: u64) {
        self.dead
            .get_or_create(&DeadLabels {
                provider: crate::key::provider_of(provider).to_owned(),
                route: crate::key::route_of(provider).to_owned(),
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
}
