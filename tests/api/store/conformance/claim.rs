//! The claim, on both stores: a new key is won once and then held, a failed row or an
//! expired lease is won again — once, however many claims race — a different fingerprint
//! never wins, keys are scoped by provider, and a refused claim or enqueue fails alone.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{classify, Path, Status};
use hookgate::key::EventId;
use hookgate::store::{Enqueued, Fenced, Store};

use crate::helpers::failure;

use super::{claim, existing, id, queued, won, EXPIRED, LEASE};

async fn a_new_key_is_won_once_and_then_held(store: Arc<dyn Store>) {
    assert_eq!(
        won(&claim(&*store, "k", LEASE).await),
        Some((1, Path::FirstRun))
    );
    let row = existing(claim(&*store, "k", LEASE).await);
    assert_eq!(row.status, Status::InProgress);
    assert_eq!(row.attempts, 1);
    assert!(
        row.lease_left > Duration::from_secs(20),
        "{:?}",
        row.lease_left
    );
    assert_eq!(classify(&row, Some("fp")), Path::InProgressElsewhere);
}

async fn a_won_retry_of_a_failed_row_holds_it_again(store: Arc<dyn Store>) {
    claim(&*store, "k", LEASE).await;
    assert_eq!(
        store.fail(&id("k"), 1, &failure(None)).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(
        won(&claim(&*store, "k", LEASE).await),
        Some((2, Path::RetryAfterFailure))
    );
    // The retry set the row back to in_progress: a second redelivery does not also win.
    let row = existing(claim(&*store, "k", LEASE).await);
    assert_eq!(row.status, Status::InProgress);
    assert_eq!(row.attempts, 2);
}

/// Many failed rows retried at once (one claim batch on Postgres, whose report branch reads
/// each row as it was before the retake): every retry is won, once.
async fn retries_of_many_failed_rows_at_once_are_each_won(store: Arc<dyn Store>) {
    let keys: Vec<String> = (0..64).map(|i| format!("f{i}")).collect();
    for key in &keys {
        claim(&*store, key, LEASE).await;
        store.fail(&id(key), 1, &failure(None)).await.unwrap();
    }
    let retries = keys.iter().map(|key| {
        let store = Arc::clone(&store);
        async move { won(&claim(&*store, key, LEASE).await) }
    });
    for result in futures_util::future::join_all(retries).await {
        assert_eq!(result, Some((2, Path::RetryAfterFailure)));
    }
}

async fn an_expired_lease_is_retaken(store: Arc<dyn Store>) {
    claim(&*store, "k", EXPIRED).await;
    assert_eq!(
        won(&claim(&*store, "k", LEASE).await),
        Some((2, Path::LeaseRetake))
    );
}

async fn a_different_fingerprint_never_wins_a_failed_row(store: Arc<dyn Store>) {
    claim(&*store, "k", LEASE).await;
    store.fail(&id("k"), 1, &failure(None)).await.unwrap();
    let row = existing(
        store
            .claim(&id("k"), Some("other"), LEASE, None)
            .await
            .unwrap(),
    );
    assert_eq!(row.status, Status::Failed);
    assert_eq!(classify(&row, Some("other")), Path::PayloadMismatch);
}

async fn parallel_claims_of_a_new_key_have_one_winner(store: Arc<dyn Store>) {
    let claims = join_all((0..50).map(|_| claim(&*store, "k", LEASE))).await;
    assert_eq!(claims.iter().filter(|c| won(c).is_some()).count(), 1);
}

async fn parallel_claims_of_a_failed_row_have_one_winner(store: Arc<dyn Store>) {
    claim(&*store, "k", LEASE).await;
    store.fail(&id("k"), 1, &failure(None)).await.unwrap();
    let claims = join_all((0..20).map(|_| claim(&*store, "k", LEASE))).await;
    let winners: Vec<_> = claims.iter().filter_map(won).collect();
    assert_eq!(winners, vec![(2, Path::RetryAfterFailure)]);
}

async fn parallel_claims_of_an_expired_lease_have_one_winner(store: Arc<dyn Store>) {
    claim(&*store, "k", EXPIRED).await;
    let claims = join_all((0..20).map(|_| claim(&*store, "k", LEASE))).await;
    let winners: Vec<_> = claims.iter().filter_map(won).collect();
    assert_eq!(winners, vec![(2, Path::LeaseRetake)]);
}

async fn keys_are_scoped_by_provider(store: Arc<dyn Store>) {
    let a = store
        .claim(&EventId::new("a", "k"), None, LEASE, None)
        .await
        .unwrap();
    let b = store
        .claim(&EventId::new("b", "k"), None, LEASE, None)
        .await
        .unwrap();
    assert!(won(&a).is_some() && won(&b).is_some());
    assert!(store
        .lookup(&EventId::new("c", "k"))
        .await
        .unwrap()
        .is_none());
}

/// The same for claims and enqueues: the call whose text the store refuses (a NUL in its
/// fingerprint or content type) fails alone, and every other call of its wave is answered.
async fn one_refused_claim_or_enqueue_in_a_wave_fails_alone(store: Arc<dyn Store>) {
    let claims = (0..16).map(|i| {
        let store = Arc::clone(&store);
        let fingerprint = if i == 5 { "f\0p" } else { "fp" };
        async move {
            let key = id(&format!("c{i:02}"));
            (i, store.claim(&key, Some(fingerprint), LEASE, None).await)
        }
    });
    for (i, claimed) in join_all(claims).await {
        if i != 5 {
            let claimed = claimed.unwrap_or_else(|e| panic!("claim {i}: {e}"));
            assert_eq!(won(&claimed), Some((1, Path::FirstRun)), "claim {i}");
        }
    }
    let enqueues = (0..16).map(|i| {
        let store = Arc::clone(&store);
        let mut row = queued(&format!("e{i:02}"));
        if i == 5 {
            row.content_type = Some("text/\0".into());
        }
        async move { (i, store.enqueue(&row).await) }
    });
    for (i, enqueued) in join_all(enqueues).await {
        if i != 5 {
            let enqueued = enqueued.unwrap_or_else(|e| panic!("enqueue {i}: {e}"));
            assert!(matches!(enqueued, Enqueued::Inserted), "enqueue {i}");
        }
    }
}

conformance!(
    a_new_key_is_won_once_and_then_held,
    a_won_retry_of_a_failed_row_holds_it_again,
    retries_of_many_failed_rows_at_once_are_each_won,
    an_expired_lease_is_retaken,
    a_different_fingerprint_never_wins_a_failed_row,
    parallel_claims_of_a_new_key_have_one_winner,
    parallel_claims_of_a_failed_row_have_one_winner,
    parallel_claims_of_an_expired_lease_have_one_winner,
    keys_are_scoped_by_provider,
    one_refused_claim_or_enqueue_in_a_wave_fails_alone,
);
