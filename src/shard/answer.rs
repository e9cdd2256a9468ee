//! What a shard tells the HTTP layer: the attempt's path and the answer for the sender.
//! The HTTP layer only renders it (`http/ingest.rs`); every decision was made here or in
//! the shard, from the row.

use std::sync::Arc;

use slog::{warn, Logger};

use super::cache::{DoneCache, Hit};
use crate::claim::{Path, StoredResult};
use crate::key::EventId;

/// The answer to one delivery.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The attempt's path (`Hookgate-Path`).
    pub path: Path,
    /// The row's attempts where a claim was made or read (`Hookgate-Attempt`).
    pub attempts: Option<i32>,
    /// What the sender gets.
    pub reply: Reply,
}

/// The sender's answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The target's result: fresh, or replayed from the row or the cache.
    Result(Arc<StoredResult>),
    /// 409: the key is held by a live lease; come back after `retry_after` seconds.
    Busy {
        /// Seconds left on the lease (at least 1).
        retry_after: u64,
    },
    /// 503: nothing is settled yet; come back after `retry_after` seconds.
    RetryLater {
        /// Seconds for `Retry-After`.
        retry_after: u64,
        /// A short machine-readable reason for the body.
        reason: &'static str,
    },
    /// 200 `{"status":"dead_lettered"}`: stop retrying, people will look at it.
    DeadLettered,
    /// 422: the key was seen with another payload.
    Mismatch,
    /// (Replays only) the row was not a dead letter, or another replay has it now.
    NotReplayable,
}

impl Answer {
    /// An answer with no claim behind it.
    pub fn unclaimed(path: Path, reply: Reply) -> Self {
        Self {
            path,
            attempts: None,
            reply,
        }
    }
}

/// The answer the done cache gives for `id` arriving with payload `fingerprint`, if it
/// knows the key.
pub fn cached_answer(
    cache: &DoneCache,
    id: &EventId,
    fingerprint: Option<&str>,
    log: &Logger,
) -> Option<Answer> {
    Some(match cache.lookup(id, fingerprint)? {
        Hit::Done { attempts, result } => Answer {
            path: Path::DuplicateDone,
            attempts: Some(attempts),
            reply: Reply::Result(result),
        },
        Hit::Mismatch { attempts, stored } => {
            log_mismatch(log, id, fingerprint, stored.as_deref());
            Answer {
                path: Path::PayloadMismatch,
                attempts: Some(attempts),
                reply: Reply::Mismatch,
            }
        }
    })
}

/// Logs why a request was answered 503 with nothing claimed (`webhook.unavailable`): the
/// sender sees only the reason; the operator finds the cause here.
pub(crate) fn log_refusal(
    log: &Logger,
    id: &EventId,
    path: Path,
    reason: &str,
    retry_after: u64,
    cause: &str,
) {
    warn!(log, "webhook.unavailable";
        "provider" => &*id.provider, "event_key" => &*id.key, "path" => path.as_str(),
        "reason" => reason, "retry_after_s" => retry_after, "error" => cause);
}

/// Logs a payload mismatch with both fingerprints (never the payloads).
pub(crate) fn log_mismatch(
    log: &Logger,
    id: &EventId,
    incoming: Option<&str>,
    stored: Option<&str>,
) {
    warn!(log, "webhook.payload_mismatch";
        "provider" => &*id.provider, "event_key" => &*id.key,
        "stored_fingerprint" => stored, "incoming_fingerprint" => incoming);
}
