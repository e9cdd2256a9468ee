//! The Postgres store's slot ring keeps the promise across every boundary it introduces
//! (docs/design.md, "Storage over time"): a key whose row sits in an older slot than its
//! redelivery, a failed row retried after its slot was sealed, a lease that spans a turn,
//! a queue row due after one, a dead letter replayed after its slot was emptied, claims on
//! two nodes while the ring turns and empties. (A populated database of the previous
//! schema upgraded in place: `upgrades.rs`.) Each test turns the ring by hand: the ring's
//! clock is moved back (`age_ring`, or the rows' and the ring's with `advance_clock`) and a
//! retention pass is run (`run_once`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, Mode, RowState, Status};
use hookgate::key::EventId;
use hookgate::secret::Secret;
use hookgate::store::Store;

use super::{claims_wait_for_the_lease_then_see_it_done, pass, retention, turn};
use crate::helpers::{spawn_app_with, Behaviour, TestApp, TestDb, PROVIDER};

const TOKEN: &str = "ring-admin-token";

/// Turns the ring once: its current slot is sealed and another opens.
async fn turn_the_ring(app: &TestApp) {
    assert!(age_and_pass(app, turn()).await, "{:?}", app.db.ring().await);
}

/// Ages the ring by `by` and runs a pass: whether the pass turned it.
async fn age_and_pass(app: &TestApp, by: Duration) -> bool {
    let before = app.db.current_slot().await;
    app.db.age_ring(by).await;
    pass(&app.store).await;
    app.db.current_slot().await != before
}

/// Passes come every `retention.sweep_interval`, and a slot opens during one: the ring
/// turns at the pass nearest a turn's age, not at the first pass past it, which came a
/// sweep interval late at nearly every turn (a 42-minute soak turned every 180 s where
/// a turn is 150 s).
#[actix_web::test]
async fn a_pass_turns_the_ring_at_the_pass_nearest_a_turn() {
    let app = spawn_app_with(|_| {}).await;
    let (quarter, interval) = (retention().done / 4, retention().sweep_interval);
    // Three quarters of an interval short of a turn: the next pass is nearer to it.
    let early = age_and_pass(&app, quarter - interval * 3 / 4).await;
    assert!(!early, "{:?}", app.db.ring().await);
    // A quarter of an interval short: this pass is the nearest.
    let nearest = age_and_pass(&app, interval / 2).await;
    assert!(nearest, "{:?}", app.db.ring().await);
}

#[actix_web::test]
async fn a_redelivery_after_turns_of_the_ring_is_answered_from_its_row_in_an_older_slot() {
    let app = spawn_app_with(|c| c.cache.capacity = 0).await;
    let keys: Vec<String> = (0..5).map(|i| format!("evt_old{i}")).collect();
    for key in &keys {
        assert_eq!(app.deliver(key, "{}").await.path, "first_run");
    }
    let first = app.db.slots_of(PROVIDER, &keys[0]).await;
    turn_the_ring(&app).await;
    turn_the_ring(&app).await;
    let answers = join_all(
        keys.iter()
            .flat_map(|k| [app.deliver(k, "{}"), app.deliver(k, "{}")]),
    )
    .await;
    assert!(
        answers.iter().all(|a| a.path == "duplicate_done"),
        "{answers:?}"
    );
    for key in &keys {
        assert_eq!(app.target.count(&TestApp::idem(key)), 1, "{key}");
        assert_eq!(
            app.db.slots_of(PROVIDER, key).await,
            first,
            "{key} stays in its slot"
        );
    }
    assert_ne!(vec![app.db.current_slot().await], first);
    // A new key goes to the current slot.
    app.deliver("evt_new", "{}").await;
    assert_eq!(
        app.db.slots_of(PROVIDER, "evt_new").await,
        vec![app.db.current_slot().await]
    );
}

