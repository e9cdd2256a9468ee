//! An event with other routes: their rows are written in the commit that wins its claim
//! (or writes its queue row), queued and due, each a row of its own scope; a claim that is
//! not won, a duplicate, and an enqueue of a known key write none; rows that exist are left
//! as they stand; parallel claims and enqueues of one event write each route's row once,
//! in single calls and in batches.

use std::sync::Arc;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, Path, Status};
use hookgate::key::EventId;
use hookgate::store::{Enqueued, QueueRow, Routed, Store};

use super::{claim, existing, queued, result, won, LEASE};

/// The event `key`'s rows for the routes `a` and `b` of provider `p`.
fn others(key: &str) -> Vec<QueueRow> {
    ["p.a", "p.b"]
        .into_iter()
        .map(|scope| QueueRow {
            id: EventId::new(scope, key),
            ..queued(key)
        })
        .collect()
}

async fn status(store: &dyn Store, scope: &str, key: &str) -> Option<Status> {
    let row = store
        .lookup(&EventId::new(scope, key))
        .await
        .expect("lookup");
    row.map(|r| r.status)
}

async fn claim_routed(store: &dyn Store, key: &str) -> ClaimResult {
    routed_claim(store, key).await.answer
}

async fn routed_claim(store: &dyn Store, key: &str) -> Routed<ClaimResult> {
    store
        .claim_routed(
            &super::id(key),
            Some("fp"),
            LEASE,
            None,
            Path::FirstRun,
            &others(key),
        )
        .await
        .expect("claim")
}

