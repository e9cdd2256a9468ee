//! A node told to stop (SIGTERM, a deploy): it drains — a delivery running at the target
//! finishes and is answered, an attempt won after the drain began is released unsent, a
//! replay cut short leaves a dead letter, and a draining node takes no more queue rows.

use std::time::Duration;

use hookgate::key::EventId;
use hookgate::secret::Secret;

use crate::helpers::{bearer, dead_letter, long_deliveries};
use crate::helpers::{
    eventually, spawn_app, spawn_app_on, spawn_app_with, Backend, Behaviour, TestApp, PROVIDER,
};

const TOKEN: &str = "s3cret-admin-token";

/// A delivery running at the target when the node is told to stop runs to its end, is
/// recorded, and its sender gets the answer. (Before: the node exited under it and the
/// redelivery ran the target again after the lease.)
async fn a_delivery_running_at_shutdown_finishes_and_is_answered(backend: Backend) {
    let mut app = spawn_app_on(backend, |c| c.shutdown.grace = Duration::ZERO).await;
    app.target.set(Behaviour::Hang);
    let key = "evt_deploy";
    let sender = {
        let request = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish()
            .post(format!("{}/webhooks/{PROVIDER}", app.address))
            .insert_header(("X-Idempotency-Key", key));
        actix_rt::spawn(async move {
            let mut response = request.send_body("{}").await.expect("an answer");
            let path = response.headers().get("Hookgate-Path").cloned();
            (response.status().as_u16(), path, response.body().await)
        })
    };
    app.target.wait_for(&TestApp::idem(key), 1).await;
    let log = app.log.clone();
    let target = app.target.clone();
    let stopping = async {
        eventually("the node to start draining", || async {
            log.lines().iter().any(|l| l["msg"] == "hookgate.draining")
        })
        .await;
        target.release();
    };
    futures_util::join!(app.shutdown(), stopping);

    let (status, path, _) = sender.await.unwrap();
    assert_eq!(status, 201);
    assert_eq!(path.unwrap().to_str().unwrap(), "first_run");
    assert_eq!(app.db.status(PROVIDER, key).await.as_deref(), Some("done"));
    let next = app.second_node(|_| {}).await;
    assert_eq!(next.deliver(key, "{}").await.path, "duplicate_done");
    assert_eq!(app.target.count(&TestApp::idem(key)), 1);
}

#[actix_web::test]
async fn an_attempt_won_after_shutdown_began_is_released_without_reaching_the_target() {
    let mut app = spawn_app().await;
    let lock = app.db.hold_new_row(PROVIDER, "evt_late").await;
    let sender = {
        let request = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish()
            .post(format!("{}/webhooks/{PROVIDER}", app.address))
            .insert_header(("X-Idempotency-Key", "evt_late"));
        actix_rt::spawn(async move {
            let response = request.send_body("{}").await.expect("an answer");
            response.status().as_u16()
        })
    };
    app.db.wait_for_lock_waiter().await;
    let log = app.log.clone();
    let releasing = async {
        eventually("the node to start draining", || async {
            log.lines().iter().any(|l| l["msg"] == "hookgate.draining")
        })
        .await;
        lock.release().await;
    };
    futures_util::join!(app.shutdown(), releasing);

    assert_eq!(sender.await.unwrap(), 503);
    assert_eq!(app.target.count(&TestApp::idem("evt_late")), 0);
    let row = app
        .db
        .store()
        .await
        .lookup(&EventId::new(PROVIDER, "evt_late"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.status.as_str(), "failed");
    assert_eq!(row.last_error.as_deref(), Some("released at shutdown"));
}

/// The node begins to shut down while a replay's reopen is on its way to the store: the
/// replay never starts, and the event is a dead letter again (to replay later), not a
/// `failed` row that nobody redelivers.
#[actix_web::test]
async fn a_replay_cut_short_by_a_shutdown_leaves_a_dead_letter() {
    // No scheduler pass of the node's own waits on the locked table meanwhile.
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.queue.poll_interval = Duration::from_secs(3600);
    })
    .await;
    dead_letter(&app, "evt_rs").await;
    let lock = app.db.lock_table().await;
    let token = bearer(TOKEN);
    let auth = [("Authorization", token.as_str())];
    let path = format!("/admin/dead/{PROVIDER}/evt_rs/replay");
    let replay = app.post(&path, &auth, String::new());
    let shut = async {
        app.db.wait_for_table_waiters(1).await;
        app.start_shutdown();
        // The server stops accepting only once every shard has begun to drain.
        let address = app.address.trim_start_matches("http://").to_owned();
        eventually("the node to stop accepting connections", || async {
            tokio::net::TcpStream::connect(&address).await.is_err()
        })
        .await;
        lock.release().await;
    };
    // Answered with the row as the replay left it.
    let (answer, ()) = futures_util::join!(replay, shut);
    assert!(answer.body.contains(r#""status":"dead""#), "{answer:?}");
    let row = app
        .store
        .lookup(&EventId::new(PROVIDER, "evt_rs"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.status.as_str(), "dead", "{row:?}");
    assert_eq!(row.dead_reason.as_deref(), Some("replay_failed"));
    assert_eq!(
        app.target.count(&TestApp::idem("evt_rs")),
        1,
        "not sent again"
    );
}

/// A node that is shutting down takes no more queue rows: its scheduler finds nothing to
/// do (and so does not spin) while its last delivery runs.
async fn a_draining_node_takes_no_queue_rows(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_wait", "{}").await.status, 202);
    app.wait_status("evt_wait", "failed").await;
    app.target.set(Behaviour::Hang);
    assert_eq!(app.deliver("evt_last", "{}").await.status, 202);
    app.target.wait_for(&TestApp::idem("evt_last"), 1).await;
    app.db.make_due(PROVIDER, "evt_wait").await;
    app.start_shutdown();
    eventually("the node to drain", || async {
        app.log.count("hookgate.draining") > 0
    })
    .await;
    assert_eq!(app.scheduler.run_once().await.unwrap().taken, 0);
    app.target.release();
    app.wait_status("evt_last", "done").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_wait")), 1);
    assert_eq!(
        app.db.status(PROVIDER, "evt_wait").await.as_deref(),
        Some("failed")
    );
}

on_both_stores!(
    a_delivery_running_at_shutdown_finishes_and_is_answered,
    a_draining_node_takes_no_queue_rows,
);
