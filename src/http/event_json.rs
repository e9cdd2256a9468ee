//! An event's row as JSON, for operators: `GET /admin/events/...`, `/admin/dead`, and the
//! command line's `events show` and `dead show`. Shapes only; reads nothing.

use std::time::Duration;

use crate::store::{AttemptRecord, EventRecord};

/// Unix seconds as an RFC 3339 instant (out-of-range values clamped, never a panic).
fn rfc3339(secs: f64) -> String {
    const LAST: f64 = 253_402_300_799.0;
    let since = Duration::try_from_secs_f64(secs.clamp(0.0, LAST)).unwrap_or_default();
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + since).to_string()
}

/// The row as JSON for operators (CLI and admin API); the payload as text when it is
/// UTF-8, else its size.
pub fn event_json(record: &EventRecord) -> serde_json::Value {
    // A stored time is the store's own clock, but a REAL can hold anything: a value no
    // instant can be is shown as the epoch rather than panic.
    let time = |secs: f64| {
        // RFC 3339 ends with the year 9999.
        const LAST: f64 = 253_402_300_799.0;
        let since = Duration::try_from_secs_f64(secs.clamp(0.0, LAST)).unwrap_or_default();
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + since).to_string()
    };
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
    serde_json::json!({
        "provider": &*record.id.provider,
        "event_key": &*record.id.key,
        "status": record.status.as_str(),
        "attempts": record.attempts,
        "last_path": record.last_path.map(|p| p.as_str()),
        "fingerprint": record.fingerprint,
        "result_status": record.result.as_ref().map(|r| r.status),
        "last_error": record.last_error,
        "dead_reason": record.dead_reason,
        "lease_left_s": record.lease_left.as_secs_f64(),
        "content_type": record.content_type,
        "request_headers": headers,
        "payload": payload,
        "created_at": time(record.created_at),
        "updated_at": time(record.updated_at),
        "mode": record.mode,
    })
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