#[actix_web::test]
async fn a_failed_row_is_retried_once_in_its_own_slot_after_the_ring_turned() {
    let app = spawn_app_with(|c| c.cache.capacity = 0).await;
    let other = app.second_node(|c| c.cache.capacity = 0).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_f", "{}").await.path, "first_run");
    assert_eq!(
        app.db.status(PROVIDER, "evt_f").await.as_deref(),
        Some("failed")
    );
    let slot = app.db.slots_of(PROVIDER, "evt_f").await;
    turn_the_ring(&app).await;
    app.target.set(Behaviour::Accept);
    let answers =
        join_all((0..10).map(|i| if i % 2 == 0 { &app } else { &other }.deliver("evt_f", "{}")))
            .await;
    let retried = answers
        .iter()
        .filter(|a| a.path == "retry_after_failure")
        .count();
    assert_eq!(retried, 1, "{answers:?}");
    assert_eq!(app.target.count(&TestApp::idem("evt_f")), 2);
    assert_eq!(app.db.slots_of(PROVIDER, "evt_f").await, slot);
    assert_eq!(app.deliver("evt_f", "{}").await.path, "duplicate_done");
    assert_eq!(app.target.count(&TestApp::idem("evt_f")), 2);
}

#[actix_web::test]
async fn a_lease_that_spans_a_turn_still_holds_its_key() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let id = EventId::new(PROVIDER, "evt_lease");
    let lease = Duration::from_secs(60);
    let won = store.claim(&id, None, lease, None).await.unwrap();
    let ClaimResult::Won { attempts, .. } = won else {
        panic!("the first claim wins: {won:?}");
    };
    db.age_ring(turn()).await;
    pass(&store).await;
    claims_wait_for_the_lease_then_see_it_done(&store, &id, attempts, lease).await;
    assert_eq!(db.keys_in_two_slots().await, Vec::<String>::new());
}

/// A node's batched claims probe the slots it last saw filled (docs/design.md, "Storage
/// over time"). Here node A last read the ring two turns ago: the slot opened after that
/// read has since taken a key on node B and been sealed. A's batch of claims, the key
/// among them, must not take A's old view for the ring: its guard sees a filled slot it
/// does not probe, the batch answers nothing, and its claims run on the whole table,
/// which finds the key done. Without the guard the key was inserted into the current
/// slot and won a second time.
#[actix_web::test]
async fn a_batch_of_claims_on_a_node_that_saw_the_ring_two_turns_ago_finds_a_key_of_the_slot_opened_since(
) {
    let db = TestDb::new().await;
    let (a, b) = (db.store().await, db.store().await);
    let lease = Duration::from_secs(30);
    let done = hookgate::claim::StoredResult {
        status: 200,
        content_type: None,
        body: Vec::new(),
    };
    let claim_all = |store: &Arc<dyn Store>, keys: Vec<String>| {
        let store = Arc::clone(store);
        async move {
            join_all(keys.iter().map(|k| {
                let (store, id) = (Arc::clone(&store), EventId::new(PROVIDER, k.clone()));
                async move { store.claim(&id, None, lease, None).await.unwrap() }
            }))
            .await
        }
    };
    // A reads the ring with its first batch.
    let first: Vec<String> = (0..20).map(|i| format!("evt_view{i}")).collect();
    let won = claim_all(&a, first).await;
    assert!(
        won.iter().all(|c| matches!(c, ClaimResult::Won { .. })),
        "{won:?}"
    );
    db.age_ring(turn()).await;
    pass(&b).await;
    let id = EventId::new(PROVIDER, "evt_opened_since");
    let ClaimResult::Won { attempts, .. } = b.claim(&id, None, lease, None).await.unwrap() else {
        panic!("the key's first claim wins");
    };
    b.complete(&id, attempts, &done, None).await.unwrap();
    let held = db.slots_of(PROVIDER, "evt_opened_since").await;
    db.age_ring(turn()).await;
    pass(&b).await;
    assert_ne!(db.current_slot().await, held[0]);
    // The key last in a burst: it shares a batch with the keys queued behind the first.
    let mut burst: Vec<String> = (0..20).map(|i| format!("evt_burst{i}")).collect();
    burst.push("evt_opened_since".into());
    let answers = claim_all(&a, burst).await;
    assert!(
        matches!(
            answers.last(),
            Some(ClaimResult::Existing(RowState {
                status: Status::Done,
                ..
            }))
        ),
        "{answers:?}"
    );
    assert_eq!(db.slots_of(PROVIDER, "evt_opened_since").await, held);
    assert_eq!(db.keys_in_two_slots().await, Vec::<String>::new());
}

