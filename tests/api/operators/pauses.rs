//! Pauses hold: an operator's pause of a provider, and the pause its target asks for with
//! `Retry-After`, keep a node from starting any delivery of that provider it has not
//! started yet — on every node, sync requests (answered 503 `paused`) and queue rows
//! alike: rows already waiting in a shard for a worker or taken by a pass under way, sync
//! requests waiting for a worker, a sync row's redelivery on a queue node, single replays
//! and bulk replay jobs included — and a target's pause of the whole provider is bounded.
//! The scheduler's background loop is slowed to an hour; passes are driven by hand.

use std::time::Duration;

use hookgate::claim::Mode;

use hookgate::secret::Secret;

use hookgate::config::Config;
use serde_json::{json, Value};

use crate::helpers::{eventually, spawn_app_on, Backend, Behaviour, TestApp, PROVIDER};

use super::common::{admin_app, get_json, post_json};
use crate::helpers::{failed_sync_row_and_a_queue_node, queue_mode};

const TOKEN: &str = "pauses-admin-token";

/// Queue mode on one shard with one worker, so a second event waits in the shard while
/// the first one runs; the admin API on.
fn one_worker(c: &mut Config) {
    c.providers[0].mode = Some(Mode::Queue);
    c.queue.poll_interval = Duration::from_secs(3600);
    c.server.shards = Some(1);
    c.server.workers_per_shard = 1;
    c.admin.token = Some(Secret::new(TOKEN));
}

async fn admin_post(app: &TestApp, path: &str) -> u16 {
    let auth = format!("Bearer {TOKEN}");
    app.post(path, &[("Authorization", &auth)], String::new())
        .await
        .status
}

