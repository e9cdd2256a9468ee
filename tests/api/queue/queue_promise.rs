//! Queue mode keeps its promise in ordinary operations: no two attempts of one key are
//! ever open at the target at once, and a key the target answered 2xx is never sent again
//! while its process lives — through replays, lost renewals, slow outcome writes, a
//! target's `Retry-After`, a redelivery with another payload, and a provider that left
//! queue mode. (A draining node takes no queue rows: `resilience/shutdown.rs`.) The
//! scheduler's background loop is slowed to an hour; every pass here is driven by hand
//! (`run_once`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use hookgate::claim::Mode;
use hookgate::config::Config;
use hookgate::key::EventId;
use hookgate::metrics::Metrics;
use hookgate::retention::Sweeper;
use hookgate::secret::Secret;

use crate::helpers::{
    base_config, eventually, spawn_app_behind_proxy_with, spawn_app_on, start_node_on, Answer,
    Backend, Behaviour, FaultyStore, TestApp, TestDb, TestTarget, WritesHeld, PROVIDER,
};

const TOKEN: &str = "queue-admin-token";

/// Queue mode with a lease (2 s) shorter than the target's timeout (30 s): every long
/// delivery lives on renewals.
fn long_deliveries(c: &mut Config) {
    c.providers[0].mode = Some(Mode::Queue);
    c.queue.poll_interval = Duration::from_secs(3600);
    c.lease.duration = Duration::from_secs(2);
    c.retry.base = Duration::from_secs(3);
    c.retry.cap = Duration::from_secs(30);
    c.store.statement_timeout = Some(Duration::from_secs(1));
    c.providers[0].target.timeout = Duration::from_secs(30);
}

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

/// The target's `Retry-After` on a 503, read as RFC 9110 says (delay-seconds or an
/// HTTP-date) and held within `[1 s, retry.cap]`: the row's next try is due within those
/// bounds, the shard answers on, the node stays ready.
async fn a_targets_retry_after_is_bounded_and_can_never_take_a_shard_down(backend: Backend) {
    let in_ten_seconds =
        actix_web::http::header::HttpDate::from(SystemTime::now() + Duration::from_secs(10))
            .to_string();
    let date: &'static str = Box::leak(in_ten_seconds.into_boxed_str());
    let cases: [(&'static str, f64, f64); 5] = [
        ("18446744073709551615", 1.0, 30.0),
        ("31536000", 1.0, 30.0),
        ("0", 1.0, 30.0),
        ("soon", 1.0, 30.0),
        (date, 5.0, 11.0),
    ];
    for (value, low, high) in cases {
        let app = spawn_app_on(backend, long_deliveries).await;
        app.target.set(Behaviour::Throttle(503, value));
        assert_eq!(app.deliver("evt_ra", "{}").await.status, 202);
        app.wait_status("evt_ra", "failed").await;
        let backoff = app.db.backoff(PROVIDER, "evt_ra").await;
        assert!(
            (low - 0.01..=high + 0.01).contains(&backoff),
            "Retry-After: {value} gave a backoff of {backoff} s, not {low}..{high}"
        );
        let again = app.deliver("evt_ra", "{}").await;
        assert_eq!(
            (again.status, again.path.as_str()),
            (202, "duplicate_queued"),
            "the shard still answers after Retry-After: {value}"
        );
        assert_eq!(app.get("/readyz").await.status, 200);
    }
}

/// Four throttled tries (503 with `Retry-After: 1`) use none of the three attempts: after
/// them one real failure (500) leaves the event `failed`, waiting for its retry.
async fn throttled_tries_do_not_use_up_the_attempts(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        long_deliveries(c);
        c.retry.max_attempts = 3;
    })
    .await;
    let idem = TestApp::idem("evt_th");
    app.target.set(Behaviour::Throttle(503, "1"));
    assert_eq!(app.deliver("evt_th", "{}").await.status, 202);
    for n in 1..=5 {
        if n == 5 {
            app.target.set(Behaviour::Status(500));
        }
        if n > 1 {
            app.db.make_due(PROVIDER, "evt_th").await;
            // The node holds the provider back for the second the target asked for.
            eventually("the next try", || async {
                app.scheduler.run_once().await.unwrap();
                app.target.count(&idem) >= n
            })
            .await;
        }
        app.target.wait_for(&idem, n).await;
        app.wait_status("evt_th", "failed").await;
    }
    let row = app.store.lookup(&EventId::new(PROVIDER, "evt_th")).await;
    let row = row.unwrap().expect("row");
    assert_eq!((row.status.as_str(), row.attempts), ("failed", 5));
}

/// A target that always says "later" cannot keep an event forever: a throttled try of an
/// event older than its provider's horizon makes it a dead letter with its own reason.
async fn an_event_throttled_past_its_horizon_is_a_dead_letter(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    let idem = TestApp::idem("evt_old");
    app.target.set(Behaviour::Throttle(429, "1"));
    assert_eq!(app.deliver("evt_old", "{}").await.status, 202);
    app.wait_status("evt_old", "failed").await;
    app.db.age(PROVIDER, "evt_old", 30).await;
    app.db.make_due(PROVIDER, "evt_old").await;
    eventually("the next try", || async {
        app.scheduler.run_once().await.unwrap();
        app.target.count(&idem) >= 2
    })
    .await;
    app.wait_status("evt_old", "dead").await;
    let dead = app
        .store
        .dead_letters(Some(PROVIDER), None, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].dead_reason.as_deref(), Some("throttled_too_long"));
}

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