/// A claim that names its slots, waiting for the ring's lock (a turn, a keeper's move),
/// holds no slot's partition meanwhile: it locks the partitioned table before any
/// partition it names. Locked the other way round, every claim waiting behind a ring
/// transaction held the due slot's partition against the emptying's truncation (asked
/// without waiting), which then failed at every pass while claims ran, and the expired rows
/// were never removed (CI's soak check).
#[actix_web::test]
async fn a_claim_waiting_for_the_rings_lock_holds_no_partition_an_emptying_truncates() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let lease = Duration::from_secs(30);
    // The node reads the ring with a first claim: slot 0 (sealed) is among the slots its
    // claims name.
    let first = EventId::new(PROVIDER, "evt_reads_the_ring");
    store.claim(&first, None, lease, None).await.unwrap();
    let ring = db.hold_lock("ONLY webhook_events", "EXCLUSIVE").await;
    let id = EventId::new(PROVIDER, "evt_waits_for_the_ring");
    let claim = store.claim(&id, None, lease, None);
    let truncation = async {
        db.wait_for_waiters_on("webhook_events", 1).await;
        let got = db.lock_now("webhook_events_s0", "ACCESS EXCLUSIVE").await;
        ring.release().await;
        got
    };
    let (claim, got) = futures_util::join!(claim, truncation);
    assert!(
        got,
        "a claim waiting for the ring's lock held slot 0's partition"
    );
    assert!(matches!(claim, Ok(ClaimResult::Won { .. })), "{claim:?}");
}

#[actix_web::test]
async fn a_queue_row_due_after_a_turn_is_delivered_once() {
    let app = spawn_app_with(|c| {
        c.providers[0].mode = Some(Mode::Queue);
        c.queue.poll_interval = Duration::from_secs(3600);
        c.cache.capacity = 0;
    })
    .await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_q", "{}").await.status, 202);
    app.scheduler.run_once().await.unwrap();
    crate::helpers::eventually("the first attempt to fail", || async {
        app.db.status(PROVIDER, "evt_q").await.as_deref() == Some("failed")
    })
    .await;
    let slot = app.db.slots_of(PROVIDER, "evt_q").await;
    turn_the_ring(&app).await;
    app.target.set(Behaviour::Accept);
    app.db.make_due(PROVIDER, "evt_q").await;
    let redelivered = app.deliver("evt_q", "{}").await;
    assert_eq!(redelivered.status, 202, "{redelivered:?}");
    crate::helpers::eventually("the retry", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_q").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_q")), 2);
    assert_eq!(app.db.slots_of(PROVIDER, "evt_q").await, slot);
    app.scheduler.run_once().await.unwrap();
    let again = app.deliver("evt_q", "{}").await;
    assert_eq!(again.path, "duplicate_done", "{again:?}");
    assert_eq!(app.target.count(&TestApp::idem("evt_q")), 2);
}

