//! The last step of an attempt: what its recorded verdict tells the sender. Logs and
//! counts the finished attempt and builds the [`Answer`] from what the fenced write did to
//! the row — the result, a dead letter, or when to come back and why.

use std::sync::Arc;
use std::time::Duration;

use slog::{error, info, warn, Logger};

use super::answer::{Answer, Reply, RetryReason, STORE_RETRY_AFTER_SECS};
use super::attempt::{ceil_secs, Attempt, Recorded};
use crate::claim::Path;
use crate::metrics::Metrics;
use crate::outcome::Verdict;
use crate::store::{Fenced, StoreError};

impl Attempt {
    /// Logs and counts the finished attempt, and builds the sender's answer from what the
    /// fenced write did to the row. `lease` is the `Retry-After` after a crash.
    pub fn answer(
        &self,
        recorded: Recorded,
        lease: Duration,
        metrics: &Metrics,
        log: &Logger,
    ) -> Answer {
        let Recorded {
            verdict,
            written,
            took,
            writing,
        } = recorded;
        let outcome = match self.path {
            Path::Filtered => "filtered",
            _ => verdict.label(),
        };
        metrics.delivery(&self.event.id.provider, outcome, took.as_secs_f64());
        if let Some(writing) = writing {
            metrics.outcome_written(&self.event.id.provider, writing.as_secs_f64());
        }
        let reply = match written {
            Some(Ok(Fenced::Applied)) | None => self.reply(verdict, took, lease, metrics, log),
            Some(Ok(Fenced::Stale)) => self.stale(log),
            Some(Err(e)) => self.unrecorded(&e, metrics, log),
        };
        Answer {
            path: self.path,
            attempts: Some(self.attempts),
            reply,
        }
    }

    /// Another attempt took the row over: nothing was written (`stale_completion`).
    fn stale(&self, log: &Logger) -> Reply {
        let id = &self.event.id;
        warn!(log, "webhook.stale";
            "provider" => &*id.provider, "event_key" => &*id.key,
            "path" => Path::StaleCompletion.as_str(), "attempts" => self.attempts);
        Reply::RetryLater {
            retry_after: 1,
            reason: RetryReason::LeaseLost,
        }
    }

    /// The outcome could not be written within the lease.
    fn unrecorded(&self, e: &StoreError, metrics: &Metrics, log: &Logger) -> Reply {
        let id = &self.event.id;
        metrics.store_error(e.kind());
        error!(log, "webhook.failed";
            "provider" => &*id.provider, "event_key" => &*id.key,
            "error" => format!("recording the outcome: {e}"), "attempts" => self.attempts,
            "retry_after_s" => STORE_RETRY_AFTER_SECS);
        Reply::RetryLater {
            retry_after: STORE_RETRY_AFTER_SECS,
            reason: RetryReason::StoreUnavailable,
        }
    }

    /// The reply for a verdict the row now holds (or, after a crash, did not need).
    fn reply(
        &self,
        verdict: Verdict,
        took: Duration,
        lease: Duration,
        metrics: &Metrics,
        log: &Logger,
    ) -> Reply {
        let id = &self.event.id;
        let duration_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let (provider, key, attempts) = (&*id.provider, &*id.key, self.attempts);
        let mode = self.event.mode.as_str();
        match verdict {
            Verdict::Done(result) => {
                info!(log, "webhook.done";
                    "provider" => provider, "event_key" => key, "outcome" => "delivered",
                    "status" => result.status, "attempts" => attempts,
                    "duration_ms" => duration_ms, "mode" => mode);
                Reply::Result(Arc::new(result))
            }
            Verdict::Retry { error, retry_after } => {
                warn!(log, "webhook.failed";
                    "provider" => provider, "event_key" => key, "error" => &error,
                    "attempts" => attempts, "retry_after_s" => retry_after,
                    "duration_ms" => duration_ms, "mode" => mode);
                Reply::RetryLater {
                    retry_after,
                    reason: RetryReason::DeliveryFailed,
                }
            }
            Verdict::Dead { error, reason } => {
                metrics.dead_letter(provider, reason.as_str());
                warn!(log, "webhook.dead";
                    "provider" => provider, "event_key" => key, "error" => &error,
                    "reason" => reason.as_str(), "attempts" => attempts,
                    "duration_ms" => duration_ms, "mode" => mode);
                Reply::DeadLettered
            }
            Verdict::Throttled { error, retry_after } => {
                warn!(log, "webhook.failed";
                    "provider" => provider, "event_key" => key, "error" => &error,
                    "attempts" => attempts, "retry_after_s" => retry_after, "mode" => mode);
                Reply::RetryLater {
                    retry_after,
                    reason: RetryReason::DeliveryFailed,
                }
            }
            Verdict::Release { error } => {
                warn!(log, "webhook.failed";
                    "provider" => provider, "event_key" => key, "error" => &error,
                    "attempts" => attempts, "retry_after_s" => 1u64);
                Reply::RetryLater {
                    retry_after: 1,
                    reason: RetryReason::NotStarted,
                }
            }
            Verdict::Unknown { error } => {
                let retry_after = ceil_secs(lease);
                error!(log, "webhook.failed";
                    "provider" => provider, "event_key" => key,
                    "error" => &error, "attempts" => attempts,
                    "retry_after_s" => retry_after, "duration_ms" => duration_ms);
                Reply::RetryLater {
                    retry_after,
                    reason: RetryReason::WorkerCrashed,
                }
            }
        }
    }
}
