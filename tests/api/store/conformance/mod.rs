//! The store conformance suite: every rule of the row, written once against the `Store`
//! trait and run against each backend. Time travel is done with a zero lease (expired the
//! moment it is taken), so no test reaches into a backend's tables.
//!
//! * `claim.rs` — the claim: won once, held, retried, raced.
//! * `dead_letters.rs` — dead letters listed, paged, replayed once; sender-gave-up rows.
//! * `outcome.rs` — completions and failures: terminal states, fencing, waves.
//! * `queue.rs` — queue rows: enqueued, taken, renewed, retried, listed.
//! * `routes.rs` — an event's other routes' rows, written with its won claim or new row.
//! * `upkeep.rs` — retention passes, sweeps, migrations run again.

use std::time::Duration;

use actix_web::web::Bytes;
use hookgate::claim::{ClaimResult, Path, StoredResult};
use hookgate::key::EventId;
use hookgate::store::{Failure, QueueRow, Store};

use crate::helpers::failure;

const LEASE: Duration = Duration::from_secs(30);
const EXPIRED: Duration = Duration::ZERO;

fn id(key: &str) -> EventId {
    EventId::new("p", key)
}

fn result(body: &str) -> StoredResult {
    StoredResult {
        status: 200,
        content_type: Some("text/plain".into()),
        body: body.as_bytes().to_vec(),
    }
}

fn queued(key: &str) -> QueueRow {
    QueueRow {
        id: id(key),
        fingerprint: Some("fp".into()),
        payload: Bytes::from_static(b"{\"q\":1}"),
        content_type: Some("application/json".into()),
        headers: None,
        keep_payload: false,
        start: None,
    }
}

/// A queue row's failure with its backoff.
fn retry_in(after: Duration) -> Failure {
    Failure {
        retry_in: Some(after),
        ..failure(None)
    }
}

async fn take(store: &dyn Store, key: &str, lease: Duration) -> Option<(i32, Path)> {
    store
        .take(&id(key), lease)
        .await
        .expect("take")
        .map(|t| (t.attempts, t.path))
}

async fn due(store: &dyn Store) -> Vec<String> {
    let keys = store.due("p", 100).await.expect("due");
    keys.iter().map(|k| k.key.to_string()).collect()
}

async fn claim(store: &dyn Store, key: &str, lease: Duration) -> ClaimResult {
    store
        .claim(&id(key), Some("fp"), lease, None)
        .await
        .expect("claim")
}

fn won(result: &ClaimResult) -> Option<(i32, Path)> {
    match result {
        ClaimResult::Won { attempts, path } => Some((*attempts, *path)),
        ClaimResult::Existing(_) => None,
    }
}

fn existing(result: ClaimResult) -> hookgate::claim::RowState {
    match result {
        ClaimResult::Existing(row) => row,
        ClaimResult::Won { .. } => panic!("expected the claim to be refused"),
    }
}

/// Runs each named suite function against each backend.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[actix_web::test]
                async fn $name() {
                    let db = crate::helpers::TestDb::on(crate::helpers::Backend::Postgres).await;
                    super::$name(db.store().await).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[actix_web::test]
                async fn $name() {
                    let db = crate::helpers::TestDb::on(crate::helpers::Backend::Sqlite).await;
                    super::$name(db.store().await).await;
                }
            )*
        }
        // The same rules through a store that seals what it keeps: sealing changes
        // nothing a caller sees.
        mod sealed_postgres {
            $(
                #[actix_web::test]
                async fn $name() {
                    let db = crate::helpers::TestDb::on(crate::helpers::Backend::Postgres).await;
                    super::$name(db.sealed_store(&["conformance"]).await).await;
                }
            )*
        }
        mod sealed_sqlite {
            $(
                #[actix_web::test]
                async fn $name() {
                    let db = crate::helpers::TestDb::on(crate::helpers::Backend::Sqlite).await;
                    super::$name(db.sealed_store(&["conformance"]).await).await;
                }
            )*
        }
    };
}

mod claim;
mod dead_letters;
mod outcome;
mod queue;
mod routes;
mod upkeep;
