//! Decoding the Postgres store's rows and classifying its errors. No SQL is run here.

use std::time::Duration;

use deadpool_postgres::PoolError;
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use crate::claim::{ClaimResult, Mode, Path, RowState, Status, StoredResult};
use crate::key::EventId;
use crate::store::{Cause, Enqueued, EventRecord, EventSummary, StoreError};

pub(crate) fn claim_result(row: &Row) -> Result<ClaimResult, StoreError> {
    let won: bool = get(row, "won")?;
    let attempts: i32 = get(row, "attempts")?;
    if won {
        let path = parse_path(&get::<String>(row, "last_path")?)?;
        return Ok(ClaimResult::Won { attempts, path });
    }
    Ok(ClaimResult::Existing(row_state(row)?))
}

/// The row as a claim or an enqueue that did not win reports it.
pub(crate) fn row_state(row: &Row) -> Result<RowState, StoreError> {
    Ok(RowState {
        mode: parse_mode(&get::<String>(row, "mode")?)?,
        status: parse_status(&get::<String>(row, "status")?)?,
        attempts: get(row, "attempts")?,
        fingerprint: get(row, "fingerprint")?,
        lease_left: lease_left(row)?,
        result: stored_result(row)?,
    })
}

/// The row an enqueue reported: a queue row as it stands, or a sync row (see
/// [`Enqueued::SyncRow`]).
pub(crate) fn existing(row: &Row) -> Result<Enqueued, StoreError> {
    let state = row_state(row)?;
    Ok(match state.mode {
        Mode::Sync => Enqueued::SyncRow(state),
        Mode::Queue => Enqueued::Existing(state),
    })
}

pub(crate) fn record(row: &Row) -> Result<EventRecord, StoreError> {
    Ok(EventRecord {
        id: EventId::new(
            get::<String>(row, "provider")?,
            get::<String>(row, "event_key")?,
        ),
        status: parse_status(&get::<String>(row, "status")?)?,
        attempts: get(row, "attempts")?,
        last_path: Path::parse(&get::<String>(row, "last_path")?),
        fingerprint: get(row, "fingerprint")?,
        result: stored_result(row)?,
        payload: get(row, "payload")?,
        last_error: get(row, "last_error")?,
        dead_reason: get(row, "dead_reason")?,
        content_type: get(row, "content_type")?,
        request_headers: get(row, "request_headers")?,
        lease_left: lease_left(row)?,
        mode: get(row, "mode")?,
        created_at: get(row, "created_unix")?,
        updated_at: get(row, "updated_unix")?,
    })
}

/// A row as a list shows it ([`summary_columns!`](super::sql::summary_columns)).
pub(crate) fn summary(row: &Row) -> Result<EventSummary, StoreError> {
    Ok(EventSummary {
        id: EventId::new(
            get::<String>(row, "provider")?,
            get::<String>(row, "event_key")?,
        ),
        status: parse_status(&get::<String>(row, "status")?)?,
        attempts: get(row, "attempts")?,
        last_path: Path::parse(&get::<String>(row, "last_path")?),
        result_status: get::<Option<i16>>(row, "result_status")?
            .map(|s| {
                u16::try_from(s)
                    .map_err(|_| StoreError::Corrupt(format!("result_status {s}").into()))
            })
            .transpose()?,
        last_error: get(row, "last_error")?,
        dead_reason: get(row, "dead_reason")?,
        payload_bytes: get::<Option<i64>>(row, "payload_bytes")?
            .map(|n| u64::try_from(n).unwrap_or(0)),
        lease_left: lease_left(row)?,
        mode: get(row, "mode")?,
        created_at: get(row, "created_unix")?,
        updated_at: get(row, "updated_unix")?,
    })
}

fn stored_result(row: &Row) -> Result<Option<StoredResult>, StoreError> {
    let status: Option<i16> = get(row, "result_status")?;
    Ok(match status {
        Some(status) => Some(StoredResult {
            status: u16::try_from(status)
                .map_err(|_| StoreError::Corrupt(format!("result_status {status}").into()))?,
            content_type: get(row, "result_content_type")?,
            body: get::<Option<Vec<u8>>>(row, "result_body")?.unwrap_or_default(),
        }),
        None => None,
    })
}

