//! The store conformance suite: every rule of the row, written once against the `Store`
//! trait and run against each backend. Time travel is done with a zero lease (expired the
//! moment it is taken), so no test reaches into a backend's tables.

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use futures_util::future::join_all;
use hookgate::claim::{classify, ClaimResult, Path, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::outcome::DeadReason;
use hookgate::store::{Enqueued, Failure, Fenced, History, QueueRow, Retention, Store};

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

async fn a_replay_reopens_only_a_dead_row_once(store: Arc<dyn Store>) {
    claim(&*store, "k", LEASE).await;
    assert!(
        store.replay(&id("k"), LEASE).await.unwrap().is_none(),
        "in progress"
    );
    store.fail(&id("k"), 1, &failure(None)).await.unwrap();
    assert!(
        store.replay(&id("k"), LEASE).await.unwrap().is_none(),
        "failed"
    );
    claim(&*store, "k", LEASE).await;
    let dead = failure(Some(DeadReason::AttemptsExhausted));
    store.fail(&id("k"), 2, &dead).await.unwrap();

    let key = id("k");
    let replays = join_all((0..20).map(|_| store.replay(&key, LEASE))).await;
    let reopened: Vec<_> = replays
        .into_iter()
        .filter_map(|r| r.expect("replay"))
        .collect();
    assert_eq!(reopened.len(), 1);
    assert_eq!(reopened[0].attempts, 3);
    assert_eq!(&reopened[0].payload[..], b"{\"a\":1}");
    assert_eq!(reopened[0].fingerprint.as_deref(), Some("fp"));
    let row = existing(claim(&*store, "k", LEASE).await);
    assert_eq!(row.status, Status::InProgress);
    // The replay's attempt is fenced like any other.
    assert_eq!(
        store
            .complete(&id("k"), 2, &result("old"), None)
            .await
            .unwrap(),
        Fenced::Stale
    );
    assert_eq!(
        store
            .complete(&id("k"), 3, &result("ok"), None)
            .await
            .unwrap(),
        Fenced::Applied
    );
    assert!(store.replay(&id("unknown"), LEASE).await.unwrap().is_none());
}

async fn dead_letters_are_listed_newest_first_by_provider(store: Arc<dyn Store>) {
    for (provider, key) in [("a", "1"), ("b", "2"), ("a", "3")] {
        let id = EventId::new(provider, key);
        store.claim(&id, None, LEASE, None).await.unwrap();
        store
            .fail(&id, 1, &failure(Some(DeadReason::NonRetryable)))
            .await
            .unwrap();
    }
    store
        .claim(&EventId::new("a", "alive"), None, LEASE, None)
        .await
        .unwrap();
    let all = store.dead_letters(None, None, 10).await.unwrap();
    let keys: Vec<&str> = all.iter().map(|r| &*r.id.key).collect();
    // Newest first; rows updated in the same microsecond (the same millisecond on
    // SQLite) by provider, then key, descending — the order the page cursor follows.
    let mut expected = all.clone();
    expected.sort_by(|a, b| {
        (b.updated_at, &b.id.provider, &b.id.key)
            .partial_cmp(&(a.updated_at, &a.id.provider, &a.id.key))
            .unwrap()
    });
    let expected: Vec<&str> = expected.iter().map(|r| &*r.id.key).collect();
    assert_eq!(keys, expected);
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, vec!["1", "2", "3"]);
    let a = store.dead_letters(Some("a"), None, 10).await.unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(store.dead_letters(None, None, 1).await.unwrap().len(), 1);
}

async fn dead_letters_page_by_cursor_each_row_once_newest_first(store: Arc<dyn Store>) {
    // Written back to back: several share an update time (to the millisecond on SQLite),
    // so the cursor's tie-break by key is exercised.
    for i in 0..7 {
        let id = EventId::new("p", format!("k{i}"));
        store.claim(&id, None, LEASE, None).await.unwrap();
        store
            .fail(&id, 1, &failure(Some(DeadReason::NonRetryable)))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .dead_letters(Some("p"), after.as_ref(), 3)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = Some(hookgate::store::PageCursor::after(
            last.updated_at,
            &last.id,
        ));
        seen.extend(page.iter().map(|r| (r.updated_at, r.id.key.to_string())));
    }
    let mut keys: Vec<&str> = seen.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(seen.len(), 7, "{keys:?}");
    assert!(seen.windows(2).all(|w| w[0].0 >= w[1].0), "newest first");
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), 7, "each row once");
}

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

