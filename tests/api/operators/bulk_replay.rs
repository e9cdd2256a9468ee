//! Bulk replays, on both stores: a job replays each dead letter once across nodes, waits
//! for a worker on a busy node, tries again what the store failed to reopen, and the
//! command line's `dead replay --all` runs its own job. (Replaying one dead letter:
//! `dead_letters.rs`; the command line's timeline test in `history.rs` runs a bulk replay
//! too.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hookgate::secret::Secret;
use hookgate::store::operator::SearchFilter;
use hookgate::worker::HttpDelivery;
use serde_json::{json, Value};

use crate::helpers::{
    base_config, eventually, start_node_on, Backend, Behaviour, FaultyStore, TestApp, TestDb,
    TestTarget, PROVIDER,
};

use super::common::{admin_app, get_json, post_json, TOKEN};

/// Three dead letters replayed by one job, planned first; two nodes run their operators' work at
/// once and each event reaches the target once more, not twice; a cancelled job replays
/// nothing.
async fn a_bulk_replay_replays_each_dead_letter_once_across_nodes(backend: Backend) {
    // The nodes' own operators' work leaves the job to the test's passes.
    let quiet =
        |c: &mut hookgate::config::Config| c.queue.poll_interval = Duration::from_secs(3600);
    let app = admin_app(backend, quiet).await;
    app.target.set(Behaviour::Status(400));
    for n in 0..3 {
        app.deliver(&format!("bulk_{n}"), "{}").await;
    }
    app.target.set(Behaviour::Accept);
    let filter = json!({ "filter": { "provider": PROVIDER, "reason": "non_retryable" } });
    let (_, plan) = post_json(&app, "/admin/api/replays/plan", filter.clone()).await;
    assert_eq!(plan["count"], 3);
    let mut request = filter.clone();
    request["rate"] = json!(1000);
    let (status, job) = post_json(&app, "/admin/api/replays", request).await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_i64().unwrap();

    let other = app
        .second_node(|c| {
            c.admin.token = Some(Secret::new(TOKEN));
            quiet(c);
        })
        .await;
    let (a, b) = futures_util::join!(app.operator_work.run_once(), other.operator_work.run_once());
    assert!(a.unwrap() ^ b.unwrap(), "exactly one node ran the job");
    let job = get_json(&app, &format!("/admin/api/replays/{id}")).await;
    assert_eq!(job["status"], "done", "{job}");
    assert_eq!(job["replayed"], 3);
    assert_eq!(job["items"].as_array().unwrap().len(), 3);
    for n in 0..3 {
        let key = TestApp::idem(&format!("bulk_{n}"));
        assert_eq!(
            app.target.count(&key),
            2,
            "{key}: once by the sender, once replayed"
        );
    }
    assert!(
        !app.operator_work.run_once().await.unwrap(),
        "nothing left to run"
    );

    // A cancelled job does nothing.
    app.target.set(Behaviour::Status(400));
    app.deliver("bulk_late", "{}").await;
    app.target.set(Behaviour::Accept);
    let (_, job) = post_json(&app, "/admin/api/replays", filter).await;
    let id = job["id"].as_i64().unwrap();
    let (_, cancelled) = post_json(
        &app,
        &format!("/admin/api/replays/{id}/cancel"),
        Value::Null,
    )
    .await;
    assert_eq!(cancelled["status"], "cancelled");
    app.operator_work.run_once().await.unwrap();
    assert_eq!(app.target.count(&TestApp::idem("bulk_late")), 1);
    let (status, _) = post_json(
        &app,
        "/admin/api/replays/plan",
        json!({ "filter": { "status": "done" } }),
    )
    .await;
    assert_eq!(status, 400, "only dead letters or failed queue rows");
}

/// A bulk replay on a node whose every worker is busy: each dead letter waits for a
/// worker and is replayed, none is spent as an error, and the job ends with all replayed.
async fn a_bulk_replay_on_a_busy_node_waits_for_a_worker(backend: Backend) {
    let app = admin_app(backend, |c| {
        c.server.shards = Some(1);
        c.server.workers_per_shard = 1;
        // The node's own operators' work leaves the job to the test's pass.
        c.queue.poll_interval = Duration::from_secs(3600);
    })
    .await;
    app.target.set(Behaviour::Status(400));
    for n in 0..2 {
        app.deliver(&format!("busy_{n}"), "{}").await;
    }
    app.target.set(Behaviour::Hang);
    let blocker = app.deliver("busy_blocker", "{}");
    let replayed = async {
        app.target.wait_for(&TestApp::idem("busy_blocker"), 1).await;
        let request = json!({ "filter": { "provider": PROVIDER }, "rate": 1000 });
        let (status, job) = post_json(&app, "/admin/api/replays", request).await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_i64().unwrap();
        let path = format!("/admin/api/replays/{id}");
        let run = app.operator_work.run_once();
        let free = async {
            // The job has reached a dead letter while the only worker is busy.
            eventually("the job to begin an item", || async {
                !get_json(&app, &path).await["items"]
                    .as_array()
                    .unwrap()
                    .is_empty()
            })
            .await;
            app.target.release();
        };
        let (ran, ()) = futures_util::join!(run, free);
        assert!(ran.unwrap(), "the job ran");
        get_json(&app, &path).await
    };
    let (_, job) = futures_util::join!(blocker, replayed);
    assert_eq!(job["status"], "done", "{job}");
    assert_eq!(job["replayed"], 2, "{job}");
    for n in 0..2 {
        let key = TestApp::idem(&format!("busy_{n}"));
        assert_eq!(app.target.count(&key), 2, "{key}: once sent, once replayed");
    }
}

