//! What goes wrong: a worker that panics, a shard that panics, a worker that finishes
//! after its lease was retaken, a store that goes away and comes back, a full mailbox.
//! (Shutdown: see `shutdown.rs`.)

use std::sync::Arc;
use std::time::Duration;

use hookgate::key::EventId;
use hookgate::shard::dispatcher::shard_for;

use crate::helpers::{
    base_config, early_hints_target, eventually, spawn_app, spawn_app_behind_proxy,
    spawn_app_behind_proxy_with, spawn_app_with, start_node, start_node_on, Behaviour, FaultyStore,
    PanickingDelivery, StoreProxy, TestApp, TestDb, TestTarget, PROVIDER,
};
use hookgate::worker::HttpDelivery;

#[actix_web::test]
async fn a_worker_panic_leaves_the_node_serving_and_the_key_is_retaken_after_its_lease() {
    let db = TestDb::new().await;
    let target = TestTarget::start().await;
    let config = base_config(&db, &target);
    let shards = config.server.shard_count();
    let app = start_node(db, target, config, Arc::new(PanickingDelivery)).await;

    let crashed = app.deliver("evt_panic", "{}").await;
    assert_eq!(crashed.status, 503);
    assert_eq!(crashed.path, "first_run");
    assert!(crashed.body.contains("worker_crashed"), "{crashed:?}");
    assert_eq!(crashed.retry_after, Some(30), "Retry-After is the lease");
    assert_eq!(
        app.db.status(PROVIDER, "evt_panic").await.as_deref(),
        Some("in_progress")
    );

    // The shard and its (restarted) worker still serve a key routed to the same shard.
    let home = shard_for(&EventId::new(PROVIDER, "evt_panic"), shards);
    let neighbour = (0..)
        .map(|i| format!("evt_n{i}"))
        .find(|k| shard_for(&EventId::new(PROVIDER, k.as_str()), shards) == home)
        .unwrap();
    assert_eq!(app.deliver(&neighbour, "{}").await.status, 201);

    // While the lease is live the key is busy; once it expired, it is retaken.
    let busy = app.deliver("evt_panic", "{}").await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.path, "in_progress_elsewhere");
    app.db.expire_lease(PROVIDER, "evt_panic").await;
    let retaken = app.deliver("evt_panic", "{}").await;
    assert_eq!(retaken.status, 201, "{retaken:?}");
    assert_eq!(retaken.path, "lease_retake");
    assert_eq!(retaken.attempt, Some(2));
    assert_eq!(app.target.count(&TestApp::idem("evt_panic")), 1);
}

#[actix_web::test]
async fn a_late_completion_after_a_retake_changes_nothing_and_is_logged_stale() {
    let a = spawn_app().await;
    let b = a.second_node(|_| {}).await;
    a.target.set(Behaviour::Hang);
    let slow = a.deliver("evt_stale", "{}");
    let takeover = async {
        a.target.wait_for(&TestApp::idem("evt_stale"), 1).await;
        a.db.expire_lease(PROVIDER, "evt_stale").await;
        a.target.set(Behaviour::Accept);
        let retake = b.deliver("evt_stale", "{}").await;
        a.target.release();
        retake
    };
    let (late, retake) = futures_util::join!(slow, takeover);

    assert_eq!(retake.path, "lease_retake");
    assert_eq!(retake.status, 201);
    assert_eq!(retake.attempt, Some(2));
    assert_eq!(late.status, 503, "{late:?}");
    assert!(late.body.contains("lease_lost"));
    let row = a
        .store
        .lookup(&EventId::new(PROVIDER, "evt_stale"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.status.as_str(), "done");
    assert_eq!(row.attempts, 2);
    assert_eq!(row.last_path.map(|p| p.as_str()), Some("lease_retake"));
    let stale = a.log.events("webhook.stale", "evt_stale");
    assert_eq!(stale.len(), 1, "{:?}", a.log.lines());
    assert_eq!(stale[0]["path"], "stale_completion");
    assert_eq!(stale[0]["attempts"], 1);
    assert_eq!(a.target.count(&TestApp::idem("evt_stale")), 2);
}

#[actix_web::test]
async fn while_the_store_is_unreachable_nothing_is_delivered_and_service_resumes_without_restart() {
    let (app, proxy) = spawn_app_behind_proxy().await;
    assert_eq!(app.deliver("evt_up", "{}").await.status, 201);

    proxy.cut();
    let down = app.deliver("evt_down", "{}").await;
    assert_eq!(down.status, 503, "{down:?}");
    assert_eq!(down.path, "store_unavailable");
    assert!(down.retry_after.is_some_and(|s| s >= 1));
    assert_eq!(app.get("/readyz").await.status, 503);
    // A done key is still answered from memory: `done` is terminal.
    assert_eq!(app.deliver("evt_up", "{}").await.path, "duplicate_done");
    assert_eq!(app.target.count(&TestApp::idem("evt_down")), 0);
    assert_eq!(app.db.status(PROVIDER, "evt_down").await, None);

    proxy.restore();
    eventually("the store to be reachable again", || async {
        app.get("/readyz").await.status == 200
    })
    .await;
    let back = app.deliver("evt_down", "{}").await;
    assert_eq!(back.status, 201, "{back:?}");
    assert_eq!(back.path, "first_run");
    assert_eq!(app.target.count(&TestApp::idem("evt_down")), 1);
}

#[actix_web::test]
async fn a_store_outage_after_the_delivery_delays_the_answer_but_loses_no_completion() {
    let (app, proxy) = spawn_app_behind_proxy().await;
    app.target.set(Behaviour::Hang);

    let delivery = app.deliver("evt_blip", "{}");
    let outage = async {
        app.target.wait_for(&TestApp::idem("evt_blip"), 1).await;
        proxy.cut();
        app.target.release();
        eventually("a completion write to fail and be retried", || async {
            !app.log
                .events("webhook.record_retry", "evt_blip")
                .is_empty()
        })
        .await;
        proxy.restore();
    };
    let (answer, ()) = futures_util::join!(delivery, outage);

    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.path, "first_run");
    assert_eq!(
        app.db.status(PROVIDER, "evt_blip").await.as_deref(),
        Some("done")
    );
    assert_eq!(app.deliver("evt_blip", "{}").await.path, "duplicate_done");
    assert_eq!(app.target.count(&TestApp::idem("evt_blip")), 1);
}

