//! The store's values: the rows and answers its operations take and give, and the helpers
//! backends share (the deadline, milliseconds, storable text). The [`Store`](super::Store)
//! trait that uses them is in `api`, its errors in `error`; operators' reads (`operator`)
//! use them too.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use futures_util::future::BoxFuture;

use crate::claim::{Mode, Path, RowState, Status, StoredResult};
use crate::key::EventId;
use crate::outcome::DeadReason;

use super::error::StoreError;

/// A future returned by a [`Store`](super::Store) operation.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// Whether a fenced write took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The row still belonged to this attempt and now holds its outcome.
    Applied,
    /// Another attempt had retaken the row; nothing changed (path `stale_completion`).
    Stale,
}

/// A dead letter reopened by [`Store::replay`](super::Store::replay): deliver it, then complete or fail it with
/// `attempts` like any won claim.
#[derive(Debug, Clone)]
pub struct Reopened {
    /// The fencing token of the replay attempt.
    pub attempts: i32,
    /// The kept payload.
    pub payload: Bytes,
    /// The kept content type.
    pub content_type: Option<String>,
    /// The payload's fingerprint, as first claimed.
    pub fingerprint: Option<String>,
    /// The mode the event was accepted in: the replay's event keeps it, so a sender's
    /// request that meets the replay in flight is answered as that mode's are.
    pub mode: Mode,
}

/// The outcome of a failed attempt, written by [`Store::fail`](super::Store::fail).
#[derive(Debug, Clone)]
pub struct Failure {
    /// What went wrong, for people.
    pub error: String,
    /// `Some` makes the row a dead letter instead of `failed`.
    pub dead: Option<DeadReason>,
    /// The payload, kept so the event can be read and replayed.
    pub payload: Bytes,
    /// The payload's content type.
    pub content_type: Option<String>,
    /// The request's headers as a JSON object, credentials left out.
    pub headers: Option<String>,
    /// Queue mode: when the scheduler may take the row again (a `failed` row's backoff);
    /// `None` for sync rows, whose sender redelivers.
    pub retry_in: Option<Duration>,
    /// Whether this try does not count against `retry.max_attempts` (the target asked for
    /// time, or the attempt never reached it).
    pub uncounted: bool,
    /// The attempt's history row, written with this outcome.
    pub history: Option<History>,
}

/// A queue-mode event to write before its sender is answered.
#[derive(Debug, Clone)]
pub struct QueueRow {
    /// Provider and key.
    pub id: EventId,
    /// The payload's fingerprint (`None` when fingerprints are off).
    pub fingerprint: Option<String>,
    /// The payload, byte for byte.
    pub payload: Bytes,
    /// Its content type.
    pub content_type: Option<String>,
    /// The request's headers worth keeping, as a JSON object.
    pub headers: Option<String>,
    /// Whether the payload stays once the event is done (`keep_payload = "always"`).
    pub keep_payload: bool,
    /// `Some(lease)`: a worker waits for it, so the row is written already taken for its
    /// first attempt (`in_progress`, attempt 1, path `first_run`, holding `lease`) — one
    /// statement where an enqueue and a take would be two. `None`: written `queued`, due
    /// now, for a scheduler.
    pub start: Option<Duration>,
}

/// A routed claim's or enqueue's answer: its own, and for each of the event's other routes'
/// rows, in order, whether this call wrote it (`false`: the call was not won, or the row
/// existed and was left as it stands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed<T> {
    /// The claim's (or enqueue's) own answer.
    pub answer: T,
    /// Per other route's row: written by this call.
    pub written: Vec<bool>,
}

/// What [`Store::enqueue`](super::Store::enqueue) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// A new row, durable, due now.
    Inserted,
    /// The key was known; the row (a queue row) as it stands.
    Existing(RowState),
    /// The key belongs to a sync row, accepted before its provider moved to queue mode:
    /// only its sender redelivers it, so the request is the row's sync attempt to make.
    SyncRow(RowState),
}