#[actix_web::test]
async fn a_dead_letter_replayed_after_its_slot_was_emptied_keeps_its_row_and_history() {
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.cache.capacity = 0;
    })
    .await;
    app.target.set(Behaviour::Status(400));
    app.deliver("evt_dl", r#"{"id":"x"}"#).await;
    app.target.set(Behaviour::Accept);
    app.deliver("evt_done", "{}").await;
    let slot = app.db.slots_of(PROVIDER, "evt_dl").await;
    // Past the done rows' retention and a turn: the slot is sealed, then emptied; the dead
    // letter (kept for retention.dead) moves out with its history to the keep slot, where
    // no emptying moves it again, and the done row goes.
    app.db.advance_clock(retention().done + turn()).await;
    pass(&app.store).await;
    pass(&app.store).await;
    let ring = app.db.ring().await;
    assert!(
        ring.iter()
            .any(|(s, state)| [*s] == slot[..] && state == "empty"),
        "the slot was emptied: {ring:?}"
    );
    assert_eq!(
        app.db.slots_of(PROVIDER, "evt_done").await,
        Vec::<i16>::new()
    );
    assert_eq!(app.db.slots_of(PROVIDER, "evt_dl").await, vec![6]);

    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str())];
    let path = format!("/admin/dead/{PROVIDER}/evt_dl/replay");
    let answers = join_all((0..10).map(|_| app.post(&path, &headers, String::new()))).await;
    assert_eq!(
        answers.iter().filter(|a| a.status == 200).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_dl")), 2);
    let event = app
        .get_with(
            &format!("/admin/api/event?provider={PROVIDER}&key=evt_dl"),
            &auth,
        )
        .await;
    let event: serde_json::Value = serde_json::from_str(&event.body).unwrap();
    assert_eq!(event["attempts_total"], 2, "{event}");
    assert_eq!(
        app.deliver("evt_dl", r#"{"id":"x"}"#).await.path,
        "duplicate_done"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_dl")), 2);
}

/// Two nodes, each key delivered by two senders to each node at once, while the ring
/// turns (and, as its slots come due, empties with its keepers moved) as fast as both
/// nodes' passes run, side by side: every key reaches the target once, every key has one
/// row, every answer is a first run, a duplicate or a 409, and no row inside retention is
/// lost to a pass that acted on a slot another pass had emptied and turned the ring to.
#[actix_web::test]
async fn claims_on_two_nodes_while_the_ring_turns_and_empties_deliver_each_key_once() {
    let a = spawn_app_with(|c| c.cache.capacity = 0).await;
    let b = a.second_node(|c| c.cache.capacity = 0).await;
    let keys: Vec<String> = (0..150).map(|i| format!("evt_r{i}")).collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    let turns = async {
        let mut turns = 0;
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            a.db.age_ring(turn()).await;
            futures_util::join!(pass(&a.store), pass(&b.store));
            turns += 1;
        }
        turns
    };
    let deliveries = async {
        let mut answers = Vec::new();
        for chunk in keys.chunks(10) {
            let round = chunk.iter().flat_map(|k| {
                [
                    a.deliver(k, "{}"),
                    b.deliver(k, "{}"),
                    a.deliver(k, "{}"),
                    b.deliver(k, "{}"),
                ]
            });
            answers.extend(join_all(round).await);
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        answers
    };
    let (turns, answers) = futures_util::join!(turns, deliveries);
    assert!(turns >= 3, "the ring turned {turns} times");
    for answer in &answers {
        assert!(
            ["first_run", "duplicate_done", "in_progress_elsewhere"]
                .contains(&answer.path.as_str()),
            "{answer:?}"
        );
    }
    for key in &keys {
        assert_eq!(a.target.count(&TestApp::idem(key)), 1, "{key}");
    }
    assert_eq!(a.db.keys_in_two_slots().await, Vec::<String>::new());
    let again = join_all(keys.iter().map(|k| b.deliver(k, "{}"))).await;
    assert!(
        again.iter().all(|x| x.path == "duplicate_done"),
        "{again:?}"
    );
    assert_eq!(a.target.total(), keys.len());
}

/// A first claim still writing its row when the ring is due to turn: the turn waits for it
/// (and, past its short lock timeout, leaves the turn for the next pass), so a claim of the
/// same key after it waits for that row and finds it, instead of missing the uncommitted
/// row in the old slot and inserting the key into the new one.
#[actix_web::test]
async fn a_turn_never_splits_a_key_between_a_claim_in_flight_and_the_next() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let held = db.hold_new_row(PROVIDER, "evt_split").await;
    let slot = db.current_slot().await;
    db.age_ring(turn()).await;
    pass(&store).await;
    let id = EventId::new(PROVIDER, "evt_split");
    let next = store.claim(&id, None, Duration::from_secs(30), None);
    let commit = async {
        db.wait_for_lock_waiter().await;
        held.commit().await;
    };
    let (next, ()) = futures_util::join!(next, commit);
    assert!(
        matches!(
            next,
            Ok(ClaimResult::Existing(RowState {
                status: Status::InProgress,
                ..
            }))
        ),
        "{next:?}"
    );
    assert_eq!(db.slots_of(PROVIDER, "evt_split").await, vec![slot]);
    // The next pass turns the ring.
    pass(&store).await;
    assert_ne!(db.current_slot().await, slot);
}

/// A retention pass reads the ring's state and what it removes, never the rows it keeps:
/// with 20 000 done rows inside retention in the current slot, a pass reads at most a few
/// index entries of `webhook_events`. Its look at the row-by-row slots once named them in
/// a subquery, which no partition is pruned by: every done row of every slot was read, each
/// pass (at 50 million rows no pass ended within the statement deadline, so the node
/// published no sizes and no backlog, and its scans took a core).
#[actix_web::test]
async fn a_retention_pass_reads_none_of_the_rows_it_keeps() {
    let db = TestDb::new().await;
    let (store, name) = db.named_store("hookgate_ring_reads", 2).await;
    db.autovacuum_off(&["webhook_events"]).await;
    db.execute(
        "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                     result_status)
         SELECT 'p', 'kept' || g, 'done', 1, 'first_run', 200
         FROM generate_series(1, 20000) g",
    )
    .await;
    db.execute("ANALYZE webhook_events").await;
    db.flush_stats().await;
    let before = db.reads(&["webhook_events"]).await;
    pass(&store).await;
    // Counts reach the statistics when the connections end: close them, then read.
    db.close(store, &name).await;
    let read = db.reads(&["webhook_events"]).await - before;
    assert!(
        read < 100,
        "a pass read {read} rows or index entries of 20 000 it keeps: {:?}",
        db.ring().await
    );
}

/// A duplicate answered from its row reads the slots up to the one that holds its key and
/// no further. With a week of rows in five sealed slots every further slot is one more key
/// index descended per duplicate — at 50 million rows, a leaf page from disk each — where
/// the claim's own first step already found the row (docs/performance-log.md, "Storage
/// over time"). Done rows in every slot, keys of the current slot (where a sender's retries
/// find their events: a claim visits the current slot first, then the sealed ones newest
/// first) claimed again one at a time and concurrently (the batched claim): no other slot
/// is scanned.
#[actix_web::test]
async fn a_duplicate_answered_from_its_row_reads_no_slot_past_its_own() {
    let db = TestDb::new().await;
    let (store, name) = db.named_store("hookgate_ring_dup", 4).await;
    db.autovacuum_off(&["webhook_events"]).await;
    db.execute(
        "INSERT INTO webhook_events (provider, event_key, slot, status, attempts, last_path,
                                     result_status)
         SELECT 'p', 'k' || g, (g % 6)::int2, 'done', 1, 'first_run', 200
         FROM generate_series(0, 5999) g",
    )
    .await;
    // Rows in every slot: none of them is empty (a slot marked empty is truncated, and a
    // batch of claims does not probe it).
    db.execute(
        "UPDATE hookgate_slots SET state = 'sealed', opened_at = now(), sealed_at = now()
         WHERE state = 'empty'",
    )
    .await;
    db.execute("ANALYZE webhook_events").await;
    // The store's first start migrates the schema, and a migration reads slot 0's events
    // once: counted when its connections end, so they end before the count starts.
    db.close(store, &name).await;
    let (store, name) = db.named_store("hookgate_ring_dup", 4).await;
    let current = db.current_slot().await;
    // Index scans of every slot but the current one: the claims' probes of slots that hold
    // rows (the store's connections plan no sequential scans; its start reads each slot
    // once that way).
    let elsewhere = || async {
        db.flush_stats().await;
        let row = db
            .query_one(
                "SELECT COALESCE(sum(t.idx_scan), 0)::int8
                 FROM pg_stat_user_tables t
                 JOIN pg_partition_tree('webhook_events'::regclass) p ON p.relid = t.relid
                 WHERE p.isleaf AND t.relname <> ('webhook_events_s' || $1)",
                &[&current.to_string()],
            )
            .await;
        row.get::<_, i64>(0)
    };
    let before = elsewhere().await;
    let ids: Vec<EventId> = (0..40)
        .map(|i| EventId::new("p", format!("k{}", i * 6 + i32::from(current))))
        .collect();
    let lease = Duration::from_secs(30);
    let mut answers = Vec::new();
    for id in &ids[..20] {
        answers.push(store.claim(id, None, lease, None).await);
    }
    answers.extend(
        join_all(
            ids[20..]
                .iter()
                .map(|id| store.claim(id, None, lease, None)),
        )
        .await,
    );
    for answer in &answers {
        assert!(
            matches!(
                answer,
                Ok(ClaimResult::Existing(RowState {
                    status: Status::Done,
                    ..
                }))
            ),
            "{answer:?}"
        );
    }
    // Counts reach the statistics when the connections end: close them, then read.
    db.close(store, &name).await;
    let scans = elsewhere().await - before;
    assert_eq!(
        scans, 0,
        "40 duplicates in the current slot scanned other slots {scans} times"
    );
}