async fn admin_get(app: &TestApp, path: &str) -> Value {
    let answer = app.get_with(path, &format!("Bearer {TOKEN}")).await;
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

/// The sync base node with the admin API on, and the background operators' work slowed to an hour
/// (passes are run by hand).
fn sync_admin(c: &mut Config) {
    c.admin.token = Some(Secret::new(TOKEN));
    c.queue.poll_interval = Duration::from_secs(3600);
}

/// A sync event the target refused for good (400): a dead letter after one delivery.
async fn dead_letter(app: &TestApp, key: &str) {
    app.target.set(Behaviour::Status(400));
    let answer = app.deliver(key, "{}").await;
    assert_eq!((answer.status, answer.path.as_str()), (200, "first_run"));
    app.wait_status(key, "dead").await;
    app.target.set(Behaviour::Accept);
}

/// The provider's entry in `/admin/api/stats`.
async fn provider_stats(app: &TestApp) -> Value {
    let stats = admin_get(app, "/admin/api/stats").await;
    stats["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == PROVIDER)
        .cloned()
        .unwrap()
}

/// `evt_busy` holds the shard's only worker (the target hangs on it), and `evt_waiting`
/// has been taken by the scheduler and waits in the shard for that worker.
async fn a_row_waits_for_the_busy_worker(app: &TestApp) {
    app.target.set(Behaviour::Hang);
    assert_eq!(app.deliver("evt_busy", "{}").await.status, 202);
    app.target.wait_for(&TestApp::idem("evt_busy"), 1).await;
    assert_eq!(app.deliver("evt_waiting", "{}").await.status, 202);
    eventually("the scheduler to take the waiting row", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_waiting").await.as_deref() == Some("in_progress")
    })
    .await;
}

/// An operator pauses the provider while a taken row waits in the shard for a worker:
/// when the worker frees up, the row is given back unstarted, and it is delivered once the
/// provider is resumed.
async fn a_row_waiting_in_a_shard_is_held_by_an_operators_pause(backend: Backend) {
    let app = spawn_app_on(backend, one_worker).await;
    a_row_waits_for_the_busy_worker(&app).await;
    let pause = format!("/admin/api/providers/{PROVIDER}/pause");
    assert_eq!(admin_post(&app, &pause).await, 200);
    app.target.release();
    app.wait_status("evt_busy", "done").await;
    app.wait_status("evt_waiting", "failed").await;
    let waiting = TestApp::idem("evt_waiting");
    assert_eq!(app.target.count(&waiting), 0, "delivered during the pause");
    assert_eq!(app.scheduler.run_once().await.unwrap().taken, 0, "held");

    let resume = format!("/admin/api/providers/{PROVIDER}/resume");
    assert_eq!(admin_post(&app, &resume).await, 200);
    eventually("the held row to be delivered once resumed", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_waiting").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&waiting), 1);
}

/// The running delivery's target answers 429 with `Retry-After: 30` while a taken row
/// waits in the shard: the target asked for time, so the row is given back unstarted.
async fn a_row_waiting_in_a_shard_is_held_by_its_targets_retry_after(backend: Backend) {
    let app = spawn_app_on(backend, one_worker).await;
    a_row_waits_for_the_busy_worker(&app).await;
    app.target.release_with(Behaviour::Throttle(429, "30"));
    app.wait_status("evt_busy", "failed").await;
    app.wait_status("evt_waiting", "failed").await;
    assert_eq!(
        app.target.count(&TestApp::idem("evt_waiting")),
        0,
        "delivered while its target asked for time"
    );
}

/// A single replay of a paused provider's dead letter — admin API, older admin route and
/// command line — is refused with a clear answer and changes nothing; once resumed it runs.
async fn a_single_replay_of_a_paused_provider_is_refused(backend: Backend) {
    let app = spawn_app_on(backend, sync_admin).await;
    dead_letter(&app, "dead_p").await;
    let idem = TestApp::idem("dead_p");
    let pause = format!("/admin/api/providers/{PROVIDER}/pause");
    assert_eq!(admin_post(&app, &pause).await, 200);

    let auth = format!("Bearer {TOKEN}");
    for path in [
        format!("/admin/api/events/{PROVIDER}/dead_p/replay"),
        format!("/admin/dead/{PROVIDER}/dead_p/replay"),
    ] {
        let answer = app
            .post(&path, &[("Authorization", &auth)], String::new())
            .await;
        assert_eq!(answer.status, 409, "{path}: {answer:?}");
        let body: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(body["error"], "paused", "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("paused"),
            "{body}"
        );
    }
    let out = app.run_cli(&["dead", "replay", PROVIDER, "dead_p"]).await;
    assert!(!out.status.success(), "the command line replayed it");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("paused"), "{stderr}");
    assert_eq!(
        app.db.status(PROVIDER, "dead_p").await.as_deref(),
        Some("dead")
    );
    assert_eq!(app.target.count(&idem), 1, "replayed during the pause");

    let resume = format!("/admin/api/providers/{PROVIDER}/resume");
    assert_eq!(admin_post(&app, &resume).await, 200);
    let path = format!("/admin/api/events/{PROVIDER}/dead_p/replay");
    let answer = app
        .post(&path, &[("Authorization", &auth)], String::new())
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(app.target.count(&idem), 2);
}

/// A bulk replay job whose provider is paused waits — saying so in its progress — and
/// replays nothing until the provider is resumed; then it replays every event once.
async fn a_bulk_replay_waits_while_its_provider_is_paused(backend: Backend) {
    let app = spawn_app_on(backend, sync_admin).await;
    for key in ["dead_a", "dead_b"] {
        dead_letter(&app, key).await;
    }
    let pause = format!("/admin/api/providers/{PROVIDER}/pause");
    assert_eq!(admin_post(&app, &pause).await, 200);
    let auth = format!("Bearer {TOKEN}");
    let body = json!({ "filter": {}, "rate": 100 }).to_string();
    let started = app
        .post("/admin/api/replays", &[("Authorization", &auth)], body)
        .await;
    assert_eq!(started.status, 201, "{started:?}");
    let id = serde_json::from_str::<Value>(&started.body).unwrap()["id"].clone();
    let operator_work = app.operator_work.clone();
    let run = actix_rt::spawn(async move { operator_work.run_once().await });

    let job_path = format!("/admin/api/replays/{id}");
    eventually("the job to wait for the pause, or to end", || async {
        let job = admin_get(&app, &job_path).await;
        job["waiting"].is_string() || job["status"] != "running"
    })
    .await;
    let job = admin_get(&app, &job_path).await;
    for key in ["dead_a", "dead_b"] {
        assert_eq!(
            app.target.count(&TestApp::idem(key)),
            1,
            "replayed while paused"
        );
    }
    assert_eq!(job["status"], "running", "{job}");
    let waiting = job["waiting"].as_str().unwrap();
    assert!(waiting.contains("paused"), "{job}");

    let resume = format!("/admin/api/providers/{PROVIDER}/resume");
    assert_eq!(admin_post(&app, &resume).await, 200);
    assert!(run.await.unwrap().unwrap(), "the job ran");
    let job = admin_get(&app, &job_path).await;
    assert_eq!(
        (
            job["status"].clone(),
            job["replayed"].clone(),
            job["failed"].clone()
        ),
        (json!("done"), json!(2), json!(0)),
        "{job}"
    );
    assert!(job["waiting"].is_null(), "{job}");
    for key in ["dead_a", "dead_b"] {
        assert_eq!(app.target.count(&TestApp::idem(key)), 2);
    }
}

/// A target answers `Retry-After` far beyond reason: that event's own next attempt honours
/// it up to `retry.cap`, but the provider's other events are held for at most
/// `queue.max_target_pause`, which `/admin/api/stats` and `/metrics` show, and an
/// operator's resume ends at once.
async fn a_targets_retry_after_pauses_its_provider_for_a_bounded_time(backend: Backend) {
    let app = spawn_app_on(backend, one_worker).await;
    app.target
        .set(Behaviour::Throttle(429, "18446744073709551615"));
    assert_eq!(app.deliver("evt_slow", "{}").await.status, 202);
    app.wait_ended("evt_slow", "failed", 1).await;
    let backoff = app.db.backoff(PROVIDER, "evt_slow").await;
    assert!(backoff > 3600.0, "the event's own wait: {backoff} s");

    let stats = provider_stats(&app).await;
    let left = stats["target_pause_s"].as_f64().unwrap_or(0.0);
    assert!(left > 0.0 && left <= 60.0, "{stats}");
    let metrics = app.get("/metrics").await.body;
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "hookgate_target_pause_seconds{{provider=\"{PROVIDER}\",route=\"main\"}}"
            ))
        })
        .unwrap_or_else(|| panic!("{metrics}"));
    let shown: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(shown > 0.0 && shown <= 60.0, "{line}");

    // An operator's resume ends the target's pause on this node: a new event starts at once.
    let resume = format!("/admin/api/providers/{PROVIDER}/resume");
    assert_eq!(admin_post(&app, &resume).await, 200);
    assert!(provider_stats(&app).await["target_pause_s"].is_null());
    app.target.set(Behaviour::Accept);
    assert_eq!(app.deliver("evt_next", "{}").await.status, 202);
    app.target.wait_for(&TestApp::idem("evt_next"), 1).await;
    assert_eq!(app.target.count(&TestApp::idem("evt_slow")), 1);
}