#[actix_web::test]
async fn a_full_shard_mailbox_is_answered_503_overloaded() {
    // One shard, a mailbox of one message, a target that holds every request: the shard's
    // claims are spawned, so its mailbox drains; this checks the refusal path's shape.
    let app = spawn_app_with(|c| {
        c.server.shards = Some(1);
        c.server.mailbox_capacity = 1;
    })
    .await;
    let keys: Vec<String> = (0..200).map(|i| format!("evt_o{i}")).collect();
    let answers = futures_util::future::join_all(keys.iter().map(|k| app.deliver(k, "{}"))).await;
    for a in &answers {
        match a.status {
            201 => assert_eq!(a.path, "first_run"),
            503 => {
                assert_eq!(a.path, "overloaded");
                assert_eq!(a.retry_after, Some(1));
            }
            _ => panic!("{a:?}"),
        }
    }
    let delivered = answers.iter().filter(|a| a.status == 201).count();
    assert_eq!(app.target.total(), delivered);
}

#[actix_web::test]
async fn connections_slower_to_open_than_the_deadline_are_kept_and_serve_the_next_request() {
    let (app, proxy) = spawn_app_behind_proxy_with(|c| {
        c.store.statement_timeout = Some(Duration::from_millis(500));
    })
    .await;
    assert_eq!(app.deliver("evt_before", "{}").await.status, 201);
    // Every connection closes, and a new one takes longer to open than a deadline: a
    // failover's standby behind a slow network. An operation whose connection was not
    // open in time is refused without sending its statement, and the connection, once
    // open, serves the next one (it was closed unused, so no request ever got through).
    proxy.cut();
    assert_eq!(app.deliver("evt_cut", "{}").await.status, 503);
    proxy.delay_connects(Duration::from_millis(800));
    proxy.restore();
    eventually(
        "a request to be served on a slowly opened connection",
        || async {
            let answer = app.deliver("evt_slow_open", "{}").await;
            assert!(matches!(answer.status, 201 | 503), "{answer:?}");
            answer.status == 201
        },
    )
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_slow_open")), 1);
}