async fn a_queued_event_is_written_once_taken_once_and_completed(store: Arc<dyn Store>) {
    assert_eq!(
        store.enqueue(&queued("q")).await.unwrap(),
        Enqueued::Inserted
    );
    let Enqueued::Existing(row) = store.enqueue(&queued("q")).await.unwrap() else {
        panic!("the second enqueue inserted");
    };
    assert_eq!((row.status, row.attempts), (Status::Queued, 0));
    assert_eq!(due(&*store).await, vec!["q"]);
    let taken = store.take(&id("q"), LEASE).await.unwrap().expect("taken");
    assert_eq!((taken.attempts, taken.path), (1, Path::FirstRun));
    assert_eq!(&taken.payload[..], b"{\"q\":1}");
    assert_eq!(
        take(&*store, "q", LEASE).await,
        None,
        "held by a live lease"
    );
    assert!(due(&*store).await.is_empty());
    assert_eq!(
        store
            .complete(&id("q"), 1, &result("ok"), None)
            .await
            .unwrap(),
        Fenced::Applied
    );
    let Enqueued::Existing(row) = store.enqueue(&queued("q")).await.unwrap() else {
        panic!("a done key enqueued again");
    };
    assert_eq!(row.status, Status::Done);
    assert_eq!(row.result, Some(result("ok")));
    assert_eq!(take(&*store, "q", LEASE).await, None, "done is terminal");
}

