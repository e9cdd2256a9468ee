//! The guarantee under pressure: overload (no free worker, no free store connection), a
//! frozen database, and large answers. Each test reproduces a way the promise once broke.
//! (A graceful shutdown: `shutdown.rs`; slow senders and readers: `slow_clients.rs`.)

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::{
    eventually, spawn_app_behind_proxy_with, spawn_app_on, spawn_app_with, Backend, Behaviour,
    TestApp, PROVIDER,
};

use super::metric;

/// Eight deliveries for two workers: only as many claims as workers that can start at
/// once; the rest are refused with nothing claimed. (Before: all eight were claimed and
/// six waited in a worker's mailbox while their leases ran.)
async fn a_claim_is_made_only_when_a_worker_can_start_at_once(backend: Backend) {
    let app = Rc::new(
        spawn_app_on(backend, |c| {
            c.server.shards = Some(1);
            c.server.workers_per_shard = 2;
            c.server.admission_queue = Some(0);
        })
        .await,
    );
    app.target.set(Behaviour::Hang);
    let refused = Rc::new(AtomicUsize::new(0));
    let sends: Vec<_> = (0..8)
        .map(|i| {
            let (app, refused) = (Rc::clone(&app), Rc::clone(&refused));
            actix_rt::spawn(async move {
                let answer = app.deliver(&format!("evt_adm{i}"), "{}").await;
                if answer.status == 503 {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                answer
            })
        })
        .collect();
    eventually("every request to be claimed or refused", || async {
        app.target.total() == 2
            && app.db.count_rows().await + refused.load(Ordering::SeqCst) as i64 >= 8
    })
    .await;
    assert_eq!(
        app.db.count_rows().await,
        2,
        "only the started deliveries claimed"
    );

    app.target.release();
    let answers: Vec<_> = join_all(sends)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for a in &answers {
        match a.status {
            201 => assert_eq!(a.path, "first_run"),
            503 => {
                assert_eq!(a.path, "overloaded", "{a:?}");
                assert_eq!(a.retry_after, Some(1));
                assert_eq!(a.attempt, None, "nothing was claimed");
            }
            _ => panic!("{a:?}"),
        }
    }
    assert_eq!(answers.iter().filter(|a| a.status == 201).count(), 2);
    assert_eq!(app.target.total(), 2);
    assert_eq!(app.db.count_rows().await, 2);
    // The cause of each 503 is in the log.
    let causes = app
        .log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "webhook.unavailable" && l["path"] == "overloaded")
        .count();
    assert_eq!(causes, 6, "{:?}", app.log.lines());
}

/// Requests beyond the free workers wait for one *before* claiming, and are then served.
async fn waiting_requests_claim_only_when_a_worker_frees_up(backend: Backend) {
    let app = Rc::new(
        spawn_app_on(backend, |c| {
            c.server.shards = Some(1);
            c.server.workers_per_shard = 2;
            c.server.admission_queue = Some(6);
            c.server.admission_wait = Duration::from_secs(60);
        })
        .await,
    );
    app.target.set(Behaviour::Hang);
    let sends: Vec<_> = (0..8)
        .map(|i| {
            let app = Rc::clone(&app);
            actix_rt::spawn(async move { app.deliver(&format!("evt_w{i}"), "{}").await })
        })
        .collect();
    eventually("six requests to wait for a worker", || async {
        app.target.total() == 2 && metric(&app, "hookgate_admission_waiting{").await == 6.0
    })
    .await;
    assert_eq!(
        app.db.count_rows().await,
        2,
        "waiting requests claim nothing"
    );

    app.target.release();
    let answers: Vec<_> = join_all(sends)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        answers
            .iter()
            .all(|a| a.status == 201 && a.path == "first_run"),
        "{answers:?}"
    );
    assert_eq!(app.target.total(), 8);
}

