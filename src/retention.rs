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
//! deleted, never `in_progress` or `failed` ones. A pass that fails is counted and keeps
//! the backlog growing, so a store whose passes always fail is not read as one that keeps
//! up.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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

/// How a retention pass ended, as the backlog it publishes reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Every step ran: the store's backlog.
    Good(Duration),
    /// A step failed while the rest ran: the store's backlog as the pass left it.
    StepFailed(Duration),
    /// The pass returned an error, and no backlog of its own.
    Failed,
}

/// The backlog a pass publishes, given the last one published and the time since the last
/// pass that did not fail ended (or since the sweeper started, if none did).
///
/// A good pass publishes the store's own figure. A failed pass has removed nothing, or not
/// all it should have, since the last good one: rows have gone on passing their retention
/// all that time, so it publishes the store's figure if it has one and the last published
/// one if not, but never less than the time since the last good pass. That time is how
/// long retention has not been done, a bound on how far behind it may be rather than a
/// measure: it keeps the backlog rising while passes fail, where the store's last figure
/// would stay flat, or read zero forever.
fn published_backlog(pass: Pass, last: Duration, since_good: Duration) -> Duration {
    match pass {
        Pass::Good(backlog) => backlog,
        Pass::StepFailed(backlog) => backlog.max(since_good),
        Pass::Failed => last.max(since_good),
    }
}

/// What the sweeper remembers from one pass to the next, for the backlog of a failed one.
#[derive(Debug, Clone, Copy)]
struct Passes {
    /// When the last pass that did not fail ended; when the sweeper was made, before any.
    last_good: Instant,
    /// The backlog the last pass published.
    published: Duration,
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
    /// The backlog rule's memory. Behind a `std::sync::Mutex`: it is locked only to read
    /// and write these two values, never across an `.await`.
    passes: Mutex<Passes>,
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
            passes: Mutex::new(Passes {
                last_good: Instant::now(),
                published: Duration::ZERO,
            }),
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
    /// the pass's budget), then the backlog, the longest lock and the tables' sizes
    /// published as metrics.
    ///
    /// A pass fails when the store answers an error (returned here) or says one of its
    /// steps failed (the report is returned): either way it is counted in
    /// `hookgate_retention_failed_passes_total` and logged as `retention.pass_failed`, and
    /// the backlog it publishes is at least the time since the last pass that did not fail
    /// ([`published_backlog`] has the rule). A pass that returned an error leaves the lock
    /// gauge as it was: it has no figure to give.
    pub async fn run_once(&self) -> Result<SweepReport, StoreError> {
        let policy = Retention {
            done: self.retention.done,
            dead: self.retention.dead,
            batch: self.retention.sweep_batch,
            budget: self.retention.sweep_interval / BUDGET_SHARE,
            interval: self.retention.sweep_interval,
        };
        let retained = match self.store.retain(&policy).await {
            Ok(retained) => retained,
            Err(e) => {
                let backlog = self.publish_backlog(Pass::Failed);
                self.metrics.retention_failed();
                warn!(self.log, "retention.pass_failed"; "error" => %e,
                    "backlog_s" => backlog.as_secs());
                return Err(e);
            }
        };
        self.metrics.swept(Status::Done.as_str(), retained.done);
        self.metrics.swept(Status::Dead.as_str(), retained.dead);
        self.metrics
            .retention_lock(retained.longest_lock.as_secs_f64());
        let backlog = match &retained.failed {
            None => self.publish_backlog(Pass::Good(retained.backlog)),
            Some(error) => {
                let backlog = self.publish_backlog(Pass::StepFailed(retained.backlog));
                self.metrics.retention_failed();
                warn!(self.log, "retention.pass_failed"; "error" => error,
                    "backlog_s" => backlog.as_secs());
                backlog
            }
        };
        let report = SweepReport {
            done: retained.done,
            dead: retained.dead,
        };
        if report != SweepReport::default() {
            info!(self.log, "retention.swept"; "done" => report.done, "dead" => report.dead,
                "backlog_s" => backlog.as_secs(),
                "longest_lock_ms" => retained.longest_lock.as_millis());
        }
        self.metrics.slot_filter_bytes(retained.filter_bytes);
        for filter in &retained.filters {
            info!(self.log, "retention.slot_filter"; "slot" => filter.slot,
                "keys" => filter.keys, "bytes" => filter.bytes);
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

    /// Works out the backlog `pass` publishes ([`published_backlog`]), publishes it and
    /// remembers it; a good pass also becomes the last good one. Answers the backlog.
    fn publish_backlog(&self, pass: Pass) -> Duration {
        // The values are plain and written together: a panic elsewhere cannot leave them
        // half-written, so a poisoned lock's values are still good.
        let mut passes = self.passes.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let backlog = published_backlog(
            pass,
            passes.published,
            now.saturating_duration_since(passes.last_good),
        );
        if let Pass::Good(_) = pass {
            passes.last_good = now;
        }
        passes.published = backlog;
        self.metrics.retention_backlog(backlog.as_secs_f64());
        backlog
    }

    /// Runs a pass every `retention.sweep_interval` until the task is dropped.
    pub async fn run_forever(self) {
        let mut every = tokio::time::interval(self.retention.sweep_interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            // A failed pass is counted and logged (`retention.pass_failed`) by the pass.
            let _ = self.run_once().await;
            if let Err(e) = self.abandon_once().await {
                warn!(self.log, "retention.abandon_failed"; "error" => %e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);
    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_good_pass_publishes_the_stores_backlog_however_long_passes_failed_before() {
        assert_eq!(published_backlog(Pass::Good(MINUTE), HOUR, HOUR), MINUTE);
        assert_eq!(
            published_backlog(Pass::Good(Duration::ZERO), HOUR, HOUR),
            Duration::ZERO
        );
    }

    #[test]
    fn a_pass_that_returned_an_error_publishes_at_least_the_time_since_the_last_good_one() {
        // An hour of failed passes after a store that kept up reads an hour.
        assert_eq!(published_backlog(Pass::Failed, Duration::ZERO, HOUR), HOUR);
        // A backlog the store reported before is not forgotten for a shorter time.
        assert_eq!(published_backlog(Pass::Failed, 2 * HOUR, MINUTE), 2 * HOUR);
    }

    #[test]
    fn a_pass_with_a_failed_step_publishes_its_own_backlog_but_never_less_than_the_time_since_the_last_good_one(
    ) {
        assert_eq!(
            published_backlog(Pass::StepFailed(Duration::ZERO), Duration::ZERO, HOUR),
            HOUR
        );
        assert_eq!(
            published_backlog(Pass::StepFailed(2 * HOUR), 3 * HOUR, MINUTE),
            2 * HOUR,
            "its own figure, not the last published one"
        );
    }
}
