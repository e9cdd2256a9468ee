//! A duplicate answered from its row (one the node's done cache does not hold) reads the
//! row and writes nothing: no claim changes a `done` or `dead` row, so none locks it.
//! Postgres's `ON CONFLICT DO UPDATE` locks the row it meets even when its `WHERE` leaves
//! the row alone — a write of the row's heap page and a WAL record for every duplicate,
//! which at tens of millions of rows is a random page write each. A row a claim locked
//! carries the locker in `xmax`; a row nobody locked since its last change carries none.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, Status};
use hookgate::key::EventId;
use hookgate::store::Store;

use crate::helpers::{spawn_app_with, TestApp, TestDb, PROVIDER};

/// Rows of webhook_events (provider `provider`) that a transaction locked or deleted
/// since their last change.
async fn locked_rows(db: &TestDb, provider: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM webhook_events WHERE provider = $1 AND xmax::text <> '0'",
        &[&provider],
    )
    .await
    .get(0)
}

#[actix_web::test]
async fn redeliveries_answered_from_their_rows_leave_the_rows_unwritten() {
    let app = spawn_app_with(|c| c.cache.capacity = 0).await;
    let keys: Vec<String> = (0..20).map(|i| format!("evt_dup{i}")).collect();
    for key in &keys {
        assert_eq!(app.deliver(key, "{}").await.path, "first_run");
    }
    assert_eq!(locked_rows(&app.db, PROVIDER).await, 0);

    // Three copies of each key at once: the node's claims share batch statements, and
    // one copy at a time runs the single-row statement.
    let mut answers = join_all(keys.iter().flat_map(|k| {
        [
            app.deliver(k, "{}"),
            app.deliver(k, "{}"),
            app.deliver(k, "{}"),
        ]
    }))
    .await;
    for key in &keys {
        answers.push(app.deliver(key, "{}").await);
    }
    assert!(
        answers.iter().all(|a| a.path == "duplicate_done"),
        "{answers:?}"
    );
    for key in &keys {
        assert_eq!(app.target.count(&TestApp::idem(key)), 1, "{key}");
    }
    assert_eq!(
        locked_rows(&app.db, PROVIDER).await,
        0,
        "a duplicate locked its done row"
    );
}

#[actix_web::test]
async fn claims_of_dead_letters_leave_the_rows_unwritten() {
    let db = TestDb::new().await;
    let store: Arc<dyn Store> = db.store().await;
    db.fill_dead(20).await;
    let lease = Duration::from_secs(30);
    let claim = |i: u32| {
        let store = Arc::clone(&store);
        async move {
            store
                .claim(&EventId::new("p", format!("k{i}")), None, lease, None)
                .await
                .expect("a claim")
        }
    };
    // Together (a batch statement), then one at a time (the single-row statement).
    let mut results = join_all((1..=20).map(claim)).await;
    for i in 1..=20 {
        results.push(claim(i).await);
    }
    for result in &results {
        assert!(
            matches!(result, ClaimResult::Existing(row) if row.status == Status::Dead),
            "{result:?}"
        );
    }
    assert_eq!(
        locked_rows(&db, "p").await,
        0,
        "a claim locked a dead letter"
    );
}