/// A request that waits longer than `admission_wait` for a worker is refused with nothing
/// claimed; requests that come to wait later get their own full wait, whether or not the
/// queue emptied in between. (The waits share one timer per shard, see `Shard::admit`.)
async fn a_wait_for_a_worker_ends_in_a_refusal_that_claimed_nothing(backend: Backend) {
    let app = Rc::new(
        spawn_app_on(backend, |c| {
            c.server.shards = Some(1);
            c.server.workers_per_shard = 1;
            c.server.admission_queue = Some(4);
            c.server.admission_wait = Duration::from_millis(200);
        })
        .await,
    );
    app.target.set(Behaviour::Hang);
    let send = |key: String| {
        let app = Rc::clone(&app);
        actix_rt::spawn(async move { app.deliver(&key, "{}").await })
    };
    let held = send("evt_held".into());
    eventually("the worker to be busy", || async {
        app.target.total() == 1
    })
    .await;
    for round in 0..3 {
        let waits: Vec<_> = (0..2).map(|i| send(format!("evt_r{round}_{i}"))).collect();
        for answer in join_all(waits).await.into_iter().map(Result::unwrap) {
            assert_eq!(answer.status, 503, "{answer:?}");
            assert_eq!(answer.path, "overloaded");
            assert_eq!(answer.attempt, None, "nothing was claimed");
        }
        assert_eq!(metric(&app, "hookgate_admission_waiting{").await, 0.0);
    }
    assert_eq!(
        app.db.count_rows().await,
        1,
        "only the held delivery claimed"
    );
    let unavailable: Vec<_> = app
        .log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "webhook.unavailable")
        .collect();
    assert_eq!(unavailable.len(), 6);
    assert!(unavailable.iter().all(|l| l["error"]
        .as_str()
        .unwrap_or("")
        .contains("no worker freed up")));

    app.target.release();
    assert_eq!(held.await.unwrap().status, 201);
    // A request that arrives once the worker is free is served at once.
    let next = app.deliver("evt_after", "{}").await;
    assert_eq!((next.status, next.path.as_str()), (201, "first_run"));
}

#[actix_web::test]
async fn a_frozen_database_is_answered_503_at_the_deadline_and_service_resumes_by_itself() {
    let (app, proxy) = spawn_app_behind_proxy_with(|c| {
        c.store.statement_timeout = Some(Duration::from_millis(500))
    })
    .await;
    assert_eq!(app.deliver("evt_before", "{}").await.status, 201);

    proxy.freeze();
    let frozen = app.deliver("evt_frozen", "{}").await;
    assert_eq!(frozen.status, 503, "{frozen:?}");
    assert_eq!(frozen.path, "store_unavailable");
    assert!(frozen.retry_after.is_some());
    assert_eq!(app.get("/readyz").await.status, 503);
    assert_eq!(app.target.count(&TestApp::idem("evt_frozen")), 0);
    assert!(
        app.log
            .events("webhook.unavailable", "evt_frozen")
            .iter()
            .any(|l| l["error"].as_str().is_some_and(|e| e.contains("deadline"))),
        "{:?}",
        app.log.lines()
    );

    proxy.thaw();
    eventually("the store to answer again", || async {
        app.get("/readyz").await.status == 200
    })
    .await;
    // The claim that missed its deadline was held by the frozen proxy and may have reached
    // Postgres on thaw: then the key is leased by an attempt nobody runs (409 until the
    // lease ends, then `lease_retake`) — a delay, never a delivery. Otherwise it is new.
    let back = app.deliver("evt_frozen", "{}").await;
    assert!(
        back.status == 201 || back.path == "in_progress_elsewhere",
        "{back:?}"
    );
    assert_eq!(app.deliver("evt_after", "{}").await.status, 201);
}

