//! A sender's redelivery while hookgate runs the event itself: another payload is refused;
//! the node's own queue attempt or replay is never taken over; and a row keeps the mode it
//! was accepted in — a sync row's redelivery on a queue node runs as its sync attempt, a
//! queue row's redelivery on a sync node is left to the scheduler.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::secret::Secret;

use crate::helpers::{
    base_config, eventually, spawn_app_on, start_node_on, Answer, Backend, Behaviour, FaultyStore,
    TestApp, TestDb, TestTarget, WritesHeld, PROVIDER,
};

use super::TOKEN;
use crate::helpers::{failed_sync_row_and_a_queue_node, long_deliveries};

/// A redelivery with another payload is refused (422) while an attempt the scheduler
/// started runs, as it is on every other node.
async fn another_payload_is_refused_while_a_scheduled_attempt_runs(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    app.scheduler.by_hand().await;
    let idem = TestApp::idem("evt_fp");
    app.target.set(Behaviour::Status(500));
    assert_eq!(
        app.deliver("evt_fp", r#"{"id":"evt_fp","a":1}"#)
            .await
            .status,
        202
    );
    app.wait_ended("evt_fp", "failed", 1).await;
    app.target.set(Behaviour::Hang);
    app.db.make_due(PROVIDER, "evt_fp").await;
    assert_eq!(app.scheduler.run_once().await.unwrap().taken, 1);
    app.target.wait_for(&idem, 2).await;
    let other = app.deliver("evt_fp", r#"{"id":"evt_fp","a":2}"#).await;
    assert_eq!(
        (other.status, other.path.as_str()),
        (422, "payload_mismatch")
    );
    let same = app.deliver("evt_fp", r#"{"id":"evt_fp","a":1}"#).await;
    assert_eq!((same.status, same.path.as_str()), (202, "duplicate_queued"));
    app.target.release();
    app.wait_status("evt_fp", "done").await;
}

/// A queue node whose target refused `key` (500): the row is `failed`, due again only in a
/// minute (so no scheduler's pass takes it before the test makes it due), and the node has
/// begun to drain, so its scheduler takes nothing more — only another node may.
async fn failed_queue_row_on_a_drained_node(backend: Backend, key: &str) -> TestApp {
    let app = spawn_app_on(backend, |c| {
        long_deliveries(c);
        c.retry.base = Duration::from_secs(60);
        c.retry.cap = Duration::from_secs(120);
    })
    .await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver(key, "{}").await.status, 202);
    app.wait_status(key, "failed").await;
    app.start_shutdown();
    eventually("the queue node to drain", || async {
        app.log.count("hookgate.draining") > 0
    })
    .await;
    app
}

/// The sender's redelivery of `key` (sent twice so far) to `node` while `hold` holds the
/// node's outcome writes. A claim would send the event again and then wait on the held
/// write: the writes are let go once the target sees a third delivery, to read the answer.
async fn redeliver_while_held(node: &TestApp, key: &str, hold: WritesHeld<'_>) -> Answer {
    let (mut hold, idem) = (Some(hold), TestApp::idem(key));
    let redelivery = std::pin::pin!(node.deliver(key, "{}"));
    let sent_again = std::pin::pin!(node.target.wait_for(&idem, 3));
    let again = match futures_util::future::select(redelivery, sent_again).await {
        futures_util::future::Either::Left((answer, _)) => answer,
        futures_util::future::Either::Right(((), redelivery)) => {
            hold = None;
            redelivery.await
        }
    };
    drop(hold);
    again
}

/// A queue row is taken by a node where its provider is now in sync mode; the target
/// answers, and the attempt's renewals and outcome write are held (before they reach the
/// store) until its lease ran out half a second ago. The sender redelivers on the sync path
/// meanwhile: the node answers from its in-flight set (409), neither claiming the row over
/// its own attempt nor sending the event again; the held write then lands.
async fn a_sync_redelivery_never_takes_over_this_nodes_queue_attempt(backend: Backend) {
    let app = failed_queue_row_on_a_drained_node(backend, "evt_sw").await;

    let db = app.db.attach().await;
    let mut config = base_config(&db, &app.target);
    config.queue.poll_interval = Duration::from_secs(3600);
    config.lease.duration = Duration::from_secs(2);
    config.retry.base = Duration::from_secs(3);
    config.store.statement_timeout = Some(Duration::from_secs(1));
    config.providers[0].target.timeout = Duration::from_secs(1);
    let store = Arc::new(FaultyStore::new(db.store_with(config.store.clone()).await));
    let delivery = Arc::new(hookgate::worker::HttpDelivery);
    let node = start_node_on(
        db,
        app.target.clone(),
        config,
        delivery,
        Arc::clone(&store) as _,
    )
    .await;

    app.target.set(Behaviour::Accept);
    let hold = store.hold_writes();
    app.db.make_due(PROVIDER, "evt_sw").await;
    let idem = TestApp::idem("evt_sw");
    eventually("the sync node to take the row and deliver it", || async {
        node.scheduler.run_once().await.unwrap();
        app.target.count(&idem) == 2
    })
    .await;
    eventually("the outcome write to be held", || async {
        store.held() == 1
    })
    .await;
    eventually("the lease to have run out half a second ago", || async {
        app.db.lease_state(PROVIDER, "evt_sw").await.3 <= -0.5
    })
    .await;
    let again = redeliver_while_held(&node, "evt_sw", hold).await;
    app.wait_status("evt_sw", "done").await;
    assert_eq!(app.target.count(&idem), 2, "the 500, then one delivery");
    assert_eq!(
        (again.status, again.path.as_str()),
        (409, "in_progress_elsewhere")
    );
}

/// A replay of a sync dead letter lives on renewals, like a queue attempt: while its
/// outcome write and renewals are held up past the lease, the sender's redelivery of the
/// key to the same node is answered 409 from its in-flight set, not claimed over the
/// replay (which would send the event again and fence out the replay's pending write).
async fn a_redelivery_never_takes_over_this_nodes_replay(backend: Backend) {
    let db = TestDb::on(backend).await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    config.admin.token = Some(Secret::new(TOKEN));
    config.lease.duration = Duration::from_secs(2);
    config.retry.base = Duration::from_secs(3);
    config.store.statement_timeout = Some(Duration::from_secs(1));
    config.providers[0].target.timeout = Duration::from_secs(1);
    let store = Arc::new(FaultyStore::new(db.store_with(config.store.clone()).await));
    let delivery = Arc::new(hookgate::worker::HttpDelivery);
    let node = start_node_on(db, target, config, delivery, Arc::clone(&store) as _).await;
    node.target.set(Behaviour::Status(400));
    let dead = node.deliver("evt_rs", "{}").await;
    assert_eq!(dead.body, r#"{"status":"dead_lettered"}"#);
    node.target.set(Behaviour::Accept);

    let idem = TestApp::idem("evt_rs");
    let hold = store.hold_writes();
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str())];
    let path = format!("/admin/dead/{PROVIDER}/evt_rs/replay");
    let replay = node.post(&path, &headers, String::new());
    let meanwhile = async {
        eventually("the replay to reach the target", || async {
            node.target.count(&idem) == 2
        })
        .await;
        eventually(
            "the replay's lease to have run out half a second ago",
            || async { node.db.lease_state(PROVIDER, "evt_rs").await.3 <= -0.5 },
        )
        .await;
        redeliver_while_held(&node, "evt_rs", hold).await
    };
    let (replayed, again) = futures_util::future::join(replay, meanwhile).await;
    assert_eq!(
        (again.status, again.path.as_str()),
        (409, "in_progress_elsewhere"),
        "{again:?}"
    );
    assert_eq!(replayed.status, 200, "{replayed:?}");
    node.wait_status("evt_rs", "done").await;
    assert_eq!(node.target.count(&idem), 2, "the 400, then the replay");
}

/// A row keeps the mode it was accepted in, the other way round: after its provider moved
/// to queue mode, a sender's redelivery of a failed sync row is run as that row's sync
/// attempt and answered with the target's answer — never 202, which would tell the sender
/// to stop while no scheduler ever takes a sync row (it would end a `sender_gave_up` dead
/// letter, never delivered). A redelivery while that attempt runs is told 409.
async fn a_queue_node_runs_a_sync_rows_redelivery_as_its_sync_attempt(backend: Backend) {
    let (app, node) = failed_sync_row_and_a_queue_node(backend, "evt_ms", |_| {}).await;
    // While that attempt runs, another redelivery is told 409, as a sync one would be.
    app.target.set(Behaviour::Hang);
    let idem = TestApp::idem("evt_ms");
    let meanwhile = async {
        app.target.wait_for(&idem, 2).await;
        let busy = node.deliver("evt_ms", "{}").await;
        app.target.release();
        busy
    };
    let (retried, busy) = futures_util::future::join(node.deliver("evt_ms", "{}"), meanwhile).await;
    assert_eq!(
        (busy.status, busy.path.as_str()),
        (409, "in_progress_elsewhere"),
        "{busy:?}"
    );
    assert_eq!(
        (retried.status, retried.path.as_str()),
        (201, "retry_after_failure"),
        "{retried:?}"
    );
    app.wait_status("evt_ms", "done").await;
    let again = node.deliver("evt_ms", "{}").await;
    assert_eq!((again.status, again.path.as_str()), (201, "duplicate_done"));
    assert_eq!(node.scheduler.run_once().await.unwrap().taken, 0);
    assert_eq!(app.target.count(&idem), 2);
}

/// Twenty parallel redeliveries of a failed sync row to a queue-mode node: one claim wins
/// and delivers it once; every other is told 409 or gets the recorded answer, none 202.
async fn parallel_redeliveries_of_a_sync_row_on_a_queue_node_deliver_it_once(backend: Backend) {
    let (app, node) = failed_sync_row_and_a_queue_node(backend, "evt_mx", |_| {}).await;
    app.target.set(Behaviour::Accept);
    let answers = join_all((0..20).map(|_| node.deliver("evt_mx", "{}"))).await;
    let won = answers
        .iter()
        .filter(|a| (a.status, a.path.as_str()) == (201, "retry_after_failure"))
        .count();
    assert_eq!(won, 1, "{answers:?}");
    assert!(
        answers.iter().all(|a| a.status == 201 || a.status == 409),
        "{answers:?}"
    );
    app.wait_status("evt_mx", "done").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_mx")), 2);
}

/// A sync row's redelivery on a queue-mode node whose target may take longer than the
/// lease (allowed in queue mode): the sync attempt renews its lease, so it starts, outlasts
/// the lease while the target holds it — a redelivery meanwhile is told 409 — and ends done.
async fn a_sync_rows_redelivery_reaches_a_queue_target_slower_than_the_lease(backend: Backend) {
    let (app, node) = failed_sync_row_and_a_queue_node(backend, "evt_ml", long_deliveries).await;
    app.target.set(Behaviour::Hang);
    let idem = TestApp::idem("evt_ml");
    let meanwhile = async {
        eventually("the redelivery to reach the target", || async {
            app.target.count(&idem) == 2
        })
        .await;
        eventually("the attempt to outlast its first lease", || async {
            app.db.lease_state(PROVIDER, "evt_ml").await.2 > 2.5
        })
        .await;
        let lease_left = app.db.lease_state(PROVIDER, "evt_ml").await.3;
        let busy = node.deliver("evt_ml", "{}").await;
        app.target.release();
        (lease_left, busy)
    };
    let (retried, (lease_left, busy)) =
        futures_util::future::join(node.deliver("evt_ml", "{}"), meanwhile).await;
    assert!(lease_left > 0.0, "the lease was not renewed: {lease_left}");
    assert_eq!(
        (busy.status, busy.path.as_str()),
        (409, "in_progress_elsewhere"),
        "{busy:?}"
    );
    assert_eq!(
        (retried.status, retried.path.as_str()),
        (201, "retry_after_failure"),
        "{retried:?}"
    );
    app.wait_status("evt_ml", "done").await;
    assert_eq!(app.target.count(&idem), 2);
}

/// A row keeps the mode it was accepted in: after its provider left queue mode, a sender's
/// redelivery of a failed queue row is answered 202 `duplicate_queued` from the row (hookgate
/// delivers it), not claimed and run as a sync attempt (which would neither renew its lease
/// nor write its outcome past it); the node's scheduler delivers it as a queue attempt, and
/// the next redelivery is a duplicate.
async fn a_sync_redelivery_leaves_a_queue_row_to_the_scheduler(backend: Backend) {
    let app = failed_queue_row_on_a_drained_node(backend, "evt_qs").await;
    let node = app
        .second_node(|c| c.queue.poll_interval = Duration::from_secs(3600))
        .await;
    app.target.set(Behaviour::Accept);
    let idem = TestApp::idem("evt_qs");

    let again = node.deliver("evt_qs", "{}").await;
    assert_eq!(
        (again.status, again.path.as_str()),
        (202, "duplicate_queued")
    );
    assert_eq!(app.target.count(&idem), 1, "only the first, failed attempt");
    app.db.make_due(PROVIDER, "evt_qs").await;
    eventually("the scheduler to deliver the queue row", || async {
        node.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_qs").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&idem), 2);
    // The row is done a moment before the shard lets go of the key: a redelivery in
    // between is answered 409 from memory.
    eventually("a redelivery to be answered from the done row", || async {
        node.deliver("evt_qs", "{}").await.path == "duplicate_done"
    })
    .await;
    let last = node.deliver("evt_qs", "{}").await;
    assert_eq!((last.status, last.path.as_str()), (201, "duplicate_done"));
    assert_eq!(app.target.count(&idem), 2);
}

on_both_stores!(
    another_payload_is_refused_while_a_scheduled_attempt_runs,
    a_sync_redelivery_never_takes_over_this_nodes_queue_attempt,
    a_redelivery_never_takes_over_this_nodes_replay,
    a_sync_redelivery_leaves_a_queue_row_to_the_scheduler,
    a_queue_node_runs_a_sync_rows_redelivery_as_its_sync_attempt,
    parallel_redeliveries_of_a_sync_row_on_a_queue_node_deliver_it_once,
    a_sync_rows_redelivery_reaches_a_queue_target_slower_than_the_lease,
);