async fn a_queue_row_is_retaken_after_its_lease_and_retried_after_its_backoff(
    store: Arc<dyn Store>,
) {
    store.enqueue(&queued("q")).await.unwrap();
    assert_eq!(take(&*store, "q", EXPIRED).await, Some((1, Path::FirstRun)));
    assert_eq!(due(&*store).await, vec!["q"], "an expired lease is due");
    assert_eq!(
        take(&*store, "q", LEASE).await,
        Some((2, Path::LeaseRetake))
    );
    let later = retry_in(Duration::from_secs(3600));
    assert_eq!(
        store.fail(&id("q"), 2, &later).await.unwrap(),
        Fenced::Applied
    );
    assert!(due(&*store).await.is_empty(), "its backoff has not passed");
    assert_eq!(take(&*store, "q", LEASE).await, None);
    // A take made just now, failed with no backoff: due at once.
    store.enqueue(&queued("r")).await.unwrap();
    take(&*store, "r", LEASE).await;
    store
        .fail(&id("r"), 1, &retry_in(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        take(&*store, "r", LEASE).await,
        Some((2, Path::RetryAfterFailure))
    );
    let record = store.lookup(&id("q")).await.unwrap().expect("row");
    assert_eq!(
        (record.status, record.mode.as_str()),
        (Status::Failed, "queue")
    );
    assert_eq!(record.payload.as_deref(), Some(&b"{\"a\":1}"[..]));
}

async fn a_renewal_is_fenced_and_keeps_the_row_from_being_taken(store: Arc<dyn Store>) {
    store.enqueue(&queued("q")).await.unwrap();
    take(&*store, "q", EXPIRED).await;
    assert_eq!(
        store.renew(&id("q"), 1, LEASE).await.unwrap(),
        Fenced::Applied
    );
    assert_eq!(take(&*store, "q", LEASE).await, None, "renewed: live again");
    assert_eq!(
        store.renew(&id("q"), 2, LEASE).await.unwrap(),
        Fenced::Stale
    );
}

async fn parallel_takes_of_one_row_have_one_winner(store: Arc<dyn Store>) {
    store.enqueue(&queued("q")).await.unwrap();
    let takes = (0..20).map(|_| {
        let store = Arc::clone(&store);
        async move { store.take(&id("q"), LEASE).await.unwrap() }
    });
    let won = join_all(takes).await.into_iter().flatten().count();
    assert_eq!(won, 1);
}

/// Parallel enqueues share batches (Postgres): each key is written once, the rest report
/// it; an enqueue that starts its first attempt writes it taken, attempt 1.
async fn parallel_enqueues_write_each_key_once_and_may_start_it(store: Arc<dyn Store>) {
    let calls = (0..40).map(|n| {
        let store = Arc::clone(&store);
        async move {
            let key = format!("e{}", n % 10);
            let item = QueueRow {
                start: (n % 10 < 5).then_some(LEASE),
                ..queued(&key)
            };
            (key, store.enqueue(&item).await.unwrap())
        }
    });
    let answers = join_all(calls).await;
    for n in 0..10 {
        let key = format!("e{n}");
        let inserted = answers
            .iter()
            .filter(|(k, a)| *k == key && *a == Enqueued::Inserted)
            .count();
        assert_eq!(inserted, 1, "{key}: {answers:?}");
        let row = store.lookup(&id(&key)).await.unwrap().unwrap();
        let (status, attempts) = if n < 5 {
            (Status::InProgress, 1)
        } else {
            (Status::Queued, 0)
        };
        assert_eq!((row.status, row.attempts), (status, attempts), "{key}");
        assert_eq!(row.mode, "queue");
    }
    // The started ones hold their lease; only the others are due, and all at once.
    let taken = store.take_due("p", 100, LEASE, &[]).await.unwrap();
    let mut keys: Vec<String> = taken.iter().map(|t| t.id.key.to_string()).collect();
    keys.sort();
    assert_eq!(keys, vec!["e5", "e6", "e7", "e8", "e9"]);
    assert!(taken
        .iter()
        .all(|t| t.attempts == 1 && t.path == Path::FirstRun && !t.payload.is_empty()));
    assert!(store
        .take_due("p", 100, LEASE, &[])
        .await
        .unwrap()
        .is_empty());
}

/// A queue row keeps its mode: a sender's claim never takes it, whether it is queued,
/// failed and due, or in progress with its lease run out; the claim reports it as it
/// stands, and the queue's take still takes it.
async fn a_claim_never_takes_a_queue_row(store: Arc<dyn Store>) {
    store.enqueue(&queued("queued")).await.unwrap();
    store.enqueue(&queued("failed")).await.unwrap();
    let (attempts, _) = take(&*store, "failed", LEASE).await.expect("taken");
    let due_now = retry_in(Duration::ZERO);
    store.fail(&id("failed"), attempts, &due_now).await.unwrap();
    store.enqueue(&queued("expired")).await.unwrap();
    take(&*store, "expired", EXPIRED).await.expect("taken");
    for (key, status, attempts) in [
        ("queued", Status::Queued, 0),
        ("failed", Status::Failed, 1),
        ("expired", Status::InProgress, 1),
    ] {
        let row = existing(claim(&*store, key, LEASE).await);
        assert_eq!((row.status, row.attempts), (status, attempts), "{key}");
        assert_eq!(
            take(&*store, key, LEASE).await.map(|(n, _)| n),
            Some(attempts + 1),
            "{key}"
        );
    }
}

/// A batch take leaves the keys it is told are busy (the node's own attempts in flight)
/// untouched, whatever their characters; a later take without them takes them.
async fn a_batch_take_skips_the_busy_keys(store: Arc<dyn Store>) {
    let keys = ["plain", r#"q"uote,[]{}"#, "ünï cødé", "'; --"];
    for key in keys {
        store.enqueue(&queued(key)).await.unwrap();
    }
    let busy: Vec<Arc<str>> = keys[1..].iter().map(|k| Arc::from(*k)).collect();
    let taken = store.take_due("p", 100, LEASE, &busy).await.unwrap();
    let taken: Vec<&str> = taken.iter().map(|t| &*t.id.key).collect();
    assert_eq!(taken, vec!["plain"]);
    for key in &keys[1..] {
        let row = store.lookup(&id(key)).await.unwrap().expect("row");
        assert_eq!((row.status, row.attempts), (Status::Queued, 0), "{key}");
    }
    let rest = store.take_due("p", 100, LEASE, &[]).await.unwrap();
    let mut rest: Vec<&str> = rest.iter().map(|t| &*t.id.key).collect();
    rest.sort_unstable();
    let mut expected = keys[1..].to_vec();
    expected.sort_unstable();
    assert_eq!(rest, expected);
}

/// Two takers of every due row at once, as two nodes' schedulers: each row goes to one.
async fn parallel_batch_takes_take_each_row_once(store: Arc<dyn Store>) {
    for n in 0..30 {
        store.enqueue(&queued(&format!("b{n}"))).await.unwrap();
    }
    let takes = (0..4).map(|_| {
        let store = Arc::clone(&store);
        async move { store.take_due("p", 12, LEASE, &[]).await.unwrap() }
    });
    let mut keys: Vec<String> = join_all(takes)
        .await
        .into_iter()
        .flatten()
        .map(|t| t.id.key.to_string())
        .collect();
    let all = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), all, "a row taken twice");
    assert_eq!(all, 30);
}

