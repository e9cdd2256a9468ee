//! Writing an attempt's verdict to its row: done with the result, or failed / dead with
//! the payload and the request headers kept for people (never credentials).

use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use slog::{warn, Logger};

use super::Event;
use crate::outcome::Verdict;
use crate::store::{DeadReason, Failure, Fenced, Store, StoreError};

/// Writes an attempt's verdict to its row, fenced by `attempts`; `None` when the verdict
/// is [`Verdict::Unknown`] (a crash: the row keeps its lease).
pub async fn write_verdict(
    store: &dyn Store,
    event: &Event,
    attempts: i32,
    verdict: &Verdict,
) -> Option<Result<Fenced, StoreError>> {
    let id = &event.id;
    Some(match verdict {
        Verdict::Done(result) => store.complete(id, attempts, result).await,
        Verdict::Retry { error, .. } => {
            store.fail(id, attempts, &failure(event, error, None)).await
        }
        Verdict::Dead { error, reason } => {
            store
                .fail(id, attempts, &failure(event, error, Some(*reason)))
                .await
        }
        Verdict::Unknown { .. } => return None,
    })
}

/// First pause before writing a verdict again after the store was unreachable.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// Longest pause between tries: about the store's own reconnect backoff.
const MAX_RETRY: Duration = Duration::from_secs(1);

/// [`write_verdict`], tried again while the store is unreachable, until `deadline` (the
/// attempt's lease).
///
/// Once the target has acted, losing the write would leave the row `in_progress` and a
/// later retake would run the target again; waiting for the store is worth the sender's
/// time. Only `Unavailable` is retried: a query error will not heal by itself, and a stale
/// write is an answer.
pub(crate) async fn write_verdict_retrying(
    store: &dyn Store,
    event: &Event,
    attempts: i32,
    verdict: &Verdict,
    deadline: Instant,
    log: &Logger,
) -> Option<Result<Fenced, StoreError>> {
    let mut pause = FIRST_RETRY;
    loop {
        let written = write_verdict(store, event, attempts, verdict).await;
        let Some(Err(StoreError::Unavailable(error))) = &written else {
            return written;
        };
        if Instant::now() + pause >= deadline {
            return written;
        }
        warn!(log, "webhook.record_retry";
            "provider" => &*event.id.provider, "event_key" => &*event.id.key,
            "attempts" => attempts, "error" => error.as_str(),
            "retry_in_ms" => u64::try_from(pause.as_millis()).unwrap_or(u64::MAX));
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RETRY);
    }
}

pub(crate) fn failure(event: &Event, error: &str, dead: Option<DeadReason>) -> Failure {
    Failure {
        error: error.to_owned(),
        dead,
        payload: event.body.clone(),
        content_type: event.content_type.clone(),
        headers: headers_json(&event.headers),
    }
}

/// Headers never written to the store: credentials and per-hop transport headers.
const UNKEPT_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "connection",
    "keep-alive",
    "transfer-encoding",
];

/// The request headers worth keeping with a dead letter, as a JSON object (`None` if none).
fn headers_json(headers: &HeaderMap) -> Option<String> {
    let kept: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .filter(|(name, _)| !UNKEPT_HEADERS.contains(&name.as_str()))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.into())))
        .collect();
    (!kept.is_empty()).then(|| serde_json::Value::Object(kept).to_string())
}
