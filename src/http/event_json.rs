//! An event's row as JSON, for operators: whole for one event (`GET /admin/events/...`,
//! the command line's `events show` and `dead show`), as a summary in lists (`/admin/dead`,
//! the search). Shapes only; reads nothing.

use std::time::Duration;

use crate::store::{AttemptRecord, EventRecord, EventSummary};

/// Unix seconds as an RFC 3339 instant (out-of-range values clamped, never a panic).
fn rfc3339(secs: f64) -> String {
    const LAST: f64 = 253_402_300_799.0;
    let since = Duration::try_from_secs_f64(secs.clamp(0.0, LAST)).unwrap_or_default();
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + since).to_string()
}

/// A row as a list shows it, as JSON (the search, `/admin/dead`): its state and the size of
/// its kept payload, never the payload itself.
pub fn summary_json(row: &EventSummary) -> serde_json::Value {
    serde_json::json!({
        // The row's scope: the provider's name, or `provider.route` for another route.
        "provider": &*row.id.provider,
        "route": crate::key::route_of(&row.id.provider),
        "event_key": &*row.id.key,
        "status": row.status.as_str(),
        "attempts": row.attempts,
        "last_path": row.last_path.map(|p| p.as_str()),
        "result_status": row.result_status,
        "last_error": row.last_error,
        "dead_reason": row.dead_reason,
        "lease_left_s": row.lease_left.as_secs_f64(),
        "payload_bytes": row.payload_bytes,
        // A stored time is the store's own clock, but a REAL can hold anything: a value no
        // instant can be is shown as the epoch rather than panic.
        "created_at": rfc3339(row.created_at),
        "updated_at": rfc3339(row.updated_at),
        "mode": row.mode,
    })
}

/// One event's whole row as JSON for operators (CLI and admin API): its summary, with the
/// payload as text when it is UTF-8 (else its size), the fingerprint, the content type and
/// the kept request headers.
pub fn event_json(record: &EventRecord) -> serde_json::Value {
    let payload = record
        .payload
        .as_ref()
        .map(|p| match std::str::from_utf8(p) {
            Ok(text) => serde_json::Value::String(text.to_owned()),
            Err(_) => serde_json::json!({ "bytes": p.len() }),
        });
    let headers = record
        .request_headers
        .as_deref()
        .and_then(|h| serde_json::from_str::<serde_json::Value>(h).ok());
    let mut json = summary_json(&record.summary());
    json["fingerprint"] = record.fingerprint.clone().into();
    json["content_type"] = record.content_type.clone().into();
    json["request_headers"] = headers.into();
    json["payload"] = payload.into();
    json
}

/// An attempt from an event's history as JSON.
pub fn attempt_json(attempt: &AttemptRecord) -> serde_json::Value {
    serde_json::json!({
        "attempt": attempt.attempt,
        "path": attempt.path,
        "node": attempt.node,
        "mode": attempt.mode,
        "outcome": attempt.outcome,
        "started_at": rfc3339(attempt.started_at),
        "ended_at": rfc3339(attempt.ended_at),
        "duration_ms": ((attempt.ended_at - attempt.started_at) * 1000.0).max(0.0).round(),
        "target_status": attempt.target_status,
        "error": attempt.error,
        "answer": attempt.answer,
    })
}

/// An event's row on one route of its provider (`scope` its rows' scope), as the event's
/// `routes` list shows it: `status` null where the route did not take the event.
pub fn route_json(route: &str, scope: &str, row: Option<&EventRecord>) -> serde_json::Value {
    serde_json::json!({
        "route": route,
        "provider": scope,
        "status": row.map(|r| r.status.as_str()),
        "attempts": row.map(|r| r.attempts),
        "last_path": row.and_then(|r| r.last_path).map(|p| p.as_str()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::Status;
    use crate::key::EventId;

    #[test]
    fn any_stored_time_prints_without_a_panic() {
        for secs in [f64::INFINITY, f64::NAN, 1e300, -5.0, 1_700_000_000.5] {
            let record = EventRecord {
                id: EventId::new("p", "k"),
                status: Status::Done,
                attempts: 1,
                last_path: None,
                fingerprint: None,
                result: None,
                payload: None,
                last_error: None,
                dead_reason: None,
                content_type: None,
                request_headers: None,
                lease_left: Duration::ZERO,
                mode: "sync".into(),
                created_at: secs,
                updated_at: secs,
            };
            let json = event_json(&record);
            assert!(json["created_at"].is_string(), "{secs}: {json}");
        }
    }
}
