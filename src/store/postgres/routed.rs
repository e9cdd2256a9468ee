//! An event with other routes: its answering route's claim (or enqueue) and the other
//! routes' rows commit together. The statements are the single-route ones (`CLAIM`,
//! `ENQUEUE`, and their batches), run in one transaction with an `ENQUEUE_BATCH` of the
//! other routes' rows for the keys that were won (or written); a call with no other
//! routes runs as it did, in autocommit, with no transaction to pay for.
//!
//! The `ENQUEUE_BATCH` runner lives here, with the batches' error and report types: the
//! enqueue batch (`batch.rs`) and the alone paths (`pool.rs`, `queue.rs`) share it.

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::Client;

use std::collections::HashMap;

use tokio_postgres::error::SqlState;

use super::batch_sql::ENQUEUE_BATCH;
use super::rows::{db_error, existing, get};
use crate::claim::ClaimResult;
use crate::key::EventId;
use crate::store::{millis, Enqueued, QueueRow, StoreError};

/// Runs `op` in a transaction on `client` when `routed`, else as it is. A failed `op` (or
/// `BEGIN`) is rolled back before the connection goes back to its pool; `coded` turns the
/// driver's errors of `BEGIN`/`COMMIT` into `op`'s error type.
pub(super) async fn atomic<T, E>(
    client: &Client,
    routed: bool,
    coded: fn(tokio_postgres::Error) -> E,
    op: impl AsyncFnOnce(&Client) -> Result<T, E>,
) -> Result<T, E> {
    if !routed {
        return op(client).await;
    }
    // `BEGIN` goes out in the same round trip as `op`'s first statement: a connection
    // answers in order, and the request is queued when its future is first polled.
    let (begun, done) = futures_util::join!(client.batch_execute("BEGIN"), op(client));
    match begun.map_err(coded).and(done) {
        Ok(value) => {
            client.batch_execute("COMMIT").await.map_err(coded)?;
            Ok(value)
        }
        Err(e) => {
            // A connection whose rollback fails is broken, and its pool discards it.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// The keys of the other routes' rows a statement wrote.
pub(super) type Written = HashSet<(Arc<str>, Arc<str>)>;

/// Writes the other routes' rows of the calls whose own row was won or written (each as
/// `ENQUEUE` writes one: queued and due now, or taken with its `start`, unless its key is
/// known); answers the keys it wrote.
pub(super) async fn write_others(
    client: &Client,
    others: &[&QueueRow],
) -> Result<Written, (StoreError, Option<tokio_postgres::error::SqlState>)> {
    if others.is_empty() {
        return Ok(Written::new());
    }
    let reported = enqueue_batch_on(client, others).await?;
    Ok(reported
        .into_iter()
        .filter(|(_, answer)| matches!(answer, Ok(Enqueued::Inserted)))
        .map(|(key, _)| key)
        .collect())
}

/// Which of `others` `written` holds, in order.
pub(super) fn written_of(others: &[QueueRow], written: &Written) -> Vec<bool> {
    others
        .iter()
        .map(|o| written.contains(&(Arc::clone(&o.id.provider), Arc::clone(&o.id.key))))
        .collect()
}

/// Whether a claim's answer lets its other routes' rows be written: it was won.
pub(super) fn claim_writes_others(answer: Option<&Result<ClaimResult, StoreError>>) -> bool {
    matches!(answer, Some(Ok(ClaimResult::Won { .. })))
}

/// Whether an enqueue's answer lets its other routes' rows be written: its row is new.
pub(super) fn enqueue_writes_others(answer: Option<&Result<Enqueued, StoreError>>) -> bool {
    matches!(answer, Some(Ok(Enqueued::Inserted)))
}

/// A batch's key for an event.
pub(super) fn key(id: &EventId) -> (Arc<str>, Arc<str>) {
    (Arc::clone(&id.provider), Arc::clone(&id.key))
}

/// A batch statement's error, with its SQLSTATE.
pub(super) type BatchError = (StoreError, Option<SqlState>);

/// The driver's error as a batch's.
pub(super) fn coded(e: tokio_postgres::Error) -> BatchError {
    let code = e.code().cloned();
    (db_error(e), code)
}

/// A batch statement's answers by key; a key it did not report is run alone.
pub(super) type Report<T> = HashMap<(Arc<str>, Arc<str>), Result<T, StoreError>>;

/// `ENQUEUE_BATCH` for `calls`: each row written, or reported as it stands.
pub(super) async fn enqueue_batch_on(
    client: &deadpool_postgres::Client,
    calls: &[&QueueRow],
) -> Result<Report<Enqueued>, BatchError> {
    let plain = |e: StoreError| (e, None);
    let stmt = client.prepare_cached(ENQUEUE_BATCH).await.map_err(coded)?;
    let providers: Vec<&str> = calls.iter().map(|c| &*c.id.provider).collect();
    let keys: Vec<&str> = calls.iter().map(|c| &*c.id.key).collect();
    let fingerprints: Vec<Option<&str>> = calls.iter().map(|c| c.fingerprint.as_deref()).collect();
    let payloads: Vec<&[u8]> = calls.iter().map(|c| &c.payload[..]).collect();
    let content_types: Vec<Option<&str>> =
        calls.iter().map(|c| c.content_type.as_deref()).collect();
    let headers: Vec<Option<&str>> = calls.iter().map(|c| c.headers.as_deref()).collect();
    let starts: Vec<Option<i64>> = calls.iter().map(|c| c.start.map(millis)).collect();
    let keeps: Vec<bool> = calls.iter().map(|c| c.keep_payload).collect();
    let rows = client
        .query(
            &stmt,
            &[
                &providers,
                &keys,
                &fingerprints,
                &payloads,
                &content_types,
                &headers,
                &starts,
                &keeps,
            ],
        )
        .await
        .map_err(coded)?;
    let mut reported = HashMap::with_capacity(rows.len());
    for row in rows {
        let provider: String = get(&row, "provider").map_err(plain)?;
        let event_key: String = get(&row, "event_key").map_err(plain)?;
        let answer = match get::<bool>(&row, "inserted") {
            Ok(true) => Ok(Enqueued::Inserted),
            Ok(false) => existing(&row),
            Err(e) => Err(e),
        };
        reported.insert((provider.into(), event_key.into()), answer);
    }
    Ok(reported)
}