/// A queue row taken for one attempt by [`Store::take`](super::Store::take): deliver it, then complete or
/// fail it with `attempts` like any won claim.
#[derive(Debug, Clone)]
pub struct Taken {
    /// Its provider and key.
    pub id: EventId,
    /// The fencing token of this attempt.
    pub attempts: i32,
    /// This attempt's number among the tries that count against `retry.max_attempts`
    /// (`attempts` less the throttled and never-started ones).
    pub tries: i32,
    /// How long ago the event was accepted (store clock).
    pub age: Duration,
    /// `first_run`, `retry_after_failure` or `lease_retake`.
    pub path: Path,
    /// The kept payload.
    pub payload: Bytes,
    /// The kept content type.
    pub content_type: Option<String>,
    /// The payload's fingerprint.
    pub fingerprint: Option<String>,
    /// The kept request headers (a JSON object) when they hold the `traceparent` of the
    /// request that accepted the event: its attempts continue that trace. (Sealed headers
    /// come back from the backend whole; the sealed store opens them and keeps them only
    /// when they hold one.)
    pub trace_headers: Option<String>,
    /// Its kept body did not open (the sealed store says why, naming the key it needs):
    /// `payload` is the stored value as it is, never delivered; the attempt makes the row
    /// an `unreadable` dead letter, writing that value back unchanged.
    pub unreadable: Option<String>,
}

/// One provider's queue, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDepth {
    /// The provider.
    pub provider: String,
    /// Queue rows not finished: queued, failed (waiting for their backoff) or in progress.
    pub rows: u64,
    /// How long the oldest due row has been due (zero when none is).
    pub oldest_due: Duration,
}

/// One attempt as its history row is written — only for attempts whose story is not a plain
/// `first_run` → `done` (that one the event's own row tells whole) — in the same statement
/// as the outcome it belongs to.
#[derive(Debug, Clone)]
pub struct History {
    /// The attempt's path (`first_run`, `retry_after_failure`, `lease_retake`, `replay`).
    pub path: Path,
    /// The node that ran it.
    pub node: Arc<str>,
    /// `done`, `failed`, `dead`, `throttled` or `released`.
    pub outcome: &'static str,
    /// From the claim to the outcome, as the node measured it: the row's `started_at` is
    /// the store's clock less this.
    pub took: Duration,
    /// The target's status code, when it answered.
    pub target_status: Option<u16>,
    /// What went wrong.
    pub error: Option<String>,
    /// The first bytes of the target's answer (text, bounded).
    pub answer: Option<String>,
}

/// An event's payload, kept with its claim when its provider says `keep_payload = "always"`
/// (so even a crashed attempt's dead letter can be replayed).
#[derive(Debug, Clone)]
pub struct Kept {
    /// The payload, byte for byte.
    pub payload: Bytes,
    /// Its content type.
    pub content_type: Option<String>,
    /// The request's headers worth keeping, as a JSON object.
    pub headers: Option<String>,
}

/// One attempt from an event's history (`hookgate events history`, the console).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    /// The attempt number (the fencing token it held).
    pub attempt: i32,
    /// Its path.
    pub path: String,
    /// The node that ran it.
    pub node: String,
    /// `sync` or `queue`.
    pub mode: String,
    /// `done`, `failed`, `dead`, `throttled` or `released`.
    pub outcome: String,
    /// Started and ended, Unix seconds (store clock).
    pub started_at: f64,
    /// See `started_at`.
    pub ended_at: f64,
    /// The target's status code, when it answered.
    pub target_status: Option<u16>,
    /// What went wrong.
    pub error: Option<String>,
    /// The first bytes of the target's answer.
    pub answer: Option<String>,
}