/// A row keeps the mode it was accepted in: a node whose provider is now in sync mode
/// still delivers the queue rows accepted before.
async fn queue_rows_are_delivered_after_their_provider_left_queue_mode(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_mv", "{}").await.status, 202);
    app.wait_status("evt_mv", "failed").await;
    let sync_node = app
        .second_node(|c| c.queue.poll_interval = Duration::from_secs(3600))
        .await;
    app.target.set(Behaviour::Accept);
    app.db.make_due(PROVIDER, "evt_mv").await;
    eventually("the sync node to deliver the queue row", || async {
        sync_node.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_mv").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_mv")), 2);
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

/// A sync node whose target failed `key` (a `failed` sync row), and a second node on the
/// same schema where the provider is in queue mode (the scheduler driven by hand), with
/// `edit` made to its config.
async fn failed_sync_row_and_a_queue_node(
    backend: Backend,
    key: &str,
    edit: impl FnOnce(&mut Config),
) -> (TestApp, TestApp) {
    let app = spawn_app_on(backend, |_| {}).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver(key, "{}").await.status, 503);
    app.wait_status(key, "failed").await;
    let node = app
        .second_node(|c| {
            c.providers[0].mode = Some(Mode::Queue);
            c.queue.poll_interval = Duration::from_secs(3600);
            edit(c);
        })
        .await;
    (app, node)
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
/// redelivery of a failed queue row is answered 409 from the row, not claimed and run as a
/// sync attempt (which would neither renew its lease nor write its outcome past it); the
/// node's scheduler delivers it as a queue attempt, and the next redelivery is a duplicate.
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
        (409, "in_progress_elsewhere")
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

/// Queue rows whose provider is no longer configured become dead letters that say so.
async fn queue_rows_of_a_removed_provider_become_dead_letters(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_rm", "{}").await.status, 202);
    app.wait_status("evt_rm", "failed").await;
    let config = base_config(&app.db, &app.target);
    let sweeper = |providers: &[&str]| {
        let horizons = providers
            .iter()
            .map(|p| ((*p).to_owned(), Duration::from_secs(3600)))
            .collect();
        Sweeper::new(
            app.store.clone(),
            config.retention.clone(),
            Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
        .with_horizons(horizons)
        .with_orphan_grace(Duration::ZERO)
    };
    assert_eq!(sweeper(&[PROVIDER]).abandon_once().await.unwrap(), 0);
    // A node that knows of no provider at all (a sweeper built without any) orphans nothing.
    app.db.make_due(PROVIDER, "evt_rm").await;
    assert_eq!(sweeper(&[]).abandon_once().await.unwrap(), 0);
    assert_eq!(
        app.db.status(PROVIDER, "evt_rm").await.as_deref(),
        Some("failed")
    );
    assert_eq!(sweeper(&["github"]).abandon_once().await.unwrap(), 1);
    let dead = app
        .store
        .dead_letters(Some(PROVIDER), None, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].dead_reason.as_deref(), Some("provider_removed"));
}

/// A sync row of a provider since removed from every node (a failed one, or one whose
/// attempt crashed): its sender now gets 404 and no sweep of a configured provider sees it,
/// so it too becomes a `provider_removed` dead letter — once no attempt holds its lease.
async fn sync_rows_of_a_removed_provider_become_dead_letters(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_srm", "{}").await.status, 503);
    assert_eq!(
        app.db.status(PROVIDER, "evt_srm").await.as_deref(),
        Some("failed")
    );
    let config = base_config(&app.db, &app.target);
    let sweeper = |grace| {
        Sweeper::new(
            app.store.clone(),
            config.retention.clone(),
            Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
        .with_horizons(vec![("github".to_owned(), Duration::from_secs(3600))])
        .with_orphan_grace(grace)
    };
    assert_eq!(
        sweeper(Duration::from_secs(3600))
            .abandon_once()
            .await
            .unwrap(),
        0,
        "within its grace"
    );
    assert_eq!(sweeper(Duration::ZERO).abandon_once().await.unwrap(), 1);
    let row = app
        .store
        .lookup(&EventId::new(PROVIDER, "evt_srm"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.status.as_str(), "dead");
    assert_eq!(row.dead_reason.as_deref(), Some("provider_removed"));
    assert_eq!(row.payload.as_deref(), Some(&b"{}"[..]), "kept to replay");
}

on_both_stores!(
    a_command_line_replay_of_a_queue_event_renews_its_lease_and_no_scheduler_takes_it,
    an_admin_replay_of_a_queue_event_reaches_a_target_slower_than_the_lease,
    an_outcome_write_held_up_past_the_lease_lands_and_the_event_is_not_sent_again,
    a_scheduler_pass_while_outcome_writes_are_pending_does_not_fence_them_out,
    a_targets_retry_after_is_bounded_and_can_never_take_a_shard_down,
    throttled_tries_do_not_use_up_the_attempts,
    an_event_throttled_past_its_horizon_is_a_dead_letter,
    another_payload_is_refused_while_a_scheduled_attempt_runs,
    queue_rows_are_delivered_after_their_provider_left_queue_mode,
    a_sync_redelivery_never_takes_over_this_nodes_queue_attempt,
    a_redelivery_never_takes_over_this_nodes_replay,
    a_sync_redelivery_leaves_a_queue_row_to_the_scheduler,
    a_queue_node_runs_a_sync_rows_redelivery_as_its_sync_attempt,
    parallel_redeliveries_of_a_sync_row_on_a_queue_node_deliver_it_once,
    a_sync_rows_redelivery_reaches_a_queue_target_slower_than_the_lease,
    queue_rows_of_a_removed_provider_become_dead_letters,
    sync_rows_of_a_removed_provider_become_dead_letters,
);
