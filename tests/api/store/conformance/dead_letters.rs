//! Dead letters, on both stores: listed newest first by provider and paged by cursor, a
//! replay reopens only a dead row and only once, and stale sync rows become sender-gave-up
//! dead letters.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::Status;
use hookgate::key::EventId;
use hookgate::outcome::DeadReason;
use hookgate::store::{Fenced, Store};

use crate::helpers::failure;

use super::{claim, existing, id, queued, result, EXPIRED, LEASE};

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

conformance!(
    a_replay_reopens_only_a_dead_row_once,
    dead_letters_are_listed_newest_first_by_provider,
    dead_letters_page_by_cursor_each_row_once_newest_first,
    stale_sync_rows_become_sender_gave_up_dead_letters,
);