/// The store stops answering the pause read (its table locked past the deadline) while
/// passes come every 10 ms: a node keeps one pass at a time, never a growing pile of passes
/// queued behind the one that waits.
#[actix_web::test]
async fn a_pause_read_that_hangs_does_not_pile_up_operator_work_passes() {
    let app = spawn_app_on(Backend::Postgres, |c| {
        c.queue.poll_interval = Duration::from_millis(10);
        c.store.statement_timeout = Some(Duration::from_millis(300));
    })
    .await;
    let lock = app.db.lock_pg_table("hookgate_paused").await;
    eventually("three pause reads to miss the deadline", || async {
        app.log.count("operator_work.failed") >= 3
    })
    .await;
    let passes = app.operator_work.passes_in_flight();
    lock.release().await;
    assert!(passes <= 2, "{passes} operator-work passes in flight");
}

/// A paused queue provider accepts and holds its events on every node; a paused sync
/// provider answers 503 so the sender keeps them; resumed, everything is delivered.
async fn a_paused_provider_delivers_nothing_until_resumed(backend: Backend) {
    let app = admin_app(backend, |c| {
        let mut queued = c.providers[0].clone();
        queued.name = "q".into();
        queued.mode = Some(Mode::Queue);
        c.providers.push(queued);
    })
    .await;
    let (status, body) = post_json(&app, "/admin/api/providers/q/pause", Value::Null).await;
    assert_eq!((status, body["paused"].clone()), (200, json!(true)));
    post_json(
        &app,
        &format!("/admin/api/providers/{PROVIDER}/pause"),
        Value::Null,
    )
    .await;

    let queued = app
        .post("/webhooks/q", &[("X-Idempotency-Key", "held")], "{}".into())
        .await;
    assert_eq!(queued.status, 202);
    let sync = app.deliver("sync_held", "{}").await;
    assert_eq!((sync.status, sync.path.as_str()), (503, "paused"));
    assert!(sync.retry_after.is_some());
    assert_eq!(app.scheduler.run_once().await.unwrap().taken, 0, "held");
    assert_eq!(app.target.count("q:held"), 0);
    let stats = get_json(&app, "/admin/api/stats").await;
    let q = stats["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "q")
        .unwrap();
    assert_eq!(q["paused"], true);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 200);
    assert!(
        ready.body.contains(r#""paused":["q","stripe"]"#),
        "{}",
        ready.body
    );
    let metrics = app.get("/metrics").await.body;
    assert!(
        metrics.contains(r#"hookgate_provider_paused{provider="q",route="main"} 1"#),
        "{metrics}"
    );

    // Another node learns of the pause from the store at its next poll.
    let other = app
        .second_node(|c| {
            let mut queued = c.providers[0].clone();
            queued.name = "q".into();
            queued.mode = Some(Mode::Queue);
            c.providers.push(queued);
        })
        .await;
    other.operator_work.refresh_pauses().await.unwrap();
    assert_eq!(other.scheduler.run_once().await.unwrap().taken, 0);
    assert_eq!(other.deliver("sync_other", "{}").await.path, "paused");

    post_json(&app, "/admin/api/providers/q/resume", Value::Null).await;
    post_json(
        &app,
        &format!("/admin/api/providers/{PROVIDER}/resume"),
        Value::Null,
    )
    .await;
    other.operator_work.refresh_pauses().await.unwrap();
    app.scheduler.run_once().await.unwrap();
    eventually("the held event to arrive", || async {
        app.target.count("q:held") == 1
    })
    .await;
    assert_eq!(app.deliver("sync_held", "{}").await.status, 201);
}

/// A sync request that passed the door and is waiting for a worker when an operator pauses
/// its provider is answered 503 `paused` when a worker frees up, and is not delivered: a
/// pause holds every delivery not yet started, not only the requests that arrive after it.
async fn a_request_waiting_for_a_worker_is_held_by_a_pause(backend: Backend) {
    let app = std::rc::Rc::new(
        admin_app(backend, |c| {
            c.server.shards = Some(1);
            c.server.workers_per_shard = 1;
            c.server.admission_queue = Some(1);
            c.server.admission_wait = Duration::from_secs(60);
        })
        .await,
    );
    app.target.set(Behaviour::Hang);
    let send = |key: &'static str| {
        let app = std::rc::Rc::clone(&app);
        actix_rt::spawn(async move { app.deliver(key, "{}").await })
    };
    let running = send("evt_running");
    eventually("the first delivery to reach the target", || async {
        app.target.count(&TestApp::idem("evt_running")) == 1
    })
    .await;
    let waiting = send("evt_waiting");
    eventually("the second request to wait for the worker", || async {
        app.get("/metrics")
            .await
            .body
            .lines()
            .any(|l| l.starts_with("hookgate_admission_waiting{") && l.ends_with(" 1"))
    })
    .await;
    let (status, _) = post_json(
        &app,
        &format!("/admin/api/providers/{PROVIDER}/pause"),
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);

    app.target.set(Behaviour::Accept);
    app.target.release();
    let running = running.await.unwrap();
    assert_eq!(running.status, 201, "started before the pause: {running:?}");
    let waiting = waiting.await.unwrap();
    assert_eq!(
        (waiting.status, waiting.path.as_str()),
        (503, "paused"),
        "{waiting:?}"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_waiting")), 0);
    assert_eq!(
        app.db.count_rows().await,
        1,
        "the held request claimed nothing"
    );
}

/// An operator pauses the provider while a scheduler pass's take is held up (the table
/// locked): the row the pass then takes goes back unstarted, and is delivered once the
/// provider is resumed.
#[actix_web::test]
async fn a_row_taken_while_its_provider_was_paused_goes_back_unstarted() {
    let app = spawn_app_on(Backend::Postgres, |c| {
        queue_mode(c);
        c.admin.token = Some(hookgate::secret::Secret::new("t0ken"));
    })
    .await;
    app.scheduler.by_hand().await;
    let idem = TestApp::idem("evt_pz");
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_pz", "{}").await.status, 202);
    app.wait_ended("evt_pz", "failed", 1).await;
    app.db.make_due(PROVIDER, "evt_pz").await;
    app.target.set(Behaviour::Accept);

    let auth = [("Authorization", "Bearer t0ken")];
    let lock = app.db.lock_table().await;
    let scheduler = app.scheduler.clone();
    let pass = actix_rt::spawn(async move { scheduler.run_once().await });
    app.db.wait_for_table_waiters(1).await;
    let pause = format!("/admin/api/providers/{PROVIDER}/pause");
    assert_eq!(app.post(&pause, &auth, String::new()).await.status, 200);
    lock.release().await;
    assert_eq!(pass.await.unwrap().unwrap().taken, 1);
    eventually("the taken row to be given back", || async {
        app.db.status(PROVIDER, "evt_pz").await.as_deref() == Some("failed")
    })
    .await;
    assert_eq!(app.target.count(&idem), 1, "not delivered while paused");

    let resume = format!("/admin/api/providers/{PROVIDER}/resume");
    assert_eq!(app.post(&resume, &auth, String::new()).await.status, 200);
    eventually("the row to be delivered once resumed", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_pz").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&idem), 2);
}

/// A sync row's redelivery on a queue-mode node obeys a pause of its provider: answered 503
/// `paused` (the sender keeps the event), not delivered; once resumed it is delivered.
async fn a_paused_queue_provider_holds_a_sync_rows_redelivery(backend: Backend) {
    let (app, node) = failed_sync_row_and_a_queue_node(backend, "evt_mp", |c| {
        c.admin.token = Some(Secret::new(TOKEN));
    })
    .await;
    app.target.set(Behaviour::Accept);
    let auth = format!("Bearer {TOKEN}");
    let headers = [("Authorization", auth.as_str())];
    let pause = format!("/admin/api/providers/{PROVIDER}/pause");
    assert_eq!(node.post(&pause, &headers, String::new()).await.status, 200);
    let held = node.deliver("evt_mp", "{}").await;
    assert_eq!(
        (held.status, held.path.as_str()),
        (503, "paused"),
        "{held:?}"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_mp")), 1);

    let resume = format!("/admin/api/providers/{PROVIDER}/resume");
    assert_eq!(
        node.post(&resume, &headers, String::new()).await.status,
        200
    );
    let retried = node.deliver("evt_mp", "{}").await;
    assert_eq!(
        (retried.status, retried.path.as_str()),
        (201, "retry_after_failure")
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_mp")), 2);
}

on_both_stores!(
    a_row_waiting_in_a_shard_is_held_by_an_operators_pause,
    a_row_waiting_in_a_shard_is_held_by_its_targets_retry_after,
    a_single_replay_of_a_paused_provider_is_refused,
    a_bulk_replay_waits_while_its_provider_is_paused,
    a_targets_retry_after_pauses_its_provider_for_a_bounded_time,
    a_paused_provider_delivers_nothing_until_resumed,
    a_request_waiting_for_a_worker_is_held_by_a_pause,
    a_paused_queue_provider_holds_a_sync_rows_redelivery,
);
