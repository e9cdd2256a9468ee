//! Each node keeps a filter of each sealed slot's keys, read once after the seal (a sealed
//! slot's keys never grow), and a claim of a new key skips the slots whose filter has not
//! got it — but only while the slot stays sealed in the life the filter was read in: the
//! claim's statement checks that in its own snapshot, and answers nothing otherwise
//! (docs/design.md, "Storage over time").
//!
//! What a claim skipped is seen through a row put into a sealed slot behind the filter's
//! back (nothing the ring does inserts into a sealed slot): a claim that skipped the slot
//! wins the key, one that probed it answers the row.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, RowState, Status, StoredResult};
use hookgate::config::StoreConfig;
use hookgate::key::EventId;
use hookgate::store::{Enqueued, QueueRow, Store};

use super::{retain, turn};
use crate::helpers::{TestDb, PROVIDER};

const LEASE: Duration = Duration::from_secs(30);

/// Claims `keys` at once (a batch, as the node's batcher forms one) and answers in order.
async fn claim_all(store: &Arc<dyn Store>, keys: &[String]) -> Vec<ClaimResult> {
    join_all(keys.iter().map(|k| {
        let (store, id) = (Arc::clone(store), EventId::new(PROVIDER, k.clone()));
        async move { store.claim(&id, None, LEASE, None).await.unwrap() }
    }))
    .await
}

/// A done row of `key` in slot `slot`, written by hand.
async fn hide(db: &TestDb, slot: i16, key: &str) {
    db.execute(&format!(
        "INSERT INTO webhook_events (provider, event_key, slot, status, attempts, last_path,
                                     result_status)
         VALUES ('{PROVIDER}', '{key}', {slot}, 'done', 1, 'first_run', 200)"
    ))
    .await;
}

/// One claim of `key`, alone.
async fn claim(store: &Arc<dyn Store>, key: &str) -> ClaimResult {
    store
        .claim(&EventId::new(PROVIDER, key), None, LEASE, None)
        .await
        .unwrap()
}

/// `key`'s first run: its claim won, its row done.
async fn first_run(store: &Arc<dyn Store>, key: &str) {
    let ClaimResult::Won { attempts, .. } = claim(store, key).await else {
        panic!("the key's first claim wins");
    };
    let done = StoredResult {
        status: 200,
        content_type: None,
        body: Vec::new(),
    };
    store
        .complete(&EventId::new(PROVIDER, key), attempts, &done, None)
        .await
        .unwrap();
}

/// What the ring's own turns and emptyings do to slot `slot` over a retention period, in one
/// transaction: emptied, and opened again as the current slot (the current one sealed).
fn reopen(slot: i16) -> String {
    format!(
        "BEGIN;
         LOCK TABLE webhook_events, webhook_attempts IN EXCLUSIVE MODE;
         TRUNCATE webhook_events_s{slot}, webhook_attempts_s{slot};
         UPDATE hookgate_slots SET state = 'sealed', sealed_at = now() WHERE state = 'current';
         UPDATE hookgate_slots SET state = 'current', opened_at = now(), sealed_at = NULL
         WHERE slot = {slot};
         COMMIT;"
    )
}

fn is_done(answer: &ClaimResult) -> bool {
    matches!(
        answer,
        ClaimResult::Existing(RowState {
            status: Status::Done,
            ..
        })
    )
}

/// Twenty new keys and `last`, claimed at once: `last`'s answer.
async fn in_a_burst(store: &Arc<dyn Store>, name: &str, last: &str) -> ClaimResult {
    let mut burst: Vec<String> = (0..20).map(|i| format!("evt_{name}{i}")).collect();
    burst.push(last.into());
    let mut answers = claim_all(store, &burst).await;
    answers.pop().expect("an answer per key")
}