/// A whole row, for operators reading one event (`hookgate events show`, the console's
/// event page) and for the claim path's read-back.
#[derive(Debug, Clone)]
pub struct EventRecord {
    /// Provider and key.
    pub id: EventId,
    /// The row's status.
    pub status: Status,
    /// Won claims so far.
    pub attempts: i32,
    /// The path of the last won claim.
    pub last_path: Option<Path>,
    /// Fingerprint of the payload.
    pub fingerprint: Option<String>,
    /// The cached result of a done row.
    pub result: Option<StoredResult>,
    /// The kept payload of a failed or dead row.
    pub payload: Option<Vec<u8>>,
    /// The last failure.
    pub last_error: Option<String>,
    /// Why the row is dead.
    pub dead_reason: Option<String>,
    /// The kept payload's content type.
    pub content_type: Option<String>,
    /// The kept request headers (JSON object text).
    pub request_headers: Option<String>,
    /// Time left on the lease (zero when none is live).
    pub lease_left: Duration,
    /// `sync` or `queue`.
    pub mode: String,
    /// Row creation, seconds since the Unix epoch (store clock).
    pub created_at: f64,
    /// Last change, seconds since the Unix epoch (store clock).
    pub updated_at: f64,
}

/// One event as a list shows it (a search, the dead letters, `events list`): its state and
/// the size of its kept payload, never the payload, the cached answer or the kept headers,
/// which can be megabytes a row; those are read one event at a time ([`EventRecord`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EventSummary {
    /// Provider and key.
    pub id: EventId,
    /// The row's status.
    pub status: Status,
    /// Won claims so far.
    pub attempts: i32,
    /// The path of the last won claim.
    pub last_path: Option<Path>,
    /// The target's status in the cached result of a done row.
    pub result_status: Option<u16>,
    /// The last failure.
    pub last_error: Option<String>,
    /// Why the row is dead.
    pub dead_reason: Option<String>,
    /// The kept payload's size in bytes, when one is kept.
    pub payload_bytes: Option<u64>,
    /// Time left on the lease (zero when none is live).
    pub lease_left: Duration,
    /// `sync` or `queue`.
    pub mode: String,
    /// Row creation, seconds since the Unix epoch (store clock).
    pub created_at: f64,
    /// Last change, seconds since the Unix epoch (store clock).
    pub updated_at: f64,
}

impl EventRecord {
    /// The row as a list shows it.
    pub fn summary(&self) -> EventSummary {
        EventSummary {
            id: self.id.clone(),
            status: self.status,
            attempts: self.attempts,
            last_path: self.last_path,
            result_status: self.result.as_ref().map(|r| r.status),
            last_error: self.last_error.clone(),
            dead_reason: self.dead_reason.clone(),
            payload_bytes: self
                .payload
                .as_ref()
                .map(|p| u64::try_from(p.len()).unwrap_or(u64::MAX)),
            lease_left: self.lease_left,
            mode: self.mode.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// A migration that could not take a table's lock within its lock timeout (a long
/// transaction holds the table), rolled back and about to be tried again: for the log.
#[derive(Debug, Clone)]
pub struct MigrationWait {
    /// The try that gave up (1 for the first).
    pub attempt: u32,
    /// How long until the next try.
    pub retry_in: Duration,
    /// The database's word on it.
    pub error: String,
}

/// Runs `op` under `deadline`: past it the caller gets [`StoreError::TimedOut`] and the
/// operation's future is dropped (a Postgres connection it held is discarded, see
/// `postgres/pool.rs`).
pub(crate) async fn within<T>(
    deadline: Duration,
    op: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(deadline, op)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::TimedOut(
                format!("no answer within the {} ms deadline", millis(deadline)).into(),
            ))
        })
}

/// `text` as every store can keep it in a text column: NUL (which Postgres refuses in
/// text, SQLSTATE 22021) replaced with U+FFFD. For text that comes from outside and is only
/// read by people: a target's answer, an error's message.
pub fn storable(text: &str) -> String {
    text.replace('\0', "\u{fffd}")
}

/// A duration in whole milliseconds for SQL parameters (saturating; leases and ages are
/// far below the limit).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storable_text_has_no_nul_and_keeps_the_rest() {
        assert_eq!(storable("a\0b\0"), "a\u{fffd}b\u{fffd}");
        assert_eq!(storable("évt 1\t"), "évt 1\t");
    }
}
