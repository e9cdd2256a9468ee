//! Queue rows, on both stores: written once, taken once — alone or in batches, by racing
//! takers — renewed under a fence, retaken after the lease and retried after the backoff,
//! never taken by a sender's claim; listed and counted.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{Path, Status};
use hookgate::store::{Enqueued, Fenced, QueueRow, Store};

use super::{claim, due, existing, id, queued, result, retry_in, take, EXPIRED, LEASE};

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

conformance!(
    a_queued_event_is_written_once_taken_once_and_completed,
    a_queue_row_is_retaken_after_its_lease_and_retried_after_its_backoff,
    a_renewal_is_fenced_and_keeps_the_row_from_being_taken,
    parallel_takes_of_one_row_have_one_winner,
    parallel_enqueues_write_each_key_once_and_may_start_it,
    a_claim_never_takes_a_queue_row,
    a_batch_take_skips_the_busy_keys,
    parallel_batch_takes_take_each_row_once,
    rows_are_listed_oldest_first_and_queues_counted,
);
