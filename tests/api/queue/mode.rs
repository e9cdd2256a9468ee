//! Queue mode: 202 once the row is durable, hookgate as the redeliverer on the same row,
//! claim rule, fencing and attempt code as sync mode; and the events no sender will retry.
//! The scheduler's background loop is slowed to an hour, so every pass here is driven by
//! hand (`run_once`) and backoffs are passed in SQL (`make_due`).

use std::time::Duration;

use hookgate::claim::Mode;

use hookgate::key::EventId;
use hookgate::metrics::Metrics;
use hookgate::retention::Sweeper;

use crate::helpers::queue_mode;
use crate::helpers::{eventually, spawn_app_on, Backend, Behaviour, BinaryNode, TestApp, PROVIDER};

async fn a_queued_event_is_answered_202_and_delivered_once_at_once(backend: Backend) {
    let app = spawn_app_on(backend, queue_mode).await;
    let first = app.deliver("evt_q", r#"{"id":"evt_q"}"#).await;
    assert_eq!(first.status, 202, "{first:?}");
    assert_eq!(first.path, "queued");
    assert_eq!(first.body, r#"{"status":"queued"}"#);
    // Delivered without any scheduler pass: the first attempt starts at once.
    app.target.wait_for(&TestApp::idem("evt_q"), 1).await;
    app.wait_status("evt_q", "done").await;

    // The row is done a moment before the shard lets go of the key: a redelivery in
    // between is answered 202 duplicate_queued from memory.
    eventually("a redelivery to be answered from the done row", || async {
        app.deliver("evt_q", r#"{"id":"evt_q"}"#).await.path == "duplicate_done"
    })
    .await;
    let again = app.deliver("evt_q", r#"{"id":"evt_q"}"#).await;
    assert_eq!(again.status, 201, "the target's answer, replayed");
    assert_eq!(again.path, "duplicate_done");
    let other = app.deliver("evt_q", r#"{"id":"other"}"#).await;
    assert_eq!(other.status, 422);
    assert_eq!(app.target.count(&TestApp::idem("evt_q")), 1);
    let claim = app.log.events("webhook.claim", "evt_q");
    assert!(claim.iter().all(|l| l["mode"] == "queue"), "{claim:?}");
}

async fn a_redelivery_while_queued_or_running_changes_nothing(backend: Backend) {
    let app = spawn_app_on(backend, queue_mode).await;
    app.target.set(Behaviour::Hang);
    assert_eq!(app.deliver("evt_r", "{}").await.status, 202);
    app.target.wait_for(&TestApp::idem("evt_r"), 1).await;
    for _ in 0..3 {
        let again = app.deliver("evt_r", "{}").await;
        assert_eq!(again.status, 202, "{again:?}");
        assert_eq!(again.path, "duplicate_queued");
    }
    app.target.release();
    app.wait_status("evt_r", "done").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_r")), 1);
}

async fn failures_are_retried_by_hookgate_until_the_target_accepts(backend: Backend) {
    let app = spawn_app_on(backend, queue_mode).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_f", "{}").await.status, 202);
    app.target.wait_for(&TestApp::idem("evt_f"), 1).await;
    app.wait_ended("evt_f", "failed", 1).await;
    assert_eq!(
        app.scheduler.run_once().await.unwrap().taken,
        0,
        "not due yet"
    );

    app.db.make_due(PROVIDER, "evt_f").await;
    assert_eq!(app.scheduler.run_once().await.unwrap().taken, 1);
    app.target.wait_for(&TestApp::idem("evt_f"), 2).await;
    app.wait_ended("evt_f", "failed", 2).await;

    let config = crate::helpers::base_config(&app.db, &app.target);
    let stuck = hookgate::cli::list(&config, Some(PROVIDER), Some("failed"), 10)
        .await
        .unwrap();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert!(
        stuck[0].contains("evt_f\tfailed\tqueue\tattempts=2"),
        "{stuck:?}"
    );
    app.scheduler.measure().await.unwrap();
    let metrics = app.get("/metrics").await.body;
    for line in [
        r#"hookgate_queue_rows{provider="stripe",route="main"} 1"#,
        r#"hookgate_queue_taken_total{provider="stripe",route="main"} 2"#,
    ] {
        assert!(metrics.contains(line), "missing {line} in\n{metrics}");
    }
    assert!(
        metrics.contains("hookgate_scheduler_polls_total"),
        "{metrics}"
    );

    app.target.set(Behaviour::Accept);
    app.db.make_due(PROVIDER, "evt_f").await;
    app.scheduler.run_once().await.unwrap();
    app.wait_status("evt_f", "done").await;
    let row = app
        .store
        .lookup(&EventId::new(PROVIDER, "evt_f"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.attempts, 3);
    assert_eq!(app.target.count(&TestApp::idem("evt_f")), 3);
    assert_eq!(
        app.target.last(&TestApp::idem("evt_f")).attempt.as_deref(),
        Some("3")
    );
}

async fn an_always_failing_event_is_a_dead_letter_after_max_attempts(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queue_mode(c);
        c.retry.max_attempts = 3;
    })
    .await;
    app.scheduler.by_hand().await;
    app.scheduler.by_hand().await;
    app.target.set(Behaviour::Status(500));
    app.deliver("evt_d", r#"{"id":"evt_d"}"#).await;
    for n in 1..=3 {
        app.target.wait_for(&TestApp::idem("evt_d"), n).await;
        let status = if n < 3 { "failed" } else { "dead" };
        app.wait_ended("evt_d", status, n).await;
        if n < 3 {
            app.db.make_due(PROVIDER, "evt_d").await;
            assert_eq!(app.scheduler.run_once().await.unwrap().taken, 1);
        }
    }
    app.wait_status("evt_d", "dead").await;
    let row = app
        .store
        .lookup(&EventId::new(PROVIDER, "evt_d"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.dead_reason.as_deref(), Some("attempts_exhausted"));
    assert_eq!(row.payload.as_deref(), Some(&br#"{"id":"evt_d"}"#[..]));
    assert_eq!(
        app.deliver("evt_d", r#"{"id":"evt_d"}"#).await.path,
        "duplicate_dead"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_d")), 3);
}

async fn the_lease_is_renewed_while_a_long_delivery_runs(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queue_mode(c);
        c.lease.duration = Duration::from_secs(2);
        c.retry.base = Duration::from_secs(3);
        c.store.statement_timeout = Some(Duration::from_secs(1));
        c.providers[0].target.timeout = Duration::from_secs(30);
    })
    .await;
    app.target.set(Behaviour::Hang);
    app.deliver("evt_long", "{}").await;
    app.target.wait_for(&TestApp::idem("evt_long"), 1).await;
    // Wait past the lease: the row must still hold a live lease (renewed).
    eventually("the delivery to outlive its first lease", || async {
        let (_, _, since_claim, _) = app.db.lease_state(PROVIDER, "evt_long").await;
        since_claim > 2.5
    })
    .await;
    let (status, attempts, _, left) = app.db.lease_state(PROVIDER, "evt_long").await;
    assert_eq!((status.as_str(), attempts), ("in_progress", 1));
    assert!(left > 0.0, "the lease was renewed: {left} s left");
    let other = app.second_node(queue_mode).await;
    other.scheduler.run_once().await.unwrap();
    app.scheduler.run_once().await.unwrap();
    assert_eq!(
        app.target.count(&TestApp::idem("evt_long")),
        1,
        "not retaken"
    );

    app.target.release();
    app.wait_status("evt_long", "done").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_long")), 1);
}

async fn the_provider_limit_holds_deliveries_back_until_a_slot_frees(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queue_mode(c);
        c.providers[0].target.max_in_flight = Some(1);
        // The held delivery must outlast a slow machine's pauses: a 10 s target timeout
        // ended it (a failure, freeing the slot for the next row) when this test was
        // starved of CPU for that long, and a second delivery was then right.
        c.providers[0].target.timeout = Duration::from_secs(120);
    })
    .await;
    app.target.set(Behaviour::Hang);
    for i in 0..3 {
        assert_eq!(app.deliver(&format!("evt_l{i}"), "{}").await.status, 202);
    }
    // Whichever comes first: evt_l0's start at once can find its slot reserved by a
    // scheduler pass that then takes nothing (it read before evt_l0 was written), and
    // evt_l1, arriving next, starts at once in its place (no order is promised).
    eventually("a first delivery", || async { app.target.total() >= 1 }).await;
    app.scheduler.run_once().await.unwrap();
    assert_eq!(app.target.total(), 1, "one delivery at a time");
    assert_eq!(app.db.count_status("queued").await, 2);

    app.target.release();
    eventually("every event to be delivered", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.count_status("done").await == 3
    })
    .await;
    assert_eq!(app.target.total(), 3);
}

/// A provider at its `max_rate` is passed again at its next token, not at every freed
/// worker: a pass that finds its bucket empty says when its room comes back, and does not
/// ask for a pass per freed worker (with other providers busy, that ran passes back to
/// back, each taking nothing).
async fn a_provider_at_its_rate_is_passed_again_at_its_next_token(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queue_mode(c);
        c.providers[0].target.max_rate = Some(1.0);
    })
    .await;
    app.scheduler.by_hand().await;
    for i in 0..3 {
        assert_eq!(app.deliver(&format!("evt_r{i}"), "{}").await.status, 202);
    }
    // The bucket's one token went to the first event (at once, or by a pass).
    eventually("a first delivery", || async {
        app.scheduler.run_once().await.unwrap();
        app.target.total() >= 1
    })
    .await;
    let pass = app.scheduler.run_once().await.unwrap();
    assert!(!pass.full, "waits for its token, not a worker: {pass:?}");
    assert!(
        pass.wake.is_some_and(|w| w <= Duration::from_secs(1)),
        "runs again at its next token: {pass:?}"
    );
    eventually("all three, a token each", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.count_status("done").await == 3
    })
    .await;
    assert_eq!(app.target.total(), 3);
}

async fn a_stale_failed_sync_row_becomes_a_sender_gave_up_dead_letter(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    app.target.set(Behaviour::Status(500));
    let failed = app.deliver("evt_gone", r#"{"id":"evt_gone"}"#).await;
    assert_eq!(failed.status, 503);
    let config = crate::helpers::base_config(&app.db, &app.target);
    let sweeper = |horizon| {
        Sweeper::new(
            app.store.clone(),
            config.retention.clone(),
            std::sync::Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
        .with_horizons(vec![(PROVIDER.to_owned(), horizon)])
    };
    assert_eq!(
        sweeper(Duration::from_secs(3600))
            .abandon_once()
            .await
            .unwrap(),
        0
    );
    assert_eq!(sweeper(Duration::ZERO).abandon_once().await.unwrap(), 1);
    let row = app
        .store
        .lookup(&EventId::new(PROVIDER, "evt_gone"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.status.as_str(), "dead");
    assert_eq!(row.dead_reason.as_deref(), Some("sender_gave_up"));
    let dead = app
        .store
        .dead_letters(Some(PROVIDER), None, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);

    app.target.set(Behaviour::Accept);
    let line = hookgate::cli::replay(&config, EventId::new(PROVIDER, "evt_gone"))
        .await
        .expect("replayed");
    assert!(line.contains("done"), "{line}");
    assert_eq!(app.target.count(&TestApp::idem("evt_gone")), 2);
}

/// Text of the scheduler's statements that take due rows (and only theirs).
const SCHEDULER_PASS: &str = "status IN ('queued', 'failed', 'in_progress')";

/// A scheduler pass takes a due row while a new event arrives, with room for one
/// delivery (`max_in_flight = 1`): the take is held up (the table locked) after the pass
/// counted its room, and the event arrives meanwhile. One of the two waits for the slot;
/// the target never has both at once.
#[actix_web::test]
async fn a_scheduler_pass_racing_an_arrival_keeps_the_providers_limit() {
    let app = spawn_app_on(Backend::Postgres, |c| {
        queue_mode(c);
        c.providers[0].target.max_in_flight = Some(1);
    })
    .await;
    app.scheduler.by_hand().await;
    let (ra, rb) = (TestApp::idem("evt_ra"), TestApp::idem("evt_rb"));
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_ra", "{}").await.status, 202);
    app.wait_ended("evt_ra", "failed", 1).await;
    app.db.make_due(PROVIDER, "evt_ra").await;
    app.target.set(Behaviour::Hang);

    let lock = app.db.lock_table().await;
    let scheduler = app.scheduler.clone();
    let pass = actix_rt::spawn(async move { scheduler.run_once().await });
    // Waiters counted by their statements: the node's retention pass (its first runs at
    // start) may wait on the same lock, and counted as the pass or the arrival it let the
    // lock go before the race was set (the pass then took nothing).
    app.db
        .wait_for_table_waiters_running(SCHEDULER_PASS, 1)
        .await;
    let arrival = app.deliver("evt_rb", "{}");
    let arrived = async {
        app.db
            .wait_for_table_waiters_running("INSERT INTO webhook_events", 1)
            .await;
        lock.release().await;
    };
    let (answer, ()) = futures_util::join!(arrival, arrived);
    assert_eq!(answer.status, 202, "{answer:?}");
    assert_eq!(pass.await.unwrap().unwrap().taken, 1);

    // Both rows are written: one is running, and the other waits for the slot (queued)
    // or runs beside it.
    let open = || app.target.open(&ra) + app.target.open(&rb);
    eventually(
        "one delivery to run and the other to wait, or both to run",
        || async {
            let waits = app.db.status(PROVIDER, "evt_rb").await.as_deref() == Some("queued");
            (open() == 1 && waits) || open() == 2
        },
    )
    .await;
    assert_eq!(open(), 1, "deliveries at once past max_in_flight = 1");

    app.target.release();
    for key in ["evt_ra", "evt_rb"] {
        eventually(&format!("{key} to be delivered"), || async {
            app.scheduler.run_once().await.unwrap();
            app.db.status(PROVIDER, key).await.as_deref() == Some("done")
        })
        .await;
    }
    assert_eq!((app.target.count(&ra), app.target.count(&rb)), (2, 1));
}

/// A flood of one key while its first enqueue is on its way (the table locked): more
/// requests than may wait on that enqueue arrive, then the enqueue fails at the store's
/// deadline. No request may be answered 202 — an acknowledgement tells the sender to stop —
/// while no row is known durable: the ones past the waiters' cap are answered 409, as a
/// sync request would be, and the rest 503 when the enqueue fails.
async fn a_flood_of_one_key_is_never_acknowledged_before_its_row_is_durable(backend: Backend) {
    const REQUESTS: usize = 1100;
    let app = spawn_app_on(backend, |c| {
        queue_mode(c);
        c.store.statement_timeout = Some(Duration::from_secs(5));
        c.server.mailbox_capacity = 4 * REQUESTS;
    })
    .await;
    // No connection limit: every request reaches the node at once (awc's default is 100).
    let client = awc::Client::builder()
        .connector(awc::Connector::new().limit(0))
        .timeout(Duration::from_secs(60))
        .finish();
    let url = format!("{}/webhooks/{PROVIDER}", app.address);
    let lock = app.db.lock_table().await;
    let requests = (0..REQUESTS).map(|_| {
        let request = client
            .post(&url)
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("X-Idempotency-Key", "evt_flood"));
        async move {
            let answer = request.send_body(r#"{"id":"evt_flood"}"#).await;
            let answer = answer.expect("an answer");
            let path = answer
                .headers()
                .get("Hookgate-Path")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (answer.status().as_u16(), path)
        }
    });
    let answers = futures_util::future::join_all(requests).await;
    lock.release().await;

    let acknowledged: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status == 202)
        .collect();
    assert!(
        acknowledged.is_empty(),
        "{} of {REQUESTS} answered 202 with no row written: {:?}",
        acknowledged.len(),
        &acknowledged[..acknowledged.len().min(3)]
    );
    let busy = answers
        .iter()
        .filter(|(s, p)| *s == 409 && p == "in_progress_elsewhere");
    assert!(busy.count() > 0, "no request went past the waiters' cap");
    assert!(
        answers.iter().all(|(s, _)| *s == 409 || *s == 503),
        "{:?}",
        answers.iter().find(|(s, _)| *s != 409 && *s != 503)
    );
    assert_eq!(app.db.status(PROVIDER, "evt_flood").await, None, "no row");
    assert_eq!(app.target.count(&TestApp::idem("evt_flood")), 0);
}

on_both_stores!(
    a_queued_event_is_answered_202_and_delivered_once_at_once,
    a_redelivery_while_queued_or_running_changes_nothing,
    failures_are_retried_by_hookgate_until_the_target_accepts,
    an_always_failing_event_is_a_dead_letter_after_max_attempts,
    the_lease_is_renewed_while_a_long_delivery_runs,
    the_provider_limit_holds_deliveries_back_until_a_slot_frees,
    a_provider_at_its_rate_is_passed_again_at_its_next_token,
    a_stale_failed_sync_row_becomes_a_sender_gave_up_dead_letter,
    a_flood_of_one_key_is_never_acknowledged_before_its_row_is_durable,
);

/// Log lines reach stdout as they happen, each whole, not when a buffer fills or the
/// process exits: `grep evt_1` on a running node's output tells the story so far.
#[actix_web::test]
async fn a_running_binary_writes_each_log_line_whole_as_it_happens() {
    let db = crate::helpers::TestDb::new().await;
    let target = crate::helpers::TestTarget::start().await;
    let node = BinaryNode::start_queue(&db, &target).await;
    eventually("the node's first log line", || async {
        node.log().contains("\"msg\":\"hookgate.listening\"")
    })
    .await;
    assert_eq!(node.deliver("evt_logged").await, Some(202));
    target.wait_for(&TestApp::idem("evt_logged"), 1).await;
    eventually("the delivery's log lines", || async {
        node.log().contains("\"msg\":\"webhook.done\"")
    })
    .await;
    // Every finished line is one JSON object (a line being written right now may not
    // have its newline yet).
    let log = node.log();
    for line in log.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let parsed: serde_json::Value = serde_json::from_str(line).expect("one JSON object a line");
        assert!(parsed["msg"].is_string(), "{line}");
    }
}

#[actix_web::test]
async fn a_queued_delivery_cut_by_kill_9_is_retaken_after_its_lease_by_the_next_node() {
    let db = crate::helpers::TestDb::new().await;
    let target = crate::helpers::TestTarget::start().await;
    target.set(Behaviour::Hang);
    let mut killed = BinaryNode::start_queue(&db, &target).await;
    assert_eq!(killed.deliver("evt_k9").await, Some(202));
    target.wait_for(&TestApp::idem("evt_k9"), 1).await;
    killed.kill9();
    target.set(Behaviour::Accept);

    // The next node on the same database: the row is held until its lease runs out.
    let mut config = crate::helpers::base_config(&db, &target);
    queue_mode(&mut config);
    let next = crate::helpers::start_node(
        db.attach().await,
        target.clone(),
        config,
        std::sync::Arc::new(hookgate::worker::HttpDelivery),
    )
    .await;
    next.scheduler.run_once().await.unwrap();
    assert_eq!(
        target.count(&TestApp::idem("evt_k9")),
        1,
        "the lease still holds"
    );
    db.expire_lease(PROVIDER, "evt_k9").await;
    next.db.make_due(PROVIDER, "evt_k9").await;
    next.scheduler.run_once().await.unwrap();
    next.wait_status("evt_k9", "done").await;
    let row = next
        .store
        .lookup(&EventId::new(PROVIDER, "evt_k9"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.attempts, 2);
    assert_eq!(row.last_path.map(|p| p.as_str()), Some("lease_retake"));
    assert_eq!(target.count(&TestApp::idem("evt_k9")), 2);
}

#[actix_web::test]
async fn two_nodes_on_one_postgres_finish_every_event_when_one_is_killed_halfway() {
    let db = crate::helpers::TestDb::new().await;
    let target = crate::helpers::TestTarget::start().await;
    let mut a = BinaryNode::start_queue(&db, &target).await;
    let mut config = crate::helpers::base_config(&db, &target);
    config.providers[0].mode = Some(Mode::Queue);
    config.queue.poll_interval = Duration::from_millis(100);
    config.lease.duration = Duration::from_secs(2);
    config.retry.base = Duration::from_secs(3);
    config.providers[0].target.timeout = Duration::from_secs(1);
    config.store.statement_timeout = Some(Duration::from_secs(1));
    let b = crate::helpers::start_node(
        db.attach().await,
        target.clone(),
        config,
        std::sync::Arc::new(hookgate::worker::HttpDelivery),
    )
    .await;

    let mut a_alive = true;
    for i in 0..300 {
        let key = format!("evt_2n{i}");
        if i == 150 {
            a.kill9();
            a_alive = false;
        }
        let sent_to_a = a_alive && i % 2 == 0 && a.deliver(&key).await == Some(202);
        if !sent_to_a {
            let answer = b.deliver(&key, "{}").await;
            assert!(answer.status == 202, "{answer:?}");
        }
    }
    eventually("every event to be done", || async {
        b.db.count_status("done").await == 300
    })
    .await;
    let mut twice = 0;
    for i in 0..300 {
        let n = target.count(&TestApp::idem(&format!("evt_2n{i}")));
        assert!(n >= 1, "evt_2n{i} was never delivered");
        twice += usize::from(n > 1);
    }
    // Only an attempt in flight on the killed node may run again; it had 8 workers.
    assert!(twice <= 8, "{twice} events delivered twice");
    assert_eq!(target.total(), 300 + twice);
}