fn lease_left(row: &Row) -> Result<Duration, StoreError> {
    let ms: Option<i64> = get(row, "lease_left_ms")?;
    Ok(Duration::from_millis(
        ms.unwrap_or(0).max(0).try_into().unwrap_or(0),
    ))
}

pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    column: &str,
) -> Result<T, StoreError> {
    row.try_get(column)
        .map_err(|e| StoreError::Corrupt(format!("column {column}: {e}").into()))
}

fn parse_status(text: &str) -> Result<Status, StoreError> {
    Status::parse(text).ok_or_else(|| StoreError::Corrupt(format!("status {text:?}").into()))
}

pub(crate) fn parse_mode(text: &str) -> Result<Mode, StoreError> {
    Mode::parse(text).ok_or_else(|| StoreError::Corrupt(format!("mode {text:?}").into()))
}

pub(crate) fn parse_path(text: &str) -> Result<Path, StoreError> {
    Path::parse(text).ok_or_else(|| StoreError::Corrupt(format!("last_path {text:?}").into()))
}

/// Connection trouble is `Unavailable` (retry later, the sender will); a refusal the same
/// statement may get past soon is `Transient`; anything else the server refused is a
/// `Query` error. The driver's error is kept whole (its SQLSTATE, its causes).
///
/// A connection that closed with a statement on it is `TimedOut`, not `Unavailable`: the
/// statement may have committed (a primary killed after its standby had the commit, or a
/// backend ended while it waited for the standby) — whether it took effect is unknown, so a
/// retried outcome write that finds its row already written reads it back
/// (`shard::record`) instead of taking it for another attempt's.
pub(crate) fn db_error(e: tokio_postgres::Error) -> StoreError {
    let code = e.code().cloned();
    if code.is_none() && e.is_closed() {
        return StoreError::TimedOut(
            format!(
                "the connection closed with a statement on it, which may have taken effect ({e})"
            )
            .into(),
        );
    }
    classify(code.as_ref(), Cause::of(e))
}

/// The kind of a Postgres failure, by its SQLSTATE (`None`: no answer from the server).
pub(crate) fn classify(code: Option<&SqlState>, cause: Cause) -> StoreError {
    let Some(code) = code else {
        return StoreError::Unavailable(cause);
    };
    if code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
    {
        StoreError::Unavailable(cause)
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::QUERY_CANCELED
        || *code == SqlState::LOCK_NOT_AVAILABLE
    {
        StoreError::Transient(cause)
    } else {
        StoreError::Query(cause)
    }
}

/// Whether the server refused a write because it is read-only (SQLSTATE 25006): a
/// standby, or a primary fenced read-only during a switchover. The connection that got it
/// must not be reused: it stays on that server.
pub(crate) fn is_read_only(e: &StoreError) -> bool {
    e.cause()
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code)
        == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)
}

/// Whether a statement gave up waiting for a lock (SQLSTATE 55P03: `lock_timeout`, or
/// `NOWAIT`).
pub(crate) fn is_lock_timeout(e: &StoreError) -> bool {
    e.cause()
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code)
        == Some(&SqlState::LOCK_NOT_AVAILABLE)
}

/// Waiting for a pooled connection past `pool_timeout` is overload (`Busy`); failing to
/// open one is an outage.
pub(crate) fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => db_error(e),
        e @ PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => {
            StoreError::Busy(Cause::of(e))
        }
        other => StoreError::Unavailable(Cause::of(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_that_pass_by_themselves_are_transient_and_lost_connections_an_outage() {
        for code in [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::QUERY_CANCELED,
        ] {
            let e = classify(Some(&code), "x".into());
            assert!(matches!(e, StoreError::Transient(_)), "{code:?}");
            assert!(e.is_transient() && !e.is_outage());
        }
        for code in [SqlState::TOO_MANY_CONNECTIONS, SqlState::CONNECTION_FAILURE] {
            let e = classify(Some(&code), "x".into());
            assert!(e.is_outage() && e.is_transient(), "{code:?}");
        }
        assert!(classify(None, "eof".into()).is_outage());
        let syntax = classify(Some(&SqlState::SYNTAX_ERROR), "x".into());
        assert!(!syntax.is_transient());
    }
}
