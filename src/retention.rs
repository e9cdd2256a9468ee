//! The retention sweeper: every `retention.sweep_interval` the store removes `done` rows
//! older than `retention.done` and dead letters older than `retention.dead` (each store its
//! own way, within half an interval), and the node publishes how far behind retention is
//! and how large its tables are.
//!
//! It also gives up on sync-mode events no sender will retry: a `failed` row, or an
//! `in_progress` one whose lease expired, untouched for longer than its provider's sender
//! horizon becomes a `sender_gave_up` dead letter, which people can read and replay. And a
//! queue row whose provider is no longer configured — nobody can deliver it — becomes a
//! `provider_removed` dead letter.
//!
//! [`Sweeper::run_once`] and [`Sweeper::abandon_once`] are one pass each (tests call them
//! by hand); the server runs both every `retention.sweep_interval`. Only terminal rows are
//! deleted, never `in_progress` or `failed` ones.

use std::sync::Arc;
use std::time::Duration;

use slog::{info, warn, Logger};

use crate::claim::Status;
use crate::config::RetentionConfig;
use crate::metrics::Metrics;
use crate::store::{Retention, Store, StoreError};

/// Batches one pass may turn into dead letters per provider (sender horizons, removed
/// providers); a larger backlog waits for the next pass, so a pass after a long outage
/// cannot monopolise the database.
const MAX_BATCHES_PER_PASS: u32 = 100;

/// The part of `retention.sweep_interval` one retention pass may spend removing rows: a
/// larger backlog is left for the next pass (and shows as the backlog metric), so
/// retention never runs into itself, nor holds the writer for a whole interval.
const BUDGET_SHARE: u32 = 2;

/// Rows one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// `done` rows deleted.
    pub done: u64,
    /// Dead letters deleted.
    pub dead: u64,
}

/// The sweeper of one node.
pub struct Sweeper {
    store: Arc<dyn Store>,
    retention: RetentionConfig,
    metrics: Arc<Metrics>,
    log: Logger,
    /// Each configured provider's sender horizon; the names are also the providers this
    /// node knows (queue rows of any other become `provider_removed` dead letters).
    horizons: Vec<(String, Duration)>,
    /// How long a queue row of an unknown provider stays untouched before that.
    orphan_grace: Duration,
}

impl Sweeper {
    /// A sweeper over `store` keeping rows as `retention` says.
    pub fn new(
        store: Arc<dyn Store>,
        retention: RetentionConfig,
        metrics: Arc<Metrics>,
        log: Logger,
    ) -> Self {
        Self {
            store,
            retention,
            metrics,
            log,
            horizons: Vec::new(),
            orphan_grace: Duration::from_secs(3 * 24 * 3600),
        }
    }

    /// Gives up on `provider`'s stale sync rows after its `horizon`, for each pair; these
    /// are also the providers the node knows.
    pub fn with_horizons(mut self, horizons: Vec<(String, Duration)>) -> Self {
        self.horizons = horizons;
        self
    }

    /// Queue rows of unknown providers become dead letters once untouched for `grace`
    /// (default 3 days; the node uses `retry.sender_horizon`).
    pub fn with_orphan_grace(mut self, grace: Duration) -> Self {
        self.orphan_grace = grace;
        self
    }

    /// One pass turning every provider's stale sync rows into `sender_gave_up` dead
    /// letters, and the due queue rows of providers not configured (none of the
    /// horizons' names) into `provider_removed` ones; answers how many.
    pub async fn abandon_once(&self) -> Result<u64, StoreError> {
        let batch = self.retention.sweep_batch;
        let mut total = 0;
        for (provider, horizon) in &self.horizons {
            for _ in 0..MAX_BATCHES_PER_PASS {
                let n = self.store.abandon(provider, *horizon, batch).await?;
                total += n;
                if n > 0 {
                    self.metrics.dead_letter_n(provider, "sender_gave_up", n);
                    warn!(self.log, "webhook.dead"; "provider" => provider,
                        "reason" => "sender_gave_up", "rows" => n);
                }
                if n < u64::from(batch) {
                    break;
                }
            }
        }
        match self.orphan_once().await {
            Ok(n) => total += n,
            Err(e) => warn!(self.log, "retention.orphan_failed"; "error" => %e),
        }
        Ok(total)
    }

    /// Due queue rows of providers not configured become `provider_removed` dead letters,
    /// once untouched for `retry.sender_horizon` (a grace for rolling deploys and config
    /// skew between nodes); never when the sweeper knows of no provider at all.
    async fn orphan_once(&self) -> Result<u64, StoreError> {
        if self.horizons.is_empty() {
            return Ok(0);
        }
        let batch = self.retention.sweep_batch;
        let known: Vec<String> = self.horizons.iter().map(|(p, _)| p.clone()).collect();
        let mut total = 0;
        for _ in 0..MAX_BATCHES_PER_PASS {
            let n = self.store.orphan(&known, self.orphan_grace, batch).await?;
            total += n;
            if n > 0 {
                self.metrics.dead_letter_n("unknown", "provider_removed", n);
                warn!(self.log, "webhook.dead"; "reason" => "provider_removed", "rows" => n);
            }
            if n < u64::from(batch) {
                break;
            }
        }
        Ok(total)
    }

    /// One retention pass (the store removes what is past retention its own way, within
    /// the pass's budget), then the backlog and the tables' sizes published as metrics.
    pub async fn run_once(&self) -> Result<SweepReport, StoreError> {
        let policy = Retention {
            done: self.retention.done,
            dead: self.retention.dead,
            batch: self.retention.sweep_batch,
            budget: self.retention.sweep_interval / BUDGET_SHARE,
            interval: self.retention.sweep_interval,
        };
        let retained = self.store.retain(&policy).await?;
        self.metrics.swept(Status::Done.as_str(), retained.done);
        self.metrics.swept(Status::Dead.as_str(), retained.dead);
        self.metrics
            .retention_backlog(retained.backlog.as_secs_f64());
        let report = SweepReport {
            done: retained.done,
            dead: retained.dead,
        };
        if report != SweepReport::default() {
            info!(self.log, "retention.swept"; "done" => report.done, "dead" => report.dead,
                "backlog_s" => retained.backlog.as_secs());
        }
        if !retained.backlog.is_zero() {
            warn!(self.log, "retention.behind"; "backlog_s" => retained.backlog.as_secs(),
                "message" => "rows past retention are left for the next pass");
        }
        match self.store.table_sizes().await {
            Ok(sizes) => {
                for size in sizes {
                    self.metrics.table_bytes(size.table, size.bytes);
                }
            }
            Err(e) => warn!(self.log, "retention.sizes_failed"; "error" => %e),
        }
        Ok(report)
    }

    /// Runs a pass every `retention.sweep_interval` until the task is dropped.
    pub async fn run_forever(self) {
        let mut every = tokio::time::interval(self.retention.sweep_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if let Err(e) = self.run_once().await {
                warn!(self.log, "retention.sweep_failed"; "error" => %e);
            }
            if let Err(e) = self.abandon_once().await {
                warn!(self.log, "retention.abandon_failed"; "error" => %e);
            }
        }
    }
}