/// The store fails to reopen each dead letter once (an outage, or a row lock past the
/// deadline): the bulk job tries each again instead of recording a permanent error, and
/// every dead letter is replayed once.
async fn a_bulk_replay_tries_again_what_the_store_failed_to_reopen(backend: Backend) {
    let db = TestDb::on(backend).await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    config.admin.token = Some(Secret::new(TOKEN));
    config.queue.poll_interval = Duration::from_secs(3600);
    let store = Arc::new(FaultyStore::new(db.store_with(config.store.clone()).await));
    let faults = Arc::clone(&store);
    let app = start_node_on(db, target, config, Arc::new(HttpDelivery), store).await;
    app.target.set(Behaviour::Status(400));
    for n in 0..3 {
        assert_eq!(app.deliver(&format!("lost_{n}"), "{}").await.status, 200);
    }
    app.target.set(Behaviour::Accept);
    faults.fail_replays(3);
    let request = json!({ "filter": { "provider": PROVIDER }, "rate": 1000 });
    let (status, job) = post_json(&app, "/admin/api/replays", request).await;
    assert_eq!(status, 201, "{job}");
    assert!(app.operator_work.run_once().await.unwrap(), "the job ran");
    let job = get_json(&app, &format!("/admin/api/replays/{}", job["id"])).await;
    assert_eq!(faults.replays_failed.load(Ordering::SeqCst), 3);
    assert_eq!(
        (
            job["status"].clone(),
            job["replayed"].clone(),
            job["failed"].clone()
        ),
        (json!("done"), json!(3), json!(0)),
        "{job}"
    );
    for n in 0..3 {
        let key = TestApp::idem(&format!("lost_{n}"));
        assert_eq!(app.target.count(&key), 2, "{key}: once sent, once replayed");
    }
}

/// `dead replay --all` runs the job it created, to its end, whatever other job waits: an
/// older job that no node holds is neither taken nor touched, and the command exits 0 with
/// its own job done (it took the older one, exited 1 and left its own for a node).
async fn the_command_lines_bulk_replay_runs_its_own_job_and_leaves_an_older_one(backend: Backend) {
    let mut app = admin_app(backend, |_| {}).await;
    app.target.set(Behaviour::Status(400));
    for n in 0..2 {
        app.deliver(&format!("own_{n}"), "{}").await;
    }
    app.target.set(Behaviour::Accept);
    // No node runs jobs from here on: only the command line could take one.
    app.shutdown().await;
    let operator = app.store.operator();
    let elsewhere = SearchFilter {
        provider: Some("elsewhere".into()),
        ..SearchFilter::default()
    };
    let older = operator
        .create_job(&serde_json::to_string(&elsewhere).unwrap(), 0, 1.0)
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("hookgate-own-job-{}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("c.toml");
    let schema = match backend {
        Backend::Postgres => format!("schema = \"{}\"\n", app.db.schema),
        Backend::Sqlite => String::new(),
    };
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{}\"\n{schema}[[providers]]\nname = \"{PROVIDER}\"\n\
             preset = \"none\"\nkey = [{{ header = \"X-Idempotency-Key\" }}]\n\
             target = {{ url = \"{}\" }}\n",
            app.db.url, app.target.url
        ),
    )
    .unwrap();
    let out = actix_web::rt::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["dead", "replay", "--all", "--rate", "100", "--config"])
            .arg(config)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    std::fs::remove_dir_all(dir).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let own = older + 1;
    assert!(
        stdout.contains(&format!(
            "replay job {own}: 2 replayed, 0 failed of 2 (done)"
        )),
        "{stdout}{stderr}"
    );
    for n in 0..2 {
        assert_eq!(app.target.count(&TestApp::idem(&format!("own_{n}"))), 2);
    }
    let untouched = operator.job(older).await.unwrap().unwrap();
    assert_eq!(
        (
            untouched.status.as_str(),
            untouched.owner,
            untouched.replayed
        ),
        ("running", None, 0)
    );
}

on_both_stores!(
    a_bulk_replay_replays_each_dead_letter_once_across_nodes,
    a_bulk_replay_on_a_busy_node_waits_for_a_worker,
    a_bulk_replay_tries_again_what_the_store_failed_to_reopen,
    the_command_lines_bulk_replay_runs_its_own_job_and_leaves_an_older_one,
);