#[actix_web::test]
async fn a_claim_skips_a_sealed_slot_whose_filter_has_not_got_its_key_while_the_slot_keeps_that_life(
) {
    let db = TestDb::new().await;
    let store = db.store().await;
    for i in 0..20 {
        first_run(&store, &format!("evt_sealed{i}")).await;
    }
    let sealed = db.current_slot().await;
    db.age_ring(turn()).await;
    let retained = retain(&store).await;
    assert_ne!(db.current_slot().await, sealed, "{:?}", db.ring().await);
    assert_eq!(retained.failed, None);
    // The pass read the slot it sealed (and slot 0, sealed by the first migration).
    let filtered: Vec<(i16, u64)> = retained.filters.iter().map(|f| (f.slot, f.keys)).collect();
    assert!(filtered.contains(&(sealed, 20)), "{filtered:?}");
    assert!(retained.filters.iter().all(|f| f.bytes > 0));

    // Behind the filter's back: the claims skip the slot, so they win these keys.
    hide(&db, sealed, "evt_hidden_alone").await;
    hide(&db, sealed, "evt_hidden_burst").await;
    let alone = claim(&store, "evt_hidden_alone").await;
    assert!(matches!(alone, ClaimResult::Won { .. }), "{alone:?}");
    let burst = in_a_burst(&store, "first", "evt_hidden_burst").await;
    assert!(matches!(burst, ClaimResult::Won { .. }), "{burst:?}");
    // The keys the filter holds are found in the slot, alone and in a burst.
    let again = claim(&store, "evt_sealed0").await;
    assert!(is_done(&again), "{again:?}");
    assert!(is_done(&in_a_burst(&store, "second", "evt_sealed1").await));

    // Another life of the slot (another `sealed_at`, as a slot emptied, opened and sealed
    // again has): the filter no longer speaks for it. The statement answers nothing, the
    // node reads the ring again, drops the filter and probes the slot.
    hide(&db, sealed, "evt_later_alone").await;
    hide(&db, sealed, "evt_later_burst").await;
    db.execute(&format!(
        "UPDATE hookgate_slots SET sealed_at = sealed_at - interval '1 second'
         WHERE slot = {sealed}"
    ))
    .await;
    let burst = in_a_burst(&store, "third", "evt_later_burst").await;
    assert!(is_done(&burst), "{burst:?}");
    let alone = claim(&store, "evt_later_alone").await;
    assert!(is_done(&alone), "{alone:?}");
    // The next pass reads the slot's keys again, for the life it now has.
    let retained = retain(&store).await;
    let filtered: Vec<(i16, u64)> = retained.filters.iter().map(|f| (f.slot, f.keys)).collect();
    assert!(filtered.contains(&(sealed, 24)), "{filtered:?}");
}

/// A node whose view of the ring is stale — its filter of a slot read in that slot's
/// previous life; the slot since emptied, opened again, written by another node and sealed
/// again; the slot current in the node's view current again too (emptied and reopened) —
/// finds the other node's keys in that slot, alone and in a batch. Every slot the node
/// names is the ring's only filled ones again, so only the check of each filter's life
/// stands between the node and a second win of those keys.
#[actix_web::test]
async fn a_node_holding_the_filter_of_a_slot_sealed_again_since_finds_the_keys_of_its_new_life() {
    let db = TestDb::new().await;
    let (a, b) = (db.store().await, db.store().await);
    let first: Vec<String> = (0..20).map(|i| format!("evt_life{i}")).collect();
    assert!(claim_all(&a, &first)
        .await
        .iter()
        .all(|c| matches!(c, ClaimResult::Won { .. })));
    let reused = db.current_slot().await;
    db.age_ring(turn()).await;
    let retained = retain(&a).await;
    let opened = db.current_slot().await;
    assert_ne!(opened, reused);
    assert!(
        retained.filters.iter().any(|f| f.slot == reused),
        "{:?}",
        retained.filters
    );
    // What the ring's own turns and emptyings do over a retention period: the slot emptied
    // and opened again,
    db.execute(&reopen(reused)).await;
    // written by the other node,
    for key in ["evt_new_life_alone", "evt_new_life_burst"] {
        first_run(&b, key).await;
        assert_eq!(db.slots_of(PROVIDER, key).await, vec![reused]);
    }
    // and sealed again, the slot the node last saw current being current again.
    db.execute(&reopen(opened)).await;
    assert_eq!(db.current_slot().await, opened);
    let burst = in_a_burst(&a, "burst", "evt_new_life_burst").await;
    assert!(is_done(&burst), "{burst:?}");
    let alone = claim(&a, "evt_new_life_alone").await;
    assert!(is_done(&alone), "{alone:?}");
    assert_eq!(db.keys_in_two_slots().await, Vec::<String>::new());
}

/// A redelivery of an old event is read from its own sealed slot, the first probed when its
/// filter holds the key, before the current slot: one probe, where current-slot-first order
/// read the current slot's key index first for every old key. Seen through a second row of
/// the key put into the current slot by hand, with another status: the answer says which
/// slot was read first. A new key's claim is unchanged (every filtered slot skipped).
#[actix_web::test]
async fn a_redelivery_of_an_old_event_is_read_from_its_own_sealed_slot_first() {
    let db = TestDb::new().await;
    let store = db.store().await;
    for i in 0..20 {
        first_run(&store, &format!("evt_old{i}")).await;
    }
    let sealed = db.current_slot().await;
    db.age_ring(turn()).await;
    let retained = retain(&store).await;
    assert!(retained.filters.iter().any(|f| f.slot == sealed));
    let current = db.current_slot().await;
    for key in ["evt_old0", "evt_old1"] {
        db.execute(&format!(
            "INSERT INTO webhook_events (provider, event_key, slot, status, attempts, last_path,
                                         dead_reason)
             VALUES ('{PROVIDER}', '{key}', {current}, 'dead', 1, 'first_run', 'http_error')"
        ))
        .await;
    }
    let alone = claim(&store, "evt_old0").await;
    assert!(is_done(&alone), "{alone:?}");
    let burst = in_a_burst(&store, "new", "evt_old1").await;
    assert!(is_done(&burst), "{burst:?}");
}

