//! An event with other routes: its answering route's claim (or enqueue) and the other
//! routes' rows commit together. The statements are the single-route ones (`CLAIM`,
//! `ENQUEUE`, and their batches), run in one transaction with an `ENQUEUE_BATCH` of the
//! other routes' rows for the keys that were won (or written); a call with no other
//! routes runs as it did, in autocommit, with no transaction to pay for.

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::Client;

use super::batch::enqueue_batch_on;
use crate::claim::ClaimResult;
use crate::store::{Enqueued, QueueRow, StoreError};

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
