//! What a shard tells the HTTP layer: the attempt's path and the answer for the sender.
//! The HTTP layer only renders it (`http/ingest.rs`); every decision was made in the
//! shard or the attempt, from the row.
//!
//! Every "come back later" answer carries a [`RetryReason`]; an answer with nothing
//! claimed behind it is built by one constructor, [`Answer::refused`], which also fixes its
//! path and `Retry-After`.

use std::sync::Arc;

use slog::{warn, Logger};

use super::cache::{DoneCache, Hit};
use super::event::Event;
use crate::canonical::Body;
use crate::claim::{fingerprints_differ, other_kind, Path, StoredResult};
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
        /// Why, for the body.
        reason: RetryReason,
    },
    /// 200 `{"status":"dead_lettered"}`: stop retrying, people will look at it.
    DeadLettered,
    /// 202 `{"status":"queued"}`: the event is durable; hookgate delivers it.
    Queued,
    /// 422: the key was seen with another payload.
    Mismatch,
    /// (Replays only) the row was not a dead letter, or another replay has it now.
    NotReplayable,
}

/// `Retry-After` while the store is unreachable: about the longest reconnect backoff, so
/// a sender does not hammer a node that cannot answer yet.
pub const STORE_RETRY_AFTER_SECS: u64 = 5;

/// `Retry-After` when this node is too busy right now: a worker frees up within a target's
/// answer time, so a second is plenty.
pub const BUSY_RETRY_AFTER_SECS: u64 = 1;

/// Why a sender is told to come back later (503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    /// Nothing claimed: every worker of the shard busy and its admission queue full, or
    /// the wait ran out, or the shard's mailbox full.
    Overloaded,
    /// Nothing claimed: the node is shutting down.
    ShuttingDown,
    /// Nothing claimed: no pooled store connection freed up in time.
    StoreBusy,
    /// Nothing claimed (or the outcome not recorded): the store did not answer.
    StoreUnavailable,
    /// Nothing claimed: the shard dropped the request.
    ShardUnavailable,
    /// A done row without its stored result.
    ResultMissing,
    /// The target failed this attempt; the row is `failed`.
    DeliveryFailed,
    /// The delivery code crashed; the row keeps its lease.
    WorkerCrashed,
    /// Another attempt took the row over; this one's outcome was not written.
    LeaseLost,
    /// The attempt never reached the target; the row is `failed`.
    NotStarted,
    /// Nothing claimed: an operator paused the provider.
    Paused,
}

impl RetryReason {
    /// The machine-readable reason in the body.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::Overloaded => "overloaded",
            RetryReason::ShuttingDown => "shutting_down",
            RetryReason::StoreBusy => "store_busy",
            RetryReason::StoreUnavailable => "store_unavailable",
            RetryReason::ShardUnavailable => "shard_unavailable",
            RetryReason::ResultMissing => "result_missing",
            RetryReason::DeliveryFailed => "delivery_failed",
            RetryReason::WorkerCrashed => "worker_crashed",
            RetryReason::LeaseLost => "lease_lost",
            RetryReason::NotStarted => "not_started",
            RetryReason::Paused => "paused",
        }
    }
}

impl Answer {
    /// 503 `paused`: an operator paused the provider; nothing claimed, the sender keeps the
    /// event and comes back after `retry_after` seconds.
    pub fn paused(retry_after: u64) -> Self {
        Self {
            path: Path::Paused,
            attempts: None,
            reply: Reply::RetryLater {
                retry_after,
                reason: RetryReason::Paused,
            },
        }
    }

    /// The one constructor of "nothing claimed, retry later": the path is
    /// `store_unavailable` when the store did not answer, else `overloaded`; `Retry-After`
    /// is [`STORE_RETRY_AFTER_SECS`] or [`BUSY_RETRY_AFTER_SECS`] to match.
    pub fn refused(reason: RetryReason) -> Self {
        let (path, retry_after) = match reason {
            RetryReason::StoreUnavailable => (Path::StoreUnavailable, STORE_RETRY_AFTER_SECS),
            _ => (Path::Overloaded, BUSY_RETRY_AFTER_SECS),
        };
        Self {
            path,
            attempts: None,
            reply: Reply::RetryLater {
                retry_after,
                reason,
            },
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
pub(crate) fn log_refusal(log: &Logger, id: &EventId, answer: &Answer, cause: &str) {
    if let Reply::RetryLater {
        retry_after,
        reason,
    } = answer.reply
    {
        warn!(log, "webhook.unavailable";
            "provider" => &*id.provider, "event_key" => &*id.key,
            "path" => answer.path.as_str(), "reason" => reason.as_str(),
            "retry_after_s" => retry_after, "error" => cause);
    }
}

/// The 422 for `incoming` when it carries another payload than `first`, the request that
/// holds the key (both fingerprints logged); `None` when they may be the same event.
pub(crate) fn mismatch_with(
    log: &Logger,
    incoming: &Event,
    first: &Event,
    attempts: Option<i32>,
) -> Option<Answer> {
    let (theirs, ours) = (
        incoming.fingerprint.as_deref(),
        first.fingerprint.as_deref(),
    );
    fingerprints_differ(ours, theirs).then(|| {
        log_mismatch(log, &incoming.id, theirs, ours);
        Answer {
            path: Path::PayloadMismatch,
            attempts,
            reply: Reply::Mismatch,
        }
    })
}

/// How a request's payload compares with a row fingerprinted under another kind (before a
/// key rotation, or before encryption was on), fingerprinted again under the row's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Across {
    /// The same payload: its fingerprint under the row's kind.
    Same(String),
    /// Another payload.
    Differs,
    /// It cannot be told: the row's key is not configured (why).
    Unknown(String),
}

/// `incoming` against the row's `stored` fingerprint when the two are of different kinds
/// (`None` when they are of one kind, either is unknown, or the event cannot be
/// fingerprinted again: read back from its row).
pub(super) fn across(incoming: &Event, stored: Option<&str>) -> Option<Across> {
    let stored = other_kind(stored, incoming.fingerprint.as_deref())?;
    let fingerprinter = incoming.fingerprinter.as_ref()?;
    Some(
        match fingerprinter.fingerprint_as(&Body::new(&incoming.body), stored) {
            Ok(fingerprint) if fingerprint == stored => Across::Same(fingerprint),
            Ok(_) => Across::Differs,
            Err(why) => Across::Unknown(why),
        },
    )
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