/// Enqueues `keys` at once (a batch, as the node's batcher forms one); answers in order.
async fn enqueue_all(store: &Arc<dyn Store>, keys: &[String]) -> Vec<Enqueued> {
    join_all(keys.iter().map(|k| {
        let store = Arc::clone(store);
        let row = QueueRow {
            id: EventId::new(PROVIDER, k.clone()),
            fingerprint: None,
            payload: b"{}".to_vec().into(),
            content_type: Some("application/json".into()),
            headers: None,
            keep_payload: false,
            start: None,
        };
        async move { store.enqueue(&row).await.unwrap() }
    }))
    .await
}

/// The enqueue batch probes as the claim batch does: a key a sealed slot's filter has not
/// got skips that slot (seen through a row put there behind the filter's back), and a node
/// whose filter is of a slot's previous life finds the key the slot holds in its new one.
#[actix_web::test]
async fn an_enqueue_batch_skips_what_the_filters_rule_out_and_nothing_of_a_slots_new_life() {
    let db = TestDb::new().await;
    let (a, b) = (db.store().await, db.store().await);
    let first: Vec<String> = (0..20).map(|i| format!("evt_queued{i}")).collect();
    assert!(enqueue_all(&a, &first)
        .await
        .iter()
        .all(|e| *e == Enqueued::Inserted));
    let sealed = db.current_slot().await;
    db.age_ring(turn()).await;
    let retained = retain(&a).await;
    assert!(retained.filters.iter().any(|f| f.slot == sealed));
    let opened = db.current_slot().await;
    // Behind the filter's back: the batch skips the slot and writes the key again.
    hide(&db, sealed, "evt_hidden_queued").await;
    let mut burst: Vec<String> = (0..20).map(|i| format!("evt_burst{i}")).collect();
    burst.push("evt_hidden_queued".into());
    let answers = enqueue_all(&a, &burst).await;
    assert!(
        answers.iter().all(|e| *e == Enqueued::Inserted),
        "{answers:?}"
    );
    // A key the filter holds is found in its slot.
    let again = enqueue_all(&a, &["evt_queued0".to_owned(), "evt_new0".to_owned()]).await;
    assert!(matches!(again[0], Enqueued::Existing(_)), "{again:?}");
    // The slot emptied, opened and written by the other node, then sealed again while the
    // slot the node saw current is current again (see the claims' test above).
    db.execute(&reopen(sealed)).await;
    let key = "evt_new_life_queued".to_owned();
    assert_eq!(
        enqueue_all(&b, std::slice::from_ref(&key)).await,
        vec![Enqueued::Inserted]
    );
    db.execute(&reopen(opened)).await;
    let mut burst: Vec<String> = (0..20).map(|i| format!("evt_later{i}")).collect();
    burst.push(key.clone());
    let answers = enqueue_all(&a, &burst).await;
    assert!(
        matches!(answers.last(), Some(Enqueued::Existing(_))),
        "{answers:?}"
    );
    assert_eq!(db.slots_of(PROVIDER, &key).await, vec![sealed]);
}

/// A slot whose keys would take the node's filters past `store.slot_filter_keys` gets no
/// filter, at this pass or the next, and every key is probed there as without filters.
#[actix_web::test]
async fn a_slot_with_more_keys_than_the_filters_room_is_left_unfiltered_and_probed() {
    let db = TestDb::new().await;
    let config = StoreConfig {
        slot_filter_keys: 10,
        ..db.store_config()
    };
    let store = db.store_with(config).await;
    for i in 0..20 {
        first_run(&store, &format!("evt_many{i}")).await;
    }
    let sealed = db.current_slot().await;
    db.age_ring(turn()).await;
    for _ in 0..2 {
        let retained = retain(&store).await;
        assert_eq!(retained.failed, None);
        assert!(
            retained.filters.iter().all(|f| f.slot != sealed),
            "{:?}",
            retained.filters
        );
    }
    hide(&db, sealed, "evt_hidden_unfiltered").await;
    let answer = claim(&store, "evt_hidden_unfiltered").await;
    assert!(is_done(&answer), "{answer:?}");
    let burst = in_a_burst(&store, "unfiltered", "evt_many3").await;
    assert!(is_done(&burst), "{burst:?}");
}