async fn a_won_claim_writes_the_other_routes_rows_and_nothing_else_does(store: Arc<dyn Store>) {
    let first = routed_claim(&*store, "r1").await;
    assert!(won(&first.answer).is_some());
    assert_eq!(first.written, vec![true, true]);
    for scope in ["p.a", "p.b"] {
        assert_eq!(
            status(&*store, scope, "r1").await,
            Some(Status::Queued),
            "{scope}"
        );
        let row = store
            .lookup(&EventId::new(scope, "r1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.payload.as_deref(), Some(&b"{\"q\":1}"[..]));
        assert_eq!(row.mode, "queue");
    }
    // Due for the scheduler, each in its own scope.
    let due = store.due("p.a", 10).await.unwrap();
    assert_eq!(due.len(), 1);

    // A claim that is not won writes nothing: the key of `r2` is held.
    assert!(won(&claim(&*store, "r2", LEASE).await).is_some());
    let refused = routed_claim(&*store, "r2").await;
    assert_eq!(refused.written, vec![false, false]);
    existing(refused.answer);
    assert_eq!(status(&*store, "p.a", "r2").await, None);

    // A won retry of the answering route leaves the routes' rows as they stand: `p.a` done.
    let taken = store
        .take(&EventId::new("p.a", "r1"), LEASE)
        .await
        .unwrap()
        .unwrap();
    store
        .complete(&taken.id, taken.attempts, &result("a"), None)
        .await
        .unwrap();
    store
        .fail(&super::id("r1"), 1, &crate::helpers::failure(None))
        .await
        .unwrap();
    let retried = routed_claim(&*store, "r1").await;
    assert_eq!(won(&retried.answer).map(|w| w.0), Some(2));
    assert_eq!(retried.written, vec![false, false], "both rows existed");
    assert_eq!(status(&*store, "p.a", "r1").await, Some(Status::Done));
    assert_eq!(status(&*store, "p.b", "r1").await, Some(Status::Queued));

    // A row with `start` is written taken for its first attempt: in progress, not due.
    let mut started = others("r5");
    started[0].start = Some(LEASE);
    let claimed = store
        .claim_routed(
            &super::id("r5"),
            Some("fp"),
            LEASE,
            None,
            Path::FirstRun,
            &started,
        )
        .await
        .unwrap();
    assert_eq!(claimed.written, vec![true, true]);
    let row = store
        .lookup(&EventId::new("p.a", "r5"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.status, row.attempts), (Status::InProgress, 1));
    assert!(row.lease_left > std::time::Duration::ZERO);
    assert_eq!(status(&*store, "p.b", "r5").await, Some(Status::Queued));
    let due = store.due("p.a", 10).await.unwrap();
    assert!(due.iter().all(|id| &*id.key != "r5"), "{due:?}");

    // A queue row written: the others too; a known key: none.
    let inserted = store
        .enqueue_routed(&queued("r3"), &others("r3"))
        .await
        .unwrap();
    assert_eq!(inserted.answer, Enqueued::Inserted);
    assert_eq!(inserted.written, vec![true, true]);
    assert_eq!(status(&*store, "p.b", "r3").await, Some(Status::Queued));
    let again = store.enqueue(&queued("r4")).await.unwrap();
    assert_eq!(again, Enqueued::Inserted);
    let known = store
        .enqueue_routed(&queued("r4"), &others("r4"))
        .await
        .unwrap();
    assert!(matches!(known.answer, Enqueued::Existing(_)), "{known:?}");
    assert_eq!(known.written, vec![false, false]);
    assert_eq!(status(&*store, "p.a", "r4").await, None);
}

/// Parallel claims and enqueues of many routed events (the store's batches under load):
/// one winner each, and every route's row written once.
async fn parallel_routed_claims_write_each_routes_row_once(store: Arc<dyn Store>) {
    let keys: Vec<String> = (0..24).map(|n| format!("rp{n}")).collect();
    let claims = keys.iter().flat_map(|key| {
        let store = &store;
        (0..3).map(move |_| async move { (key.clone(), claim_routed(&**store, key).await) })
    });
    let answers = join_all(claims).await;
    for key in &keys {
        let winners = answers
            .iter()
            .filter(|(k, a)| k == key && won(a).is_some())
            .count();
        assert_eq!(winners, 1, "{key}");
        for scope in ["p.a", "p.b"] {
            assert_eq!(
                status(&*store, scope, key).await,
                Some(Status::Queued),
                "{scope} {key}"
            );
        }
    }
    let enqueues = (0..24).map(|n| {
        let store = &store;
        async move {
            let key = format!("rq{}", n % 8);
            store
                .enqueue_routed(&queued(&key), &others(&key))
                .await
                .unwrap()
        }
    });
    let inserted = join_all(enqueues)
        .await
        .into_iter()
        .filter(|e| e.answer == Enqueued::Inserted)
        .count();
    assert_eq!(inserted, 8);
    assert_eq!(store.due("p.b", 100).await.unwrap().len(), 24 + 8);
}

/// One event answered on two routes at once (its deliveries' payloads took different
/// routes), both carrying the row of a third: that row is written once and said written to
/// one claim only — the one whose shard starts it — whether or not the two calls share a
/// statement.
async fn an_other_row_two_claims_carry_is_written_for_one(store: Arc<dyn Store>) {
    for n in 0..16 {
        let key = format!("rs{n}");
        let b = vec![QueueRow {
            id: EventId::new("p.b", key.as_str()),
            ..queued(&key)
        }];
        let (main_id, a_id) = (super::id(&key), EventId::new("p.a", key.as_str()));
        let (main, a) = futures_util::join!(
            store.claim_routed(&main_id, Some("fp"), LEASE, None, Path::FirstRun, &b),
            store.claim_routed(&a_id, Some("fp"), LEASE, None, Path::FirstRun, &b),
        );
        let (main, a) = (main.unwrap(), a.unwrap());
        assert!(
            won(&main.answer).is_some() && won(&a.answer).is_some(),
            "{key}"
        );
        let told = [&main, &a]
            .iter()
            .filter(|r| r.written == vec![true])
            .count();
        assert_eq!(told, 1, "{key}: {:?} {:?}", main.written, a.written);
        assert_eq!(status(&*store, "p.b", &key).await, Some(Status::Queued));
    }
}

/// A redelivery never changes an event's routes: a won retry of a row written without
/// other routes (its first delivery picked none) writes none, whatever this call carries;
/// and a row claimed `filtered` is won `filtered` again when its lease is retaken (the row,
/// not the redelivery, says what the attempt does), while a failed row is won as a retry.
async fn a_won_retry_or_retake_writes_no_route_row_and_keeps_a_filtered_claim(
    store: Arc<dyn Store>,
) {
    assert!(won(&claim(&*store, "rr", LEASE).await).is_some());
    store
        .fail(&super::id("rr"), 1, &crate::helpers::failure(None))
        .await
        .unwrap();
    let retried = routed_claim(&*store, "rr").await;
    assert_eq!(
        won(&retried.answer),
        Some((2, Path::RetryAfterFailure)),
        "{retried:?}"
    );
    assert_eq!(retried.written, vec![false, false]);
    assert_eq!(status(&*store, "p.a", "rr").await, None);
    assert_eq!(status(&*store, "p.b", "rr").await, None);

    let filtered = store
        .claim_routed(
            &super::id("rf"),
            Some("fp"),
            super::EXPIRED,
            None,
            Path::Filtered,
            &[],
        )
        .await
        .unwrap();
    assert_eq!(won(&filtered.answer), Some((1, Path::Filtered)));
    let retaken = routed_claim(&*store, "rf").await;
    assert_eq!(
        won(&retaken.answer),
        Some((2, Path::Filtered)),
        "{retaken:?}"
    );
    assert_eq!(retaken.written, vec![false, false]);
}

conformance!(
    a_won_claim_writes_the_other_routes_rows_and_nothing_else_does,
    a_won_retry_or_retake_writes_no_route_row_and_keeps_a_filtered_claim,
    parallel_routed_claims_write_each_routes_row_once,
    an_other_row_two_claims_carry_is_written_for_one,
);

/// The other routes' rows and the claim commit together or not at all: a row Postgres
/// refuses (a NUL in its scope) leaves no claim behind either.
#[actix_web::test]
async fn a_claim_whose_other_routes_rows_fail_is_not_committed() {
    let db = crate::helpers::TestDb::on(crate::helpers::Backend::Postgres).await;
    let store = db.store().await;
    let bad = vec![QueueRow {
        id: EventId::new("p.\0", "ra"),
        ..queued("ra")
    }];
    let claimed = store
        .claim_routed(
            &super::id("ra"),
            Some("fp"),
            LEASE,
            None,
            Path::FirstRun,
            &bad,
        )
        .await;
    assert!(claimed.is_err(), "{claimed:?}");
    assert_eq!(
        status(&*store, "p", "ra").await,
        None,
        "the claim was committed"
    );
    let enqueued = store.enqueue_routed(&queued("ra"), &bad).await;
    assert!(enqueued.is_err(), "{enqueued:?}");
    assert_eq!(
        status(&*store, "p", "ra").await,
        None,
        "the row was committed"
    );
    // The connection went back clean: the next claim is won.
    assert!(won(&claim_routed(&*store, "ra").await).is_some());
}
