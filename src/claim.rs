//! The vocabulary of the claim path: the row's [`Status`] and [`Mode`], the named [`Path`] every attempt
//! is labelled with, and the pure rule ([`classify`]) that turns a row the claim did *not*
//! win into a path.
//!
//! Nothing here does I/O. The SQL that wins or reports a claim lives in `store/`; the
//! decisions about what the row means live here so that both backends share them.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A row's state, as stored in `webhook_events.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Queue mode: written with its payload, first attempt not claimed yet.
    Queued,
    /// A claim holds the key until `locked_until`.
    InProgress,
    /// The target accepted the event; terminal.
    Done,
    /// The last attempt failed; a redelivery may claim it again.
    Failed,
    /// A dead letter; only an operator's replay reopens it.
    Dead,
}

impl Status {
    /// Every status.
    pub const ALL: [Status; 5] = [
        Status::Queued,
        Status::InProgress,
        Status::Failed,
        Status::Done,
        Status::Dead,
    ];

    /// The text stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::InProgress => "in_progress",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Dead => "dead",
        }
    }

    /// Parses the stored text.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "queued" => Status::Queued,
            "in_progress" => Status::InProgress,
            "done" => Status::Done,
            "failed" => Status::Failed,
            "dead" => Status::Dead,
            _ => return None,
        })
    }
}

/// How a provider's events reach the target: chosen in the config, kept on the row.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The sender's request waits for the target; the sender redelivers.
    Sync,
    /// 202 once the row is durable; hookgate delivers and redelivers.
    Queue,
}

impl Mode {
    /// The name as written in the config and stored on the row.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Queue => "queue",
        }
    }

    /// The mode named `text` (as stored on a row), if any.
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "sync" => Some(Mode::Sync),
            "queue" => Some(Mode::Queue),
            _ => None,
        }
    }
}

/// The named path of one attempt: in the logs, the `Hookgate-Path` header and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// Key never seen; claim won.
    FirstRun,
    /// Key was `failed`; claim won.
    RetryAfterFailure,
    /// Key was `in_progress` with an expired lease; claim won.
    LeaseRetake,
    /// Key is `done`: the cached result is replayed.
    DuplicateDone,
    /// Key is held by a live lease, on this node or another.
    InProgressElsewhere,
    /// Key is dead-lettered.
    DuplicateDead,
    /// Key known, but the payload's fingerprint differs.
    PayloadMismatch,
    /// The store could not be reached; nothing ran.
    StoreUnavailable,
    /// The node could not start a delivery now; nothing was claimed.
    Overloaded,
    /// Queue mode: key never seen; the row with its payload is durable.
    Queued,
    /// Queue mode: key queued, failed or in progress; nothing changes.
    DuplicateQueued,
    /// An operator reopened a dead letter.
    Replay,
    /// A worker finished after its lease was retaken; its write changed nothing.
    StaleCompletion,
    /// An operator paused the provider: nothing is delivered (sync: 503; queue: accepted
    /// and held).
    Paused,
    /// The main route's filter did not accept the event's first delivery: the main route's
    /// row (the event's record) is claimed and done at once, nothing delivered to it — 200
    /// `{"status":"filtered"}`, or 202 `{"status":"queued"}` when other routes took the
    /// event; its redeliveries are `duplicate_done`. The row keeps the path: a retake of a
    /// claim whose record was lost is filtered again, whatever the redelivery's headers.
    Filtered,
}