/// The ring's lock is the two parent tables' alone: what works on one slot — autovacuum or
/// `ANALYZE` of its partition, which hold a lock `EXCLUSIVE` conflicts with and give way to
/// a waiter only after `deadlock_timeout` (a second, past the ring's half second) — never
/// holds a turn back, nor every claim behind the turn while it waits (soaks showed maxima
/// of 400–750 ms at turns and emptyings, and turns given up).
#[actix_web::test]
async fn a_turn_never_waits_for_the_upkeep_of_a_slot() {
    let app = spawn_app_with(|_| {}).await;
    app.deliver("evt_before", "{}").await;
    let sealed = app.db.current_slot().await;
    let vacuum = app
        .db
        .hold_lock(
            &format!("webhook_events_s{sealed}"),
            "SHARE UPDATE EXCLUSIVE",
        )
        .await;
    let turned = age_and_pass(&app, turn()).await;
    assert!(
        turned,
        "the turn gave up behind the vacuum of slot {sealed}: {:?}",
        app.db.ring().await
    );
    assert_eq!(app.deliver("evt_after", "{}").await.path, "first_run");
    assert_eq!(
        app.db.slots_of(PROVIDER, "evt_after").await,
        vec![app.db.current_slot().await]
    );
    vacuum.release().await;
}

