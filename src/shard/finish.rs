//! The end of an attempt: log it, count it, cache a done result, and build the sender's
//! answer from what the fenced write did to the row.

use std::sync::Arc;
use std::time::Duration;

use slog::{error, info, warn};

use super::cache::CachedDone;
use super::{ceil_secs, Answer, Event, Reply, Shard, STORE_RETRY_AFTER_SECS};
use crate::claim::Path;
use crate::outcome::Verdict;
use crate::store::{Fenced, StoreError};

impl Shard {
    /// Logs a finished attempt and builds its answer from what the row now says.
    pub(super) fn finished(
        &mut self,
        event: &Event,
        attempts: i32,
        path: Path,
        verdict: Verdict,
        written: Option<Result<Fenced, StoreError>>,
        took: Duration,
    ) -> Answer {
        let id = &event.id;
        let answer = |reply| Answer {
            path,
            attempts: Some(attempts),
            reply,
        };
        let duration_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let outcome = match &verdict {
            Verdict::Done(_) => "delivered",
            Verdict::Retry { .. } => "failed",
            Verdict::Dead { .. } => "dead",
            Verdict::Release { .. } => "not_started",
            Verdict::Unknown { .. } => "crashed",
        };
        self.metrics
            .delivery(&id.provider, outcome, took.as_secs_f64());
        match written {
            Some(Ok(Fenced::Applied)) | None => {}
            Some(Ok(Fenced::Stale)) => {
                warn!(self.log, "webhook.stale";
                    "provider" => &*id.provider, "event_key" => &*id.key,
                    "path" => Path::StaleCompletion.as_str(), "attempts" => attempts);
                return answer(Reply::RetryLater {
                    retry_after: 1,
                    reason: "lease_lost",
                });
            }
            Some(Err(e)) => {
                self.metrics.store_error(e.kind());
                error!(self.log, "webhook.failed";
                    "provider" => &*id.provider, "event_key" => &*id.key,
                    "error" => format!("recording the outcome: {e}"), "attempts" => attempts,
                    "retry_after_s" => STORE_RETRY_AFTER_SECS);
                return answer(Reply::RetryLater {
                    retry_after: STORE_RETRY_AFTER_SECS,
                    reason: "store_unavailable",
                });
            }
        }
        match verdict {
            Verdict::Done(result) => {
                info!(self.log, "webhook.done";
                    "provider" => &*id.provider, "event_key" => &*id.key,
                    "outcome" => "delivered", "status" => result.status,
                    "attempts" => attempts, "duration_ms" => duration_ms);
                let result = Arc::new(result);
                self.done.insert(
                    id.clone(),
                    CachedDone {
                        attempts,
                        fingerprint: event.fingerprint.clone(),
                        result: Arc::clone(&result),
                    },
                );
                answer(Reply::Result(result))
            }
            Verdict::Retry { error, retry_after } => {
                warn!(self.log, "webhook.failed";
                    "provider" => &*id.provider, "event_key" => &*id.key, "error" => &error,
                    "attempts" => attempts, "retry_after_s" => retry_after,
                    "duration_ms" => duration_ms);
                answer(Reply::RetryLater {
                    retry_after,
                    reason: "delivery_failed",
                })
            }
            Verdict::Dead { error, reason } => {
                self.metrics.dead_letter(&id.provider, reason.as_str());
                warn!(self.log, "webhook.dead";
                    "provider" => &*id.provider, "event_key" => &*id.key, "error" => &error,
                    "reason" => reason.as_str(), "attempts" => attempts,
                    "duration_ms" => duration_ms);
                answer(Reply::DeadLettered)
            }
            Verdict::Release { error } => {
                warn!(self.log, "webhook.failed";
                    "provider" => &*id.provider, "event_key" => &*id.key, "error" => &error,
                    "attempts" => attempts, "retry_after_s" => 1u64);
                answer(Reply::RetryLater {
                    retry_after: 1,
                    reason: "not_started",
                })
            }
            Verdict::Unknown { error } => {
                let retry_after = ceil_secs(self.settings.lease);
                error!(self.log, "webhook.failed";
                    "provider" => &*id.provider, "event_key" => &*id.key,
                    "error" => format!("worker crashed: {error}"), "attempts" => attempts,
                    "retry_after_s" => retry_after, "duration_ms" => duration_ms);
                answer(Reply::RetryLater {
                    retry_after,
                    reason: "worker_crashed",
                })
            }
        }
    }
}
