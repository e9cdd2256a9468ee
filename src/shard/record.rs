//! Writing an attempt's verdict to its row: done with the result, or failed / dead with
//! the payload and the request headers kept for people (never credentials).

use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use slog::{warn, Logger};

use super::event::Event;
use crate::claim::{Mode, Status};
use crate::deadline::from_now;
use crate::outcome::{DeadReason, Verdict};
use crate::store::{Failure, Fenced, History, Store, StoreError};

/// Writes an attempt's verdict to its row, fenced by `attempts`, with its `history` row in
/// the same statement; `None` when the verdict is [`Verdict::Unknown`] (a crash: the row
/// keeps its lease).
pub async fn write_verdict(
    store: &dyn Store,
    event: &Event,
    attempts: i32,
    verdict: &Verdict,
    history: Option<&History>,
) -> Option<Result<Fenced, StoreError>> {
    let id = &event.id;
    // A queue row says when the scheduler may take it again; a sync row's sender decides.
    let due_in = |secs: u64| (event.mode == Mode::Queue).then(|| Duration::from_secs(secs));
    let failed = |error: &str, dead, retry_in, uncounted| Failure {
        retry_in,
        uncounted,
        history: history.cloned(),
        ..failure(event, error, dead)
    };
    Some(match verdict {
        Verdict::Done(result) => store.complete(id, attempts, result, history).await,
        Verdict::Retry { error, retry_after } => {
            let f = failed(error, None, due_in(*retry_after), false);
            store.fail(id, attempts, &f).await
        }
        Verdict::Throttled { error, retry_after } => {
            let f = failed(error, None, due_in(*retry_after), true);
            store.fail(id, attempts, &f).await
        }
        Verdict::Dead { error, reason } => {
            let f = failed(error, Some(*reason), None, false);
            store.fail(id, attempts, &f).await
        }
        Verdict::Release { error } => {
            let f = failed(error, None, due_in(0), true);
            store.fail(id, attempts, &f).await
        }
        Verdict::Unknown { .. } => return None,
    })
}

/// First pause before writing a verdict again after the store was unreachable.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// Longest pause between tries: about the store's own reconnect backoff.
const MAX_RETRY: Duration = Duration::from_secs(1);

/// [`write_verdict`], tried again after every transient failure (the store unreachable, a
/// missed deadline, a serialization failure or deadlock, a read-only database after a
/// failover, a busy pool), until `deadline` (a sync attempt's lease: past it another
/// attempt may hold the row and the sender is waiting) — or, with no deadline (an attempt
/// that renews its lease, as in queue mode: the write is fenced), after every error until
/// it lands.
///
/// Once the target has acted, losing the write would leave the row `in_progress` and a
/// later retake would run the target again; waiting for the store is worth the sender's
/// time. A query error will not heal by itself, and a stale write is an answer — except
/// after a try whose deadline passed: that write may have landed, so the row is read to
/// tell "landed" from "another attempt took over".
pub(crate) async fn write_verdict_retrying(
    store: &dyn Store,
    event: &Event,
    attempts: i32,
    verdict: &Verdict,
    history: Option<&History>,
    deadline: Option<Instant>,
    log: &Logger,
) -> Option<Result<Fenced, StoreError>> {
    let mut pause = FIRST_RETRY;
    let mut timed_out = false;
    loop {
        let written = write_verdict(store, event, attempts, verdict, history).await;
        match &written {
            Some(Ok(Fenced::Stale)) if timed_out => {
                return Some(Ok(landed_earlier(store, event, attempts, verdict).await));
            }
            // With no deadline (queue mode) every error is tried again: giving up would
            // forget the key while nobody knows whether the target acted.
            Some(Err(e)) if e.is_transient() || deadline.is_none() => {
                if deadline.is_some_and(|d| from_now(pause) >= d) {
                    return written;
                }
                timed_out |= matches!(e, StoreError::TimedOut(_));
                warn!(log, "webhook.record_retry";
                    "provider" => &*event.id.provider, "event_key" => &*event.id.key,
                    "attempts" => attempts, "error" => %e,
                    "retry_in_ms" => u64::try_from(pause.as_millis()).unwrap_or(u64::MAX));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RETRY);
            }
            _ => return written,
        }
    }
}

/// After a timed-out write and a stale retry: `Applied` if the row holds this attempt's
/// outcome (the timed-out write landed), else `Stale`.
async fn landed_earlier(
    store: &dyn Store,
    event: &Event,
    attempts: i32,
    verdict: &Verdict,
) -> Fenced {
    let expected = match verdict {
        Verdict::Done(_) => Status::Done,
        Verdict::Dead { .. } => Status::Dead,
        _ => Status::Failed,
    };
    match store.lookup(&event.id).await {
        Ok(Some(row)) if row.attempts == attempts && row.status == expected => Fenced::Applied,
        _ => Fenced::Stale,
    }
}

pub(crate) fn failure(event: &Event, error: &str, dead: Option<DeadReason>) -> Failure {
    Failure {
        error: crate::store::storable(error),
        dead,
        payload: event.body.clone(),
        content_type: event.content_type.clone(),
        headers: kept_headers(event),
        retry_in: None,
        uncounted: false,
        history: None,
    }
}

/// Request headers every provider keeps with a failed event: harmless and useful to
/// read its story. Anything else is kept only when named (`keep` below).
const ALWAYS_KEPT: &[&str] = &["content-type", "user-agent"];

/// The trace context headers, kept while tracing is on: the event's later attempts
/// continue the trace they name (hookgate's span for the request that carried it).
const TRACE_HEADERS: &[&str] = &["traceparent", "tracestate"];

/// `event`'s request headers worth keeping, as a JSON object (`None` if none).
pub(super) fn kept_headers(event: &Event) -> Option<String> {
    headers_json(
        &event.headers,
        &event.target.keep_headers,
        event.trace.is_some(),
    )
}

/// The request headers worth keeping with a dead letter, as a JSON object (`None` if none);
/// with `traced`, the trace context headers too.
fn headers_json(headers: &HeaderMap, keep: &[String], traced: bool) -> Option<String> {
    let kept: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .filter(|(name, _)| {
            is_kept(name.as_str(), keep) || (traced && TRACE_HEADERS.contains(&name.as_str()))
        })
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.into())))
        .collect();
    (!kept.is_empty()).then(|| serde_json::Value::Object(kept).to_string())
}

/// Whether a header (lower-case `name`) may be stored: an allowlist — [`ALWAYS_KEPT`],
/// and `keep` (the provider's signature, timestamp and key headers, and those its config
/// names). A credential header under a name nobody foresaw (`X-Auth`, an identity-aware
/// proxy's assertion) is never stored.
fn is_kept(name: &str, keep: &[String]) -> bool {
    ALWAYS_KEPT.contains(&name) || keep.iter().any(|k| k == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_named_headers_are_kept() {
        let keep = vec!["stripe-signature".to_owned(), "x-trace".to_owned()];
        assert!(is_kept("stripe-signature", &keep));
        assert!(is_kept("x-trace", &keep));
        assert!(is_kept("content-type", &keep));
        for name in [
            "authorization",
            "cookie",
            "x-api-token",
            "x-webhook-secret",
            "x-client-key",
            "x-other-signature",
            "x-password",
            "x-authorization",
            "x-auth",
            "cf-access-jwt-assertion",
            "x-goog-iap-jwt-assertion",
            "x-amzn-oidc-data",
            "x-unforeseen",
        ] {
            assert!(!is_kept(name, &keep), "{name}");
        }
    }
}
