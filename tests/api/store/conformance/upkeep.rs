//! Upkeep, on both stores: a retention pass keeps what is inside retention and removes
//! the rest within two passes, the sweep deletes only old terminal rows in bounded
//! batches, and migrations can run again.

use std::sync::Arc;
use std::time::Duration;

use hookgate::claim::{Path, Status};
use hookgate::outcome::DeadReason;
use hookgate::store::{Enqueued, Retention, Store};

use crate::helpers::failure;

use super::{claim, id, queued, result, won, EXPIRED, LEASE};

/// A retention pass (`Store::retain`, each store's own way: row by row, or a ring of
/// slots turned and emptied) keeps every row inside its retention, and removes a done row
/// or dead letter past it within two passes (a ring's turn, then its emptying); rows not
/// final are never removed. What survives answers as before, across the slots a ring
/// turned: a failed row is retried, a held one stays held, a removed key is new again.
async fn retention_keeps_what_is_inside_it_and_removes_the_rest_within_two_passes(
    store: Arc<dyn Store>,
) {
    for n in 0..5 {
        let key = format!("done{n}");
        claim(&*store, &key, LEASE).await;
        store
            .complete(&id(&key), 1, &result("ok"), None)
            .await
            .unwrap();
    }
    claim(&*store, "dead", LEASE).await;
    store
        .fail(&id("dead"), 1, &failure(Some(DeadReason::NonRetryable)))
        .await
        .unwrap();
    claim(&*store, "failed", LEASE).await;
    store.fail(&id("failed"), 1, &failure(None)).await.unwrap();
    claim(&*store, "held", LEASE).await;
    assert_eq!(
        store.enqueue(&queued("queued")).await.unwrap(),
        Enqueued::Inserted
    );
    let policy = |done: Duration, dead: Duration| Retention {
        done,
        dead,
        batch: 2,
        budget: Duration::from_secs(60),
        interval: Duration::ZERO,
    };
    let (hour, now) = (Duration::from_secs(3600), Duration::ZERO);
    let pass = |policy: Retention| {
        let store = Arc::clone(&store);
        async move { store.retain(&policy).await.unwrap() }
    };
    for _ in 0..3 {
        let kept = pass(policy(hour, hour)).await;
        assert_eq!(
            (kept.done, kept.dead),
            (0, 0),
            "everything is inside retention"
        );
    }
    let status = |key: &'static str| {
        let store = Arc::clone(&store);
        async move { store.lookup(&id(key)).await.unwrap().map(|r| r.status) }
    };
    assert_eq!(status("done0").await, Some(Status::Done));

    let (first, second) = (pass(policy(now, hour)).await, pass(policy(now, hour)).await);
    assert_eq!((first.done + second.done, first.dead + second.dead), (5, 0));
    for n in 0..5 {
        assert!(store
            .lookup(&id(&format!("done{n}")))
            .await
            .unwrap()
            .is_none());
    }
    assert_eq!(status("dead").await, Some(Status::Dead));
    assert_eq!(status("failed").await, Some(Status::Failed));
    assert_eq!(status("held").await, Some(Status::InProgress));
    assert_eq!(status("queued").await, Some(Status::Queued));
    assert_eq!(
        won(&claim(&*store, "done0", LEASE).await),
        Some((1, Path::FirstRun))
    );
    assert_eq!(
        won(&claim(&*store, "failed", LEASE).await),
        Some((2, Path::RetryAfterFailure))
    );
    assert_eq!(won(&claim(&*store, "held", LEASE).await), None);

    let (first, second) = (pass(policy(hour, now)).await, pass(policy(hour, now)).await);
    assert_eq!(first.dead + second.dead, 1);
    assert_eq!(status("dead").await, None);
    assert_eq!(status("failed").await, Some(Status::InProgress));
    assert_eq!(status("queued").await, Some(Status::Queued));
    assert_eq!(status("done0").await, Some(Status::InProgress));
}

async fn the_sweep_deletes_only_old_terminal_rows_in_bounded_batches(store: Arc<dyn Store>) {
    for i in 0..5 {
        let key = format!("done{i}");
        claim(&*store, &key, LEASE).await;
        store
            .complete(&id(&key), 1, &result("ok"), None)
            .await
            .unwrap();
    }
    claim(&*store, "dead", LEASE).await;
    store
        .fail(&id("dead"), 1, &failure(Some(DeadReason::NonRetryable)))
        .await
        .unwrap();
    claim(&*store, "failed", LEASE).await;
    store.fail(&id("failed"), 1, &failure(None)).await.unwrap();
    claim(&*store, "held", EXPIRED).await;

    let hour = Duration::from_secs(3600);
    assert_eq!(
        store.sweep(Status::Done, hour, 100).await.unwrap(),
        0,
        "all fresh"
    );
    assert_eq!(
        store.sweep(Status::Done, Duration::ZERO, 2).await.unwrap(),
        2
    );
    assert_eq!(
        store
            .sweep(Status::Done, Duration::ZERO, 100)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        store
            .sweep(Status::Dead, Duration::ZERO, 100)
            .await
            .unwrap(),
        1
    );
    assert!(store.lookup(&id("done0")).await.unwrap().is_none());
    assert!(store.lookup(&id("dead")).await.unwrap().is_none());
    assert!(store.lookup(&id("failed")).await.unwrap().is_some());
    assert!(store.lookup(&id("held")).await.unwrap().is_some());
}

async fn migrations_can_run_again(store: Arc<dyn Store>) {
    store.migrate().await.expect("second migrate");
    store.ping().await.expect("ping");
}

conformance!(
    retention_keeps_what_is_inside_it_and_removes_the_rest_within_two_passes,
    the_sweep_deletes_only_old_terminal_rows_in_bounded_batches,
    migrations_can_run_again,
);