async fn stale_sync_rows_become_sender_gave_up_dead_letters(store: Arc<dyn Store>) {
    claim(&*store, "failed", LEASE).await;
    store.fail(&id("failed"), 1, &failure(None)).await.unwrap();
    claim(&*store, "crashed", EXPIRED).await;
    claim(&*store, "live", LEASE).await;
    claim(&*store, "done", LEASE).await;
    store
        .complete(&id("done"), 1, &result("ok"), None)
        .await
        .unwrap();
    store.enqueue(&queued("queue")).await.unwrap();

    let horizon = Duration::from_secs(3600);
    assert_eq!(
        store.abandon("p", horizon, 100).await.unwrap(),
        0,
        "all recent"
    );
    assert_eq!(
        store.abandon("p", Duration::ZERO, 1).await.unwrap(),
        1,
        "bounded"
    );
    assert_eq!(store.abandon("p", Duration::ZERO, 100).await.unwrap(), 1);
    for (key, status) in [
        ("failed", Status::Dead),
        ("crashed", Status::Dead),
        ("live", Status::InProgress),
        ("done", Status::Done),
        ("queue", Status::Queued),
    ] {
        let record = store.lookup(&id(key)).await.unwrap().expect("row");
        assert_eq!(record.status, status, "{key}");
    }
    let failed = store.lookup(&id("failed")).await.unwrap().expect("row");
    assert_eq!(failed.dead_reason.as_deref(), Some("sender_gave_up"));
    let reopened = store.replay(&id("failed"), LEASE).await.unwrap();
    assert!(
        reopened.is_some(),
        "a gave-up dead letter with its payload replays"
    );
}

async fn rows_are_listed_oldest_first_and_queues_counted(store: Arc<dyn Store>) {
    store.enqueue(&queued("q1")).await.unwrap();
    claim(&*store, "sync", LEASE).await;
    store.enqueue(&queued("q2")).await.unwrap();
    let queued_rows = store.list(None, Some(Status::Queued), 10).await.unwrap();
    let keys: Vec<&str> = queued_rows.iter().map(|r| &*r.id.key).collect();
    assert_eq!(keys, vec!["q1", "q2"]);
    let all = store.list(Some("p"), None, 2).await.unwrap();
    assert_eq!(all.len(), 2);
    assert!(store
        .list(Some("other"), None, 10)
        .await
        .unwrap()
        .is_empty());
    let depth = store.queue_depth().await.unwrap();
    assert_eq!(depth.len(), 1);
    assert_eq!((depth[0].provider.as_str(), depth[0].rows), ("p", 2));
}

async fn migrations_can_run_again(store: Arc<dyn Store>) {
    store.migrate().await.expect("second migrate");
    store.ping().await.expect("ping");
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
    };
}

conformance!(
    a_new_key_is_won_once_and_then_held,
    a_won_retry_of_a_failed_row_holds_it_again,
    retries_of_many_failed_rows_at_once_are_each_won,
    an_expired_lease_is_retaken,
    done_is_terminal_whatever_the_lease,
    dead_is_terminal_and_keeps_payload_and_reason,
    completions_are_fenced_by_the_attempt,
    a_different_fingerprint_never_wins_a_failed_row,
    parallel_claims_of_a_new_key_have_one_winner,
    parallel_claims_of_a_failed_row_have_one_winner,
    parallel_claims_of_an_expired_lease_have_one_winner,
    keys_are_scoped_by_provider,
    concurrent_claims_and_completions_of_many_keys_keep_every_rule,
    a_wave_of_completions_stores_each_attempts_own_result,
    one_refused_completion_in_a_wave_fails_alone,
    one_refused_claim_or_enqueue_in_a_wave_fails_alone,
    a_replay_reopens_only_a_dead_row_once,
    dead_letters_are_listed_newest_first_by_provider,
    dead_letters_page_by_cursor_each_row_once_newest_first,
    the_sweep_deletes_only_old_terminal_rows_in_bounded_batches,
    retention_keeps_what_is_inside_it_and_removes_the_rest_within_two_passes,
    migrations_can_run_again,
    a_queued_event_is_written_once_taken_once_and_completed,
    a_queue_row_is_retaken_after_its_lease_and_retried_after_its_backoff,
    a_renewal_is_fenced_and_keeps_the_row_from_being_taken,
    parallel_takes_of_one_row_have_one_winner,
    parallel_enqueues_write_each_key_once_and_may_start_it,
    parallel_batch_takes_take_each_row_once,
    a_batch_take_skips_the_busy_keys,
    a_claim_never_takes_a_queue_row,
    stale_sync_rows_become_sender_gave_up_dead_letters,
    rows_are_listed_oldest_first_and_queues_counted,
);