#[actix_web::test]
async fn a_connection_whose_network_went_silent_is_let_go_and_service_resumes() {
    let (app, proxy) = spawn_app_behind_proxy_with(|c| {
        c.store.statement_timeout = Some(Duration::from_millis(500));
        c.store.pool_size = 2;
    })
    .await;
    assert_eq!(app.deliver("evt_before", "{}").await.status, 201);
    // The open connections' path drops everything (an address moved to another server, a
    // firewall forgot them) while new connections, cancel requests included, get through.
    // A statement past its deadline is cancelled, but its connection never hears back:
    // it is let go after a bound instead of holding a pool slot for good.
    proxy.silence_open();
    let down = app.deliver("evt_silent", "{}").await;
    assert_eq!(
        (down.status, down.path.as_str()),
        (503, "store_unavailable")
    );
    eventually("service to resume on new connections", || async {
        app.deliver("evt_silent", "{}").await.status == 201
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_silent")), 1);
}

#[actix_web::test]
async fn a_first_host_that_accepts_and_then_stalls_is_left_for_the_next() {
    // Two hosts: the first accepts TCP connections and then says nothing (a hung server,
    // frozen storage), the second is the database. Each host gets its own bound for the
    // whole opening of a connection, so the node reaches the second.
    let db = TestDb::new().await;
    let stalled = StoreProxy::start(&db.url).await;
    stalled.freeze();
    let real = StoreProxy::start(&db.url).await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    let two_hosts = real.url_for(&db.url).replace(
        &format!("127.0.0.1:{}", real.port),
        &format!("127.0.0.1:{},127.0.0.1:{}", stalled.port, real.port),
    );
    assert!(two_hosts.contains(','), "{two_hosts}");
    config.store.url = two_hosts;
    let app = start_node(db, target, config, Arc::new(HttpDelivery)).await;
    eventually("a delivery through the second host", || async {
        app.deliver("evt_second_host", "{}").await.status == 201
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_second_host")), 1);
}

/// A target that sends its status and then never finishes its body is bounded by the
/// target timeout like one that never answers: the attempt ends (a 2xx counts, its body is
/// not kept; a 500 is a failure), the sender is answered, and the row is recorded — where
/// the body read had no deadline, the attempt never ended and a sync retry after the lease
/// sent the event again. Queue mode too: the row ends done.
#[actix_web::test]
async fn a_target_body_that_never_ends_is_bounded_by_the_target_timeout() {
    let app = spawn_app_with(|c| {
        c.providers[0].target.timeout = Duration::from_secs(1);
        let mut queued = c.providers[0].clone();
        queued.name = "q".into();
        queued.mode = Some(hookgate::claim::Mode::Queue);
        c.providers.push(queued);
    })
    .await;
    app.target.set(Behaviour::Trickle(200));
    let answer = app.deliver("evt_tr", "{}").await;
    assert_eq!((answer.status, answer.path.as_str()), (200, "first_run"));
    assert_eq!(
        app.db.status(PROVIDER, "evt_tr").await.as_deref(),
        Some("done")
    );

    app.target.set(Behaviour::Trickle(500));
    let failed = app.deliver("evt_tr5", "{}").await;
    assert_eq!((failed.status, failed.path.as_str()), (503, "first_run"));
    assert_eq!(
        app.db.status(PROVIDER, "evt_tr5").await.as_deref(),
        Some("failed")
    );

    app.target.set(Behaviour::Trickle(200));
    let queued = app
        .post(
            "/webhooks/q",
            &[("X-Idempotency-Key", "evt_trq")],
            "{}".into(),
        )
        .await;
    assert_eq!(queued.status, 202);
    eventually("the queued event to end done", || async {
        app.db.status("q", "evt_trq").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_tr")), 1);
    assert_eq!(app.target.count("q:evt_trq"), 1);
}

/// A target that sends an interim `103 Early Hints` before its answer: the HTTP client
/// cannot read past an interim head, so the attempt is a retryable failure (the target may
/// or may not have acted: the sender redelivers) — never a dead letter taken from the 103,
/// and its connection is never used again, so the late final answer is never read as the
/// next event's.
#[actix_web::test]
async fn an_interim_answer_is_a_retryable_failure_and_its_connection_is_not_reused() {
    let (url, seen) = early_hints_target(Duration::from_millis(300)).await;
    let app = spawn_app_with(|c| {
        c.providers[0].target.url = url;
        c.server.shards = Some(1);
        c.server.workers_per_shard = 1;
    })
    .await;
    for key in ["evt_ea", "evt_eb"] {
        let answer = app.deliver(key, "{}").await;
        assert_eq!(
            (answer.status, answer.path.as_str()),
            (503, "first_run"),
            "{key}: {answer:?}"
        );
        assert_eq!(
            app.db.status(PROVIDER, key).await.as_deref(),
            Some("failed"),
            "{key}"
        );
    }
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A panic in code a shard runs (here: the store, while recording an outcome) cannot go
/// unnoticed: it is logged, and the node shuts down and stops with an error so that its
/// supervisor (systemd) starts it again — where it kept serving before, every request for
/// the dead shard's keys was answered 503 while `/healthz` said OK.
#[actix_web::test]
async fn a_panicking_shard_stops_the_node_with_an_error() {
    let db = TestDb::new().await;
    let target = TestTarget::start().await;
    let config = base_config(&db, &target);
    let store = db.store_with(config.store.clone()).await;
    let store = Arc::new(FaultyStore::new(store));
    let delivery = Arc::new(hookgate::worker::HttpDelivery);
    let mut app = start_node_on(db, target, config, delivery, store).await;
    let _ = app.deliver("evt_panic", "{}").await;
    eventually("the crash to be logged", || async {
        app.log.count("shard.crashed") > 0
    })
    .await;
    let stopped = app.stopped_by_itself().await;
    let error = stopped.expect_err("the node stops with an error");
    assert!(error.to_string().contains("shard"), "{error:#}");
}
