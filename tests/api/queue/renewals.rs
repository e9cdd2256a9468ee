//! A long queue attempt lives on renewals: a replay of a queue event outlives its first
//! lease with no scheduler taking the row, a node that cannot renew hangs up on the target
//! before another node retakes it, and an outcome write held up past the lease still lands
//! without the event being sent again.

use std::sync::Arc;

use futures_util::future::join_all;
use hookgate::key::EventId;
use hookgate::secret::Secret;

use crate::helpers::{
    base_config, eventually, spawn_app_behind_proxy_with, spawn_app_on, start_node_on, Backend,
    Behaviour, FaultyStore, TestApp, TestDb, TestTarget, PROVIDER,
};

use super::TOKEN;
use crate::helpers::long_deliveries;

/// A queue event the target refused for good (400): a dead letter after one attempt.
async fn dead_letter(app: &TestApp, key: &str) {
    app.target.set(Behaviour::Status(400));
    assert_eq!(
        app.deliver(key, &format!(r#"{{"id":"{key}"}}"#))
            .await
            .status,
        202
    );
    app.wait_status(key, "dead").await;
}

/// Waits until the attempt running on `key` has outlived its first lease (so only
/// renewals can have kept it), then checks that its lease is live and that no scheduler
/// — this node's or another's — offers or takes the row.
async fn outlives_its_lease_untaken(app: &TestApp, key: &str, attempts: i32) {
    eventually("the attempt to outlive its first lease", || async {
        app.db.lease_state(PROVIDER, key).await.2 > 2.5
    })
    .await;
    let (status, now_attempts, _, left) = app.db.lease_state(PROVIDER, key).await;
    assert_eq!((status.as_str(), now_attempts), ("in_progress", attempts));
    assert!(left > 0.0, "the lease was renewed: {left} s left");
    let due = app.store.due(PROVIDER, 10).await.unwrap();
    assert!(
        due.is_empty(),
        "a row with a live lease is not due: {due:?}"
    );
    assert_eq!(
        app.scheduler.run_once().await.unwrap().taken,
        0,
        "nothing taken"
    );
    let other = app.second_node(long_deliveries).await;
    assert_eq!(
        other.scheduler.run_once().await.unwrap().taken,
        0,
        "nothing taken"
    );
    assert_eq!(app.target.open(&TestApp::idem(key)), 1, "one attempt open");
}

async fn a_command_line_replay_of_a_queue_event_renews_its_lease_and_no_scheduler_takes_it(
    backend: Backend,
) {
    let app = spawn_app_on(backend, long_deliveries).await;
    dead_letter(&app, "evt_rp").await;
    app.target.set(Behaviour::Hang);
    let mut config = base_config(&app.db, &app.target);
    long_deliveries(&mut config);
    let replay = hookgate::cli::replay(&config, EventId::new(PROVIDER, "evt_rp"));
    let watch = async {
        app.target.wait_for(&TestApp::idem("evt_rp"), 2).await;
        outlives_its_lease_untaken(&app, "evt_rp", 2).await;
        app.target.release();
    };
    let (line, ()) = futures_util::join!(replay, watch);
    let line = line.expect("replayed");
    assert!(line.contains("done"), "{line}");
    app.wait_status("evt_rp", "done").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_rp")), 2);
}

async fn an_admin_replay_of_a_queue_event_reaches_a_target_slower_than_the_lease(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        long_deliveries(c);
        c.admin.token = Some(Secret::new(TOKEN));
    })
    .await;
    dead_letter(&app, "evt_ar").await;
    app.target.set(Behaviour::Hang);
    let auth = format!("Bearer {TOKEN}");
    let path = format!("/admin/dead/{PROVIDER}/evt_ar/replay");
    let headers = [("Authorization", auth.as_str())];
    let replay = app.post(&path, &headers, String::new());
    let watch = async {
        app.target.wait_for(&TestApp::idem("evt_ar"), 2).await;
        outlives_its_lease_untaken(&app, "evt_ar", 2).await;
        app.target.release();
    };
    let (answer, ()) = futures_util::join!(replay, watch);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains(r#""status":"done""#), "{answer:?}");
    assert_eq!(app.target.count(&TestApp::idem("evt_ar")), 2);
}

/// Two nodes; A's database connection freezes (packets dropped, sockets open) while its
/// delivery runs, for longer than the lease. A cannot confirm its lease, so it must hang
/// up on the target before the lease ends: B's retake arrives only after A's connection
/// is closed.
#[actix_web::test]
async fn a_node_that_cannot_renew_its_lease_hangs_up_before_another_node_retakes_the_row() {
    let (a, proxy) = spawn_app_behind_proxy_with(long_deliveries).await;
    let b = a.second_node(long_deliveries).await;
    // B's own first pass (at its start) is over: the event is A's to take.
    eventually("node B's first scheduler pass", || async {
        b.get("/metrics")
            .await
            .body
            .contains("hookgate_scheduler_polls_total 1")
    })
    .await;
    let idem = TestApp::idem("evt_fz");
    a.target.set(Behaviour::Hang);
    assert_eq!(a.deliver("evt_fz", "{}").await.status, 202);
    a.target.wait_for(&idem, 1).await;
    proxy.freeze();
    eventually("the lease to run out by the database's clock", || async {
        a.db.lease_state(PROVIDER, "evt_fz").await.3 <= 0.0
    })
    .await;
    eventually("node B to retake the row", || async {
        b.scheduler.run_once().await.unwrap();
        a.target.count(&idem) >= 2
    })
    .await;
    let spans = a.target.spans(&idem);
    assert_eq!(spans.len(), 2, "{spans:?}");
    let first_closed = spans[0].end.expect("node A hung up on the target");
    assert!(
        first_closed <= spans[1].start,
        "two attempts open at once: {spans:?}"
    );

    proxy.thaw();
    a.target.release();
    b.wait_status("evt_fz", "done").await;
    let row = b
        .store
        .lookup(&EventId::new(PROVIDER, "evt_fz"))
        .await
        .unwrap();
    assert_eq!(
        row.expect("row").attempts,
        2,
        "A's hung-up attempt recorded nothing"
    );
    assert_eq!(a.target.count(&idem), 2);
}

/// The target answered; then the store stalls (the table locked) for longer than the
/// lease. In queue mode nobody waits on the answer and the write is fenced: it is retried
/// until it lands, and the key stays in flight meanwhile, so the node's own scheduler
/// never sends the event again.
async fn an_outcome_write_held_up_past_the_lease_lands_and_the_event_is_not_sent_again(
    backend: Backend,
) {
    let app = spawn_app_on(backend, long_deliveries).await;
    let idem = TestApp::idem("evt_lk");
    app.target.set(Behaviour::Hang);
    assert_eq!(app.deliver("evt_lk", "{}").await.status, 202);
    app.target.wait_for(&idem, 1).await;
    let lock = app.db.lock_table().await;
    app.target.release();
    // Six tries of the write: its pauses alone (0.1 + 0.2 + 0.4 + 0.8 + 1 s) outlast
    // the 2 s lease.
    eventually("the outcome write to be retried past the lease", || async {
        app.log.events("webhook.record_retry", "evt_lk").len() >= 6
    })
    .await;
    lock.release().await;
    // The scheduler runs meanwhile (failing while the store's reconnect backoff lasts, after
    // the timed-out statements): the row is due by then, but its key is still in flight.
    eventually("the outcome to land", || async {
        let _ = app.scheduler.run_once().await;
        app.db.status(PROVIDER, "evt_lk").await.as_deref() == Some("done")
    })
    .await;
    eventually("a scheduler pass that reaches the store", || async {
        app.scheduler.run_once().await.is_ok()
    })
    .await;
    assert_eq!(app.target.count(&idem), 1, "delivered once");
}

/// The target answered four events delivered at once; their outcome writes and their
/// leases' renewals are held (before they reach the store) until the leases have run out
/// by the database's clock and a scheduler pass has run. The node's own scheduler must not
/// take the rows while their keys' writes are pending here: the take would fence those
/// writes out, and the events would be sent again. (Four: every shard of the test config
/// has four workers, so all start at once wherever their keys land.)
async fn a_scheduler_pass_while_outcome_writes_are_pending_does_not_fence_them_out(
    backend: Backend,
) {
    let db = TestDb::on(backend).await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    long_deliveries(&mut config);
    let store = Arc::new(FaultyStore::new(db.store_with(config.store.clone()).await));
    let delivery = Arc::new(hookgate::worker::HttpDelivery);
    let hold = store.hold_writes();
    let app = start_node_on(db, target, config, delivery, Arc::clone(&store) as _).await;
    let keys: Vec<String> = (0..4).map(|i| format!("evt_hw{i}")).collect();
    let answers = join_all(keys.iter().map(|key| app.deliver(key, "{}"))).await;
    assert!(answers.iter().all(|a| a.status == 202), "{answers:?}");
    eventually("every outcome write to be held", || async {
        store.held() == keys.len()
    })
    .await;
    for key in &keys {
        eventually("the lease to run out by the database's clock", || async {
            app.db.lease_state(PROVIDER, key).await.3 <= 0.0
        })
        .await;
    }
    let pass = app.scheduler.run_once().await.unwrap();
    drop(hold);
    for key in &keys {
        eventually("the event to be done", || async {
            app.scheduler.run_once().await.unwrap();
            app.db.status(PROVIDER, key).await.as_deref() == Some("done")
        })
        .await;
    }
    for key in &keys {
        assert_eq!(
            app.target.count(&TestApp::idem(key)),
            1,
            "{key} delivered once"
        );
    }
    assert_eq!(pass.taken, 0, "pending keys were taken");
}

on_both_stores!(
    a_command_line_replay_of_a_queue_event_renews_its_lease_and_no_scheduler_takes_it,
    an_admin_replay_of_a_queue_event_reaches_a_target_slower_than_the_lease,
    an_outcome_write_held_up_past_the_lease_lands_and_the_event_is_not_sent_again,
    a_scheduler_pass_while_outcome_writes_are_pending_does_not_fence_them_out,
);
