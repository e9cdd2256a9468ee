//! The retention sweeper: deletes `done` rows older than `retention.done` and dead
//! letters older than `retention.dead`, in bounded batches.
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
use crate::store::{Store, StoreError};

/// Batches one pass may delete per status; a larger backlog waits for the next pass, so
/// a pass after a long outage cannot monopolise the database.
const MAX_BATCHES_PER_PASS: u32 = 100;

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

    /// One pass over both statuses.
    pub async fn run_once(&self) -> Result<SweepReport, StoreError> {
        let report = SweepReport {
            done: self.sweep(Status::Done, self.retention.done).await?,
            dead: self.sweep(Status::Dead, self.retention.dead).await?,
        };
        if report != SweepReport::default() {
            info!(self.log, "retention.swept"; "done" => report.done, "dead" => report.dead);
        }
        Ok(report)
    }

    async fn sweep(&self, status: Status, age: Duration) -> Result<u64, StoreError> {
        let batch = self.retention.sweep_batch;
        let mut total = 0;
        for _ in 0..MAX_BATCHES_PER_PASS {
            let deleted = self.store.sweep(status, age, batch).await?;
            total += deleted;
            if deleted < u64::from(batch) {
                break;
            }
        }
        self.metrics.swept(status.as_str(), total);
        Ok(total)
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