impl Path {
    /// The label used in logs, headers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Path::FirstRun => "first_run",
            Path::RetryAfterFailure => "retry_after_failure",
            Path::LeaseRetake => "lease_retake",
            Path::DuplicateDone => "duplicate_done",
            Path::InProgressElsewhere => "in_progress_elsewhere",
            Path::DuplicateDead => "duplicate_dead",
            Path::PayloadMismatch => "payload_mismatch",
            Path::StoreUnavailable => "store_unavailable",
            Path::Overloaded => "overloaded",
            Path::Queued => "queued",
            Path::DuplicateQueued => "duplicate_queued",
            Path::Replay => "replay",
            Path::StaleCompletion => "stale_completion",
            Path::Paused => "paused",
            Path::Filtered => "filtered",
        }
    }

    /// Parses a label written by [`Path::as_str`] (the store keeps the last claim's path).
    pub fn parse(text: &str) -> Option<Self> {
        Path::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// Every path.
    pub const ALL: [Path; 15] = [
        Path::FirstRun,
        Path::RetryAfterFailure,
        Path::LeaseRetake,
        Path::DuplicateDone,
        Path::InProgressElsewhere,
        Path::DuplicateDead,
        Path::PayloadMismatch,
        Path::StoreUnavailable,
        Path::Overloaded,
        Path::Queued,
        Path::DuplicateQueued,
        Path::Replay,
        Path::StaleCompletion,
        Path::Paused,
        Path::Filtered,
    ];

    /// Whether this path means the claim was won and a delivery runs.
    pub fn is_won(self) -> bool {
        matches!(
            self,
            Path::FirstRun | Path::RetryAfterFailure | Path::LeaseRetake | Path::Replay
        )
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The target's answer kept on a `done` row and replayed to duplicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// HTTP status the target answered (2xx).
    pub status: u16,
    /// The target's `Content-Type`, if any.
    pub content_type: Option<String>,
    /// The target's body, empty when it was larger than the cache limit.
    pub body: Vec<u8>,
}

impl StoredResult {
    /// The answer of an event its main route's filter did not accept, kept on the main
    /// route's row: `200 {"status":"filtered"}` — or, when other routes took it (`routed`:
    /// hookgate delivers it to them), `202 {"status":"queued"}`.
    pub fn filtered(routed: bool) -> Self {
        let (status, body): (u16, &[u8]) = if routed {
            (202, br#"{"status":"queued"}"#)
        } else {
            (200, br#"{"status":"filtered"}"#)
        };
        Self {
            status,
            content_type: Some("application/json".into()),
            body: body.to_vec(),
        }
    }
}

/// What a claim that was not won found in the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowState {
    /// The row's status.
    pub status: Status,
    /// The mode the row was accepted in: a queue row's redeliveries are answered 202,
    /// whoever asks (hookgate delivers it).
    pub mode: Mode,
    /// Won claims so far (also the current lease's fencing token).
    pub attempts: i32,
    /// Fingerprint of the payload first claimed under this key.
    pub fingerprint: Option<String>,
    /// Time left on the lease, zero when none is live.
    pub lease_left: Duration,
    /// The cached result of a `done` row.
    pub result: Option<StoredResult>,
}

impl RowState {
    /// Whether a sender's claim would take the row over, its fingerprint matching: a sync
    /// row that is `failed`, or `in_progress` with no live lease (the claim statements'
    /// rule).
    pub fn claimable(&self) -> bool {
        self.mode == Mode::Sync
            && match self.status {
                Status::Failed => true,
                Status::InProgress => self.lease_left.is_zero(),
                Status::Queued | Status::Done | Status::Dead => false,
            }
    }
}

/// What the claim statement reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimResult {
    /// The claim was won: deliver, then complete or fail with this fencing token.
    Won {
        /// The fencing token of this attempt (the row's `attempts` after the claim).
        attempts: i32,
        /// `first_run`, `retry_after_failure`, `lease_retake` or `replay`.
        path: Path,
    },
    /// The claim was not won; the row as it stands.
    Existing(RowState),
}

/// The mismatch rule: two payloads under one key differ when both have a fingerprint of
/// one kind and the fingerprints differ (a missing fingerprint — fingerprints off — matches
/// anything, and so does one of another kind).
pub fn fingerprints_differ(stored: Option<&str>, incoming: Option<&str>) -> bool {
    matches!((stored, incoming),
        (Some(stored), Some(incoming)) if kind(stored) == kind(incoming) && stored != incoming)
}

/// A fingerprint's kind: all but its last 64 characters (the digest) — `k:<id>:` for one
/// keyed by key `id`, empty for a plain SHA-256. Fingerprints of two kinds cannot be
/// compared as they stand (the row's was made before encryption was turned on, or under a
/// key since rotated out of sealing), so they never differ here: the shard fingerprints
/// the payload again under the row's kind ([`other_kind`]), and the claim statements never
/// take a row over across kinds.
pub fn fingerprint_kind(fingerprint: &str) -> &str {
    let end = fingerprint.len().saturating_sub(64);
    fingerprint.get(..end).unwrap_or("")
}

fn kind(fingerprint: &str) -> &str {
    fingerprint_kind(fingerprint)
}

/// The stored fingerprint, when both are known and of two kinds: the incoming payload must
/// be fingerprinted again under its kind to be compared.
pub fn other_kind<'s>(stored: Option<&'s str>, incoming: Option<&str>) -> Option<&'s str> {
    match (stored, incoming) {
        (Some(stored), Some(incoming)) if kind(stored) != kind(incoming) => Some(stored),
        _ => None,
    }
}

