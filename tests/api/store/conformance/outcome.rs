//! An attempt's outcome, on both stores: done and dead are terminal, completions are
//! fenced by the attempt, a wave of completions stores each attempt's own result, and a
//! refused completion fails alone.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{classify, Path, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::outcome::DeadReason;
use hookgate::store::{Fenced, History, Store};

use crate::helpers::failure;

use super::{claim, existing, id, result, won, EXPIRED, LEASE};

async fn done_is_terminal_whatever_the_lease(store: Arc<dyn Store>) {
    claim(&*store, "k", EXPIRED).await;
    assert_eq!(
        store
            .complete(&id("k"), 1, &result("ok"), None)
            .await
            .unwrap(),
        Fenced::Applied
    );
    for _ in 0..3 {
        let row = existing(claim(&*store, "k", EXPIRED).await);
        assert_eq!(row.status, Status::Done);
        assert_eq!(row.attempts, 1);
        assert_eq!(row.result, Some(result("ok")));
        assert_eq!(classify(&row, Some("fp")), Path::DuplicateDone);
    }
}

async fn dead_is_terminal_and_keeps_payload_and_reason(store: Arc<dyn Store>) {
    claim(&*store, "k", EXPIRED).await;
    let dead = failure(Some(DeadReason::NonRetryable));
    assert_eq!(
        store.fail(&id("k"), 1, &dead).await.unwrap(),
        Fenced::Applied
    );
    let row = existing(claim(&*store, "k", EXPIRED).await);
    assert_eq!(row.status, Status::Dead);
    assert_eq!(classify(&row, Some("fp")), Path::DuplicateDead);
    let record = store.lookup(&id("k")).await.unwrap().expect("row");
    assert_eq!(record.dead_reason.as_deref(), Some("non_retryable"));
    assert_eq!(record.payload.as_deref(), Some(&b"{\"a\":1}"[..]));
    assert_eq!(record.last_error.as_deref(), Some("target answered 500"));
    assert_eq!(
        record.request_headers.as_deref(),
        Some(r#"{"x-sender":"s1"}"#)
    );
}

async fn completions_are_fenced_by_the_attempt(store: Arc<dyn Store>) {
    claim(&*store, "k", EXPIRED).await; // attempt 1, lease already gone
    assert_eq!(
        won(&claim(&*store, "k", LEASE).await),
        Some((2, Path::LeaseRetake))
    );
    assert_eq!(
        store
            .complete(&id("k"), 1, &result("late"), None)
            .await
            .unwrap(),
        Fenced::Stale
    );
    assert_eq!(
        store.fail(&id("k"), 1, &failure(None)).await.unwrap(),
        Fenced::Stale
    );
    assert_eq!(
        store
            .complete(&id("k"), 2, &result("new"), None)
            .await
            .unwrap(),
        Fenced::Applied
    );
    // Once done, no token completes or fails it again.
    assert_eq!(
        store.fail(&id("k"), 2, &failure(None)).await.unwrap(),
        Fenced::Stale
    );
    let record = store.lookup(&id("k")).await.unwrap().expect("row");
    assert_eq!(record.status, Status::Done);
    assert_eq!(record.attempts, 2);
    assert_eq!(record.result, Some(result("new")));
}

async fn concurrent_claims_and_completions_of_many_keys_keep_every_rule(store: Arc<dyn Store>) {
    // Rows in every state, then one concurrent wave of claims over all of them (the
    // networked store batches such waves into single statements).
    for i in 0..40 {
        let key = format!("k{i}");
        claim(&*store, &key, if i % 4 == 3 { EXPIRED } else { LEASE }).await;
        match i % 4 {
            0 => assert_eq!(
                store
                    .complete(&id(&key), 1, &result("ok"), None)
                    .await
                    .unwrap(),
                Fenced::Applied
            ),
            1 => assert_eq!(
                store.fail(&id(&key), 1, &failure(None)).await.unwrap(),
                Fenced::Applied
            ),
            _ => {} // 2: held by a live lease; 3: lease already expired
        }
    }
    let keys: Vec<EventId> = (0..60).map(|i| id(&format!("k{i}"))).collect();
    let claims = join_all(keys.iter().map(|k| store.claim(k, Some("fp"), LEASE, None))).await;
    for (i, claimed) in claims.into_iter().enumerate() {
        let claimed = claimed.expect("claim");
        let expected = match i {
            40.. => Some((1, Path::FirstRun)),
            _ if i % 4 == 1 => Some((2, Path::RetryAfterFailure)),
            _ if i % 4 == 3 => Some((2, Path::LeaseRetake)),
            _ => None,
        };
        assert_eq!(won(&claimed), expected, "k{i}");
        if i % 4 == 0 && i < 40 {
            assert_eq!(existing(claimed).status, Status::Done, "k{i}");
        }
    }
    // A wave of completions: the current attempts apply, stale tokens do not.
    let wave = result("wave");
    let completions = join_all((0..60).map(|i| {
        let attempts = if i < 40 { 2 } else { 1 };
        let (store, key, wave) = (&store, &keys[i], &wave);
        async move { (i, store.complete(key, attempts, wave, None).await) }
    }))
    .await;
    for (i, written) in completions {
        let expected = if i >= 40 || i % 4 == 1 || i % 4 == 3 {
            Fenced::Applied
        } else {
            Fenced::Stale
        };
        assert_eq!(written.expect("complete"), expected, "k{i}");
    }
    let held = store.lookup(&id("k2")).await.unwrap().expect("row");
    assert_eq!(held.status, Status::InProgress, "a live lease is untouched");
    let retried = store.lookup(&id("k1")).await.unwrap().expect("row");
    assert_eq!((retried.status, retried.attempts), (Status::Done, 2));
    assert_eq!(retried.result, Some(result("wave")));
}

/// A wave of completions (one batch on Postgres, whose rows are locked in key order, not
/// in the order the calls came) stores each attempt's own status, content type and body.
async fn a_wave_of_completions_stores_each_attempts_own_result(store: Arc<dyn Store>) {
    // Called in descending key order, so the batch's input order is not its lock order.
    let keys: Vec<String> = (0..48).rev().map(|i| format!("w{i:02}")).collect();
    for key in &keys {
        claim(&*store, key, LEASE).await;
    }
    let own = |key: &str, i: usize| StoredResult {
        status: 200 + u16::try_from(i % 7).unwrap(),
        content_type: (i % 3 != 0).then(|| format!("text/{key}")),
        body: format!("body of {key}").repeat(i + 1).into_bytes(),
    };
    let wave = keys.iter().enumerate().map(|(i, key)| {
        let (store, result) = (Arc::clone(&store), own(key, i));
        async move { store.complete(&id(key), 1, &result, None).await }
    });
    for written in join_all(wave).await {
        assert_eq!(written.expect("complete"), Fenced::Applied);
    }
    for (i, key) in keys.iter().enumerate() {
        let row = store.lookup(&id(key)).await.unwrap().expect("row");
        assert_eq!(row.status, Status::Done, "{key}");
        assert_eq!(row.result, Some(own(key, i)), "{key}");
    }
}

/// One completion in a wave that the store refuses on its own (Postgres takes no NUL in a
/// text value; the node replaces it, this call does not) fails alone: every other call of
/// its batch is applied.
async fn one_refused_completion_in_a_wave_fails_alone(store: Arc<dyn Store>) {
    let keys: Vec<String> = (0..16).map(|i| format!("r{i:02}")).collect();
    for key in &keys {
        claim(&*store, key, LEASE).await;
    }
    let bad = History {
        path: Path::FirstRun,
        node: "n".into(),
        outcome: "done",
        took: Duration::from_millis(1),
        target_status: Some(200),
        error: None,
        answer: Some("o\0k".into()),
    };
    let wave = keys.iter().enumerate().map(|(i, key)| {
        let store = Arc::clone(&store);
        let history = (i == 7).then(|| bad.clone());
        async move {
            let (key, ok) = (id(key), result("ok"));
            (i, store.complete(&key, 1, &ok, history.as_ref()).await)
        }
    });
    for (i, written) in join_all(wave).await {
        if i != 7 {
            assert_eq!(written.expect("complete"), Fenced::Applied, "call {i}");
        }
    }
    for (i, key) in keys.iter().enumerate() {
        let row = store.lookup(&id(key)).await.unwrap().expect("row");
        if i != 7 {
            assert_eq!(row.status, Status::Done, "{key}");
        }
    }
}

conformance!(
    done_is_terminal_whatever_the_lease,
    dead_is_terminal_and_keeps_payload_and_reason,
    completions_are_fenced_by_the_attempt,
    concurrent_claims_and_completions_of_many_keys_keep_every_rule,
    a_wave_of_completions_stores_each_attempts_own_result,
    one_refused_completion_in_a_wave_fails_alone,
);