#[actix_web::test]
async fn an_outcome_write_that_times_out_is_retried_and_the_event_is_delivered_once() {
    let (app, proxy) = spawn_app_behind_proxy_with(|c| {
        c.store.statement_timeout = Some(Duration::from_millis(500))
    })
    .await;
    app.target.set(Behaviour::Hang);
    let delivery = app.deliver("evt_rec", "{}");
    let freeze = async {
        app.target.wait_for(&TestApp::idem("evt_rec"), 1).await;
        proxy.freeze();
        app.target.release();
        eventually("a timed-out outcome write to be retried", || async {
            !app.log.events("webhook.record_retry", "evt_rec").is_empty()
        })
        .await;
        proxy.thaw();
    };
    let (answer, ()) = futures_util::join!(delivery, freeze);
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(
        app.db.status(PROVIDER, "evt_rec").await.as_deref(),
        Some("done")
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_rec")), 1);
}

/// A node with one pooled connection that waits at most 200 ms for the store: one claim
/// batch stuck on a row lock holds up everything behind it.
async fn spawn_app_with_one_connection() -> TestApp {
    spawn_app_with(|c| {
        c.store.pool_size = 1;
        c.store.pool_timeout = Duration::from_millis(200);
    })
    .await
}

#[actix_web::test]
async fn waiting_for_the_store_past_pool_timeout_is_overload_not_an_outage() {
    // The first claim's batch holds the only slot (and the only connection) while it waits
    // for a row lock; the second claim waits for its batch past `pool_timeout`, is
    // withdrawn unrun and answered 503 `overloaded`, and claims nothing.
    let app = spawn_app_with_one_connection().await;
    let lock = app.db.hold_new_row(PROVIDER, "evt_pool_a").await;
    let blocked = app.deliver("evt_pool_a", "{}");
    let other = async {
        app.db.wait_for_lock_waiter().await;
        let answer = app.deliver("evt_pool_b", "{}").await;
        lock.release().await;
        answer
    };
    let (a, b) = futures_util::join!(blocked, other);
    assert_eq!(b.status, 503, "{b:?}");
    assert_eq!(b.path, "overloaded");
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(
        metric(&app, "hookgate_store_errors_total{kind=\"unavailable\"}").await,
        0.0
    );
    assert_eq!(app.deliver("evt_pool_b", "{}").await.status, 201);
}

/// A crowd of senders while the only claim batch waits on a row lock: each claim that
/// waited past `pool_timeout` is withdrawn before it runs — 503 `overloaded`, no row — and
/// when every sender then retries, twice at once, each event reaches the target once.
#[actix_web::test]
async fn claims_withdrawn_behind_a_stuck_batch_claim_nothing_and_retries_deliver_once() {
    let app = spawn_app_with_one_connection().await;
    let lock = app.db.hold_new_row(PROVIDER, "evt_stuck").await;
    let stuck = app.deliver("evt_stuck", "{}");
    let keys: Vec<String> = (0..24).map(|i| format!("evt_crowd{i}")).collect();
    let crowd = async {
        app.db.wait_for_lock_waiter().await;
        let answers = join_all(keys.iter().map(|k| app.deliver(k, "{}"))).await;
        // Read while the batch is still stuck: a withdrawn claim left no row behind.
        for (key, answer) in keys.iter().zip(&answers) {
            assert_eq!(answer.status, 503, "{key}: {answer:?}");
            assert_eq!(answer.path, "overloaded", "{key}: {answer:?}");
            assert_eq!(app.db.status(PROVIDER, key).await, None, "{key}");
        }
        lock.release().await;
    };
    let (stuck, ()) = futures_util::join!(stuck, crowd);
    assert_eq!(stuck.status, 201, "{stuck:?}");
    join_all(
        keys.iter()
            .flat_map(|k| [app.deliver(k, "{}"), app.deliver(k, "{}")]),
    )
    .await;
    for key in &keys {
        // A sender whose parallel retries were both refused gets through now.
        let last = app.deliver(key, "{}").await;
        assert!(last.status < 300, "{key}: {last:?}");
        assert_eq!(app.target.count(&TestApp::idem(key)), 1, "{key}");
        assert_eq!(
            app.db.status(PROVIDER, key).await.as_deref(),
            Some("done"),
            "{key}"
        );
    }
}

#[actix_web::test]
async fn large_answers_are_bounded_in_bytes_and_replayed_whole_from_the_row() {
    let app = spawn_app_with(|c| c.cache.max_bytes = 256 * 1024).await;
    app.target.set(Behaviour::Large(60_000));
    for i in 0..40 {
        let a = app.deliver(&format!("evt_big{i}"), "{}").await;
        assert_eq!(a.status, 200);
        assert_eq!(a.body.len(), 60_000);
    }
    let bytes = metric(&app, "hookgate_cache_bytes ").await;
    assert!(bytes > 0.0 && bytes <= 256.0 * 1024.0, "{bytes}");
    let again = app.deliver("evt_big0", "{}").await;
    assert_eq!(again.path, "duplicate_done");
    assert_eq!(again.body.len(), 60_000);
    assert_eq!(app.target.total(), 40);
}

on_both_stores!(
    a_claim_is_made_only_when_a_worker_can_start_at_once,
    waiting_requests_claim_only_when_a_worker_frees_up,
    a_wait_for_a_worker_ends_in_a_refusal_that_claimed_nothing,
);