/// Emptying a slot truncates its partitions, which waits for anything reading them: a
/// report, a dump, the slot's autovacuum. Waiting under the ring's lock held every claim
/// back for the lock timeout, and then gave up; now the truncation asks without waiting,
/// and a slot someone reads is left for the next pass, which empties it once the reader
/// is gone.
#[actix_web::test]
async fn an_emptying_never_waits_behind_a_reader_of_its_slot() {
    let app = spawn_app_with(|c| c.cache.capacity = 0).await;
    app.deliver("evt_old", "{}").await;
    let slot = app.db.slots_of(PROVIDER, "evt_old").await[0];
    turn_the_ring(&app).await;
    app.db.advance_clock(retention().done + turn()).await;
    let state = |ring: Vec<(i16, String)>| {
        ring.into_iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, state)| state)
    };
    for (table, mode) in [
        ("webhook_events", "ACCESS SHARE"),
        ("webhook_attempts", "ACCESS SHARE"),
        ("webhook_events", "SHARE UPDATE EXCLUSIVE"),
    ] {
        let reader = app.db.hold_lock(&format!("{table}_s{slot}"), mode).await;
        let partitions = [
            format!("webhook_events_s{slot}"),
            format!("webhook_attempts_s{slot}"),
        ];
        let partitions: Vec<&str> = partitions.iter().map(String::as_str).collect();
        let ((), waited) = app
            .db
            .lock_waits_during(&partitions, pass(&app.store))
            .await;
        // Autovacuum's lock (SHARE UPDATE EXCLUSIVE) is waited for, at most a few seconds,
        // by the request that turns the slot's autovacuum off before its keepers move — in
        // a transaction of its own, holding nothing a claim waits for, and asking a lock that
        // conflicts with none a claim takes. Under the ring's lock nothing waits.
        let hush = mode == "SHARE UPDATE EXCLUSIVE";
        assert!(
            !waited || hush,
            "the emptying waited for {mode} on {table}_s{slot}"
        );
        assert_eq!(state(app.db.ring().await).as_deref(), Some("sealed"));
        assert_eq!(app.deliver("evt_old", "{}").await.path, "duplicate_done");
        reader.release().await;
    }
    pass(&app.store).await;
    assert_eq!(state(app.db.ring().await).as_deref(), Some("empty"));
    assert_eq!(
        app.db.slots_of(PROVIDER, "evt_old").await,
        Vec::<i16>::new()
    );
}
