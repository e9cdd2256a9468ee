//! Decoding the embedded store's rows and its fenced writes' results. No SQL is run here
//! beyond the column lists every whole-row read and every list share.

use std::time::Duration;

use rusqlite::Row;

use super::writer::sql_error;
use crate::claim::{Path as ClaimPath, Status, StoredResult};
use crate::key::EventId;
use crate::store::{EventRecord, EventSummary, Fenced, StoreError};

/// Time left on a lease, in whole milliseconds, never negative.
pub(crate) const LEASE_LEFT_MS: &str =
    "CAST(MAX(0, COALESCE(locked_until, 0) - unixepoch('subsec')) * 1000 AS INTEGER)";

/// A whole-row read with `filter` (WHERE / ORDER BY / LIMIT) appended.
pub(crate) fn select_record(filter: &str) -> String {
    format!(
        "SELECT provider, event_key, status, attempts, last_path, fingerprint, result_status,
                result_content_type, result_body, payload, content_type, request_headers,
                last_error, dead_reason, mode, {LEASE_LEFT_MS} AS lease_left_ms,
                created_at, updated_at
         FROM webhook_events {filter}"
    )
}

/// A read of rows as a list shows them ([`EventSummary`]) with `filter` appended: no
/// payload, cached answer or kept headers; `length` of a payload reads its size only.
pub(crate) fn select_summary(filter: &str) -> String {
    format!(
        "SELECT provider, event_key, status, attempts, last_path, result_status, last_error,
                dead_reason, mode, length(payload) AS payload_bytes,
                {LEASE_LEFT_MS} AS lease_left_ms, created_at, updated_at
         FROM webhook_events {filter}"
    )
}

/// Reads a row as a list shows it; the outer `Result` is SQLite's, the inner one
/// hookgate's checks.
pub(crate) fn summary(r: &Row<'_>) -> rusqlite::Result<Result<EventSummary, StoreError>> {
    let status: String = r.get("status")?;
    let last_path: String = r.get("last_path")?;
    let lease_left_ms: i64 = r.get("lease_left_ms")?;
    let Some(status) = Status::parse(&status) else {
        return Ok(Err(StoreError::Corrupt(
            format!("status {status:?}").into(),
        )));
    };
    Ok(Ok(EventSummary {
        id: EventId::new(
            r.get::<_, String>("provider")?,
            r.get::<_, String>("event_key")?,
        ),
        status,
        attempts: r.get("attempts")?,
        last_path: ClaimPath::parse(&last_path),
        result_status: r.get("result_status")?,
        last_error: r.get("last_error")?,
        dead_reason: r.get("dead_reason")?,
        payload_bytes: r
            .get::<_, Option<i64>>("payload_bytes")?
            .map(|n| n.max(0).unsigned_abs()),
        lease_left: Duration::from_millis(lease_left_ms.max(0).unsigned_abs()),
        mode: r.get("mode")?,
        created_at: r.get("created_at")?,
        updated_at: r.get("updated_at")?,
    }))
}

pub(crate) fn fenced(changed: rusqlite::Result<usize>) -> Result<Fenced, StoreError> {
    Ok(if changed.map_err(sql_error)? == 1 {
        Fenced::Applied
    } else {
        Fenced::Stale
    })
}

/// Reads a whole row; the outer `Result` is SQLite's, the inner one hookgate's checks.
pub(crate) fn record(r: &Row<'_>) -> rusqlite::Result<Result<EventRecord, StoreError>> {
    let status: String = r.get("status")?;
    let last_path: String = r.get("last_path")?;
    let result_status: Option<u16> = r.get("result_status")?;
    let result = match result_status {
        Some(status) => Some(StoredResult {
            status,
            content_type: r.get("result_content_type")?,
            body: r
                .get::<_, Option<Vec<u8>>>("result_body")?
                .unwrap_or_default(),
        }),
        None => None,
    };
    let lease_left_ms: i64 = r.get("lease_left_ms")?;
    let Some(status) = Status::parse(&status) else {
        return Ok(Err(StoreError::Corrupt(
            format!("status {status:?}").into(),
        )));
    };
    Ok(Ok(EventRecord {
        id: EventId::new(
            r.get::<_, String>("provider")?,
            r.get::<_, String>("event_key")?,
        ),
        status,
        attempts: r.get("attempts")?,
        last_path: ClaimPath::parse(&last_path),
        fingerprint: r.get("fingerprint")?,
        result,
        payload: r.get("payload")?,
        last_error: r.get("last_error")?,
        dead_reason: r.get("dead_reason")?,
        content_type: r.get("content_type")?,
        request_headers: r.get("request_headers")?,
        lease_left: Duration::from_millis(lease_left_ms.max(0).unsigned_abs()),
        mode: r.get("mode")?,
        created_at: r.get("created_at")?,
        updated_at: r.get("updated_at")?,
    }))
}