/// The path for a row the claim did not win, given the incoming payload's fingerprint.
///
/// A fingerprint mismatch wins over every status: the same key with another body is a
/// sender bug or a collision, and must never be answered with another event's result.
/// A sync row that is `failed` and was not won can only be seen in a race with another
/// node that failed it between our statement's snapshot and its lock; the key is busy
/// right now. A queue row that is not final is hookgate's to deliver, whoever asks (a
/// sync claim meets one when the main route's filter refuses a redelivery of a queued
/// event, or after its provider moved from queue to sync mode): `duplicate_queued`.
pub fn classify(row: &RowState, incoming_fingerprint: Option<&str>) -> Path {
    if fingerprints_differ(row.fingerprint.as_deref(), incoming_fingerprint) {
        return Path::PayloadMismatch;
    }
    match (row.status, row.mode) {
        (Status::Done, _) => Path::DuplicateDone,
        (Status::Dead, _) => Path::DuplicateDead,
        (_, Mode::Queue) => Path::DuplicateQueued,
        (Status::Queued | Status::InProgress | Status::Failed, Mode::Sync) => {
            Path::InProgressElsewhere
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: Status, fingerprint: Option<&str>) -> RowState {
        RowState {
            status,
            mode: Mode::Sync,
            attempts: 1,
            fingerprint: fingerprint.map(str::to_owned),
            lease_left: Duration::ZERO,
            result: None,
        }
    }

    #[test]
    fn terminal_rows_are_duplicates_whatever_their_lease() {
        assert_eq!(
            classify(&row(Status::Done, Some("a")), Some("a")),
            Path::DuplicateDone
        );
        assert_eq!(
            classify(&row(Status::Dead, Some("a")), Some("a")),
            Path::DuplicateDead
        );
    }

    #[test]
    fn a_held_row_is_in_progress_elsewhere() {
        assert_eq!(
            classify(&row(Status::InProgress, None), Some("a")),
            Path::InProgressElsewhere
        );
    }

    #[test]
    fn a_queue_row_not_final_is_a_queued_duplicate_whoever_asks() {
        for status in [Status::Queued, Status::InProgress, Status::Failed] {
            let queued = RowState {
                mode: Mode::Queue,
                ..row(status, Some("a"))
            };
            assert_eq!(classify(&queued, Some("a")), Path::DuplicateQueued);
        }
        let done = RowState {
            mode: Mode::Queue,
            ..row(Status::Done, Some("a"))
        };
        assert_eq!(classify(&done, Some("a")), Path::DuplicateDone);
    }

    #[test]
    fn a_different_fingerprint_is_a_mismatch_for_every_status() {
        for status in [
            Status::Done,
            Status::Dead,
            Status::Failed,
            Status::InProgress,
        ] {
            assert_eq!(
                classify(&row(status, Some("a")), Some("b")),
                Path::PayloadMismatch
            );
        }
    }

    #[test]
    fn fingerprints_of_two_kinds_are_not_compared() {
        let plain = "a".repeat(64);
        let keyed = |id: &str, digit: &str| format!("k:{id}:{}", digit.repeat(64));
        assert!(fingerprints_differ(
            Some(&keyed("a", "1")),
            Some(&keyed("a", "2"))
        ));
        assert!(!fingerprints_differ(
            Some(&keyed("a", "1")),
            Some(&keyed("a", "1"))
        ));
        // Made before encryption was on, or under a key rotated out: not comparable.
        assert!(!fingerprints_differ(Some(&plain), Some(&keyed("a", "2"))));
        assert!(!fingerprints_differ(
            Some(&keyed("old", "1")),
            Some(&keyed("a", "2"))
        ));
    }

    #[test]
    fn labels_round_trip() {
        for path in [Path::FirstRun, Path::LeaseRetake, Path::StaleCompletion] {
            assert_eq!(Path::parse(path.as_str()), Some(path));
        }
        for status in [Status::InProgress, Status::Dead] {
            assert_eq!(Status::parse(status.as_str()), Some(status));
        }
    }
}
