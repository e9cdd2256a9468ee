//! Every event's whole history, on both stores: each attempt in the attempts table with its
//! path, outcome and the target's answer (NUL bytes replaced, the first bytes of a large
//! one kept), paged with its total; a crashed attempt replayable when payloads are kept
//! always; the command line's timeline. (Searching: `search.rs`; bulk replays:
//! `bulk_replay.rs`; pausing a provider: `pauses.rs`.)

use std::time::Duration;

use hookgate::claim::Mode;

use hookgate::secret::Secret;

use hookgate::config::KeepPayload;
use hookgate::key::EventId;
use serde_json::{json, Value};

use crate::helpers::{
    eventually, Backend, Behaviour, PanickingDelivery, TestApp, ERROR_PAGE, PROVIDER,
};

use super::common::{admin_app, auth, get_json, post_json, TOKEN};

/// A sender delivers an event the target fails twice, then accepts: three attempts, each
/// in the history with its path, outcome and the target's answer; a plain first run that
/// ends done writes none.
async fn an_event_that_failed_twice_shows_three_attempts_and_a_plain_one_none(backend: Backend) {
    let app = admin_app(backend, |_| {}).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_story", r#"{"id":"s"}"#).await.status, 503);
    assert_eq!(app.deliver("evt_story", r#"{"id":"s"}"#).await.status, 503);
    app.target.set(Behaviour::Accept);
    assert_eq!(app.deliver("evt_story", r#"{"id":"s"}"#).await.status, 201);
    assert_eq!(app.deliver("evt_plain", r#"{"id":"p"}"#).await.status, 201);

    let event = get_json(&app, &format!("/admin/api/events/{PROVIDER}/evt_story")).await;
    let attempts = event["attempts"].as_array().unwrap();
    let story: Vec<(&str, &str, Value)> = attempts
        .iter()
        .map(|a| {
            (
                a["path"].as_str().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["target_status"].clone(),
            )
        })
        .collect();
    assert_eq!(
        story,
        vec![
            ("first_run", "failed", json!(500)),
            ("retry_after_failure", "failed", json!(500)),
            ("retry_after_failure", "done", json!(201)),
        ]
    );
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[2]["attempt"], 3);
    assert!(attempts[2]["answer"].as_str().unwrap().contains("received"));
    assert!(attempts
        .iter()
        .all(|a| a["node"].as_str().is_some_and(|n| !n.is_empty())));
    let plain = get_json(&app, &format!("/admin/api/events/{PROVIDER}/evt_plain")).await;
    assert_eq!(plain["attempts"], json!([]));
    assert_eq!(plain["status"], "done");

    // Retention takes the history with its event.
    app.db.advance_clock(Duration::from_secs(2 * 3600)).await;
    let swept = app
        .store
        .sweep(
            hookgate::claim::Status::Done,
            Duration::from_secs(3600),
            100,
        )
        .await
        .unwrap();
    assert!(swept >= 1);
    let gone = app
        .store
        .operator()
        .history(&EventId::new(PROVIDER, "evt_story"), None, 50)
        .await
        .unwrap();
    assert!(gone.attempts.is_empty() && gone.total == 0, "{gone:?}");
}

/// With `keep_payload = "always"` the payload is written with the claim: an attempt that
/// crashed leaves a row a sender-gave-up dead letter can be replayed from; by default it
/// cannot be.
async fn a_crashed_attempt_is_replayable_when_the_payload_is_kept_always(backend: Backend) {
    for keep in [KeepPayload::Always, KeepPayload::OnFailure] {
        let db = crate::helpers::TestDb::on(backend).await;
        let target = crate::helpers::TestTarget::start().await;
        let mut config = crate::helpers::base_config(&db, &target);
        config.admin.token = Some(Secret::new(TOKEN));
        config.providers[0].keep_payload = keep;
        let app =
            crate::helpers::start_node(db, target, config, std::sync::Arc::new(PanickingDelivery))
                .await;
        let key = "evt_panic_kept";
        let answer = app.deliver(key, r#"{"id":"kept"}"#).await;
        assert_eq!(answer.status, 503, "{}", answer.body);
        app.db.expire_lease(PROVIDER, key).await;
        let abandoned = app
            .store
            .abandon(PROVIDER, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(abandoned, 1);
        let (status, body) = post_json(
            &app,
            &format!("/admin/api/events/{PROVIDER}/{key}/replay"),
            Value::Null,
        )
        .await;
        match keep {
            KeepPayload::Always => {
                assert_eq!(status, 200, "{body}");
                assert_eq!(body["status"], "done");
                assert_eq!(body["payload"], r#"{"id":"kept"}"#, "kept once done");
            }
            KeepPayload::OnFailure => {
                assert_eq!(status, 409, "no payload to replay: {body}");
                assert_eq!(app.db.status(PROVIDER, key).await.as_deref(), Some("dead"));
            }
        }
    }
}

/// An event's history is paged: its page answers the latest 50 attempts (oldest first) with
/// how many there are in all and where the older ones start; `before` and `limit` page
/// back, at most 500 at a time; a `before` that is no attempt number is a 400.
async fn an_events_history_is_answered_a_page_at_a_time_with_its_total(backend: Backend) {
    let app = admin_app(backend, |_| {}).await;
    app.db.fill_history(PROVIDER, "evt_throttled", 1_200).await;
    let path = format!("/admin/api/events/{PROVIDER}/evt_throttled");
    let numbers = |page: &Value| -> Vec<i64> {
        page["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["attempt"].as_i64().unwrap())
            .collect()
    };
    let latest = get_json(&app, &path).await;
    assert_eq!(numbers(&latest), (1_151..=1_200).collect::<Vec<_>>());
    assert_eq!(latest["attempts_total"], 1_200);
    assert_eq!(latest["attempt_count"], 1_200);
    assert_eq!(latest["attempts_before"], 1_151);
    let older = get_json(&app, &format!("{path}?before=1151&limit=100")).await;
    assert_eq!(numbers(&older), (1_051..=1_150).collect::<Vec<_>>());
    assert_eq!(older["attempts_before"], 1_051);
    let most = get_json(&app, &format!("{path}?limit=100000")).await;
    assert_eq!(numbers(&most).len(), 500, "at most 500 a page");
    let first = get_json(&app, &format!("{path}?before=3")).await;
    assert_eq!(numbers(&first), [1, 2]);
    assert_eq!(first["attempts_before"], Value::Null, "nothing older");
    for bad in ["before=0", "before=-1", "before=x", "limit=x"] {
        let answer = app.get_with(&format!("{path}?{bad}"), &auth()).await;
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
    }
}

/// A target's answer holding NUL bytes (UTF-16 text, a binary format) is kept in the
/// history as text with each NUL replaced — a text column on Postgres refuses the byte, and
/// an outcome write that can never land would hold the event forever. In queue mode the
/// event fails, is retried and ends done, delivered twice; in sync mode the sender's retry
/// is answered from its recorded outcome.
async fn a_target_answer_with_nul_bytes_is_recorded_in_either_mode(backend: Backend) {
    let app = admin_app(backend, |c| {
        c.providers[0].mode = Some(Mode::Queue);
        c.queue.poll_interval = Duration::from_secs(3600);
    })
    .await;
    app.target.set(Behaviour::Binary(500));
    assert_eq!(app.deliver("evt_nul", "{}").await.status, 202);
    eventually("the failed answer to be recorded", || async {
        app.db.status(PROVIDER, "evt_nul").await.as_deref() == Some("failed")
    })
    .await;
    app.target.set(Behaviour::Binary(200));
    app.db.make_due(PROVIDER, "evt_nul").await;
    eventually("the retry to be recorded done", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_nul").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_nul")), 2);
    let event = get_json(&app, &format!("/admin/api/events/{PROVIDER}/evt_nul")).await;
    let answers: Vec<(&str, &str)> = event["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["outcome"].as_str().unwrap(),
                a["answer"].as_str().unwrap(),
            )
        })
        .collect();
    let kept = "o\u{fffd}k\u{fffd}";
    assert_eq!(answers, vec![("failed", kept), ("done", kept)]);

    let sync = admin_app(backend, |_| {}).await;
    sync.target.set(Behaviour::Binary(500));
    assert_eq!(sync.deliver("evt_nul", "{}").await.status, 503);
    sync.target.set(Behaviour::Binary(202));
    let retried = sync.deliver("evt_nul", "{}").await;
    assert_eq!(
        (retried.status, retried.path.as_str()),
        (202, "retry_after_failure")
    );
    let again = sync.deliver("evt_nul", "{}").await;
    assert_eq!((again.status, again.path.as_str()), (202, "duplicate_done"));
    assert_eq!(sync.target.count(&TestApp::idem("evt_nul")), 2);
}

/// A target answer larger than the result the node caches (64 KiB) still leaves its first
/// bytes in the history, which is when an operator needs them (a proxy's HTML error page):
/// a 502 with a 100 KiB page, then a 2xx of 100 KiB, each kept as its first 512 bytes,
/// while the large 2xx is still not cached for replays to duplicates.
async fn a_large_target_answer_keeps_its_first_bytes_in_the_history(backend: Backend) {
    let app = admin_app(backend, |_| {}).await;
    let big = 100 << 10;
    app.target.set(Behaviour::LargePage(502, big));
    let failed = app.deliver("evt_big", "{}").await;
    assert_eq!(failed.status, 503, "{failed:?}");
    app.target.set(Behaviour::Large(big));
    let done = app.deliver("evt_big", "{}").await;
    assert_eq!(
        (done.status, done.path.as_str()),
        (200, "retry_after_failure")
    );
    let again = app.deliver("evt_big", "{}").await;
    assert_eq!((again.status, again.body.len()), (200, 0), "not cached");
    let event = get_json(&app, &format!("/admin/api/events/{PROVIDER}/evt_big")).await;
    let attempts = event["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{event}");
    assert_eq!(attempts[0]["target_status"], 502);
    let page = attempts[0]["answer"].as_str().unwrap_or_default();
    assert!(page.starts_with(ERROR_PAGE), "{:?}", attempts[0]);
    assert_eq!(page.len(), 512);
    assert_eq!(attempts[1]["target_status"], 200);
    assert_eq!(attempts[1]["answer"], "r".repeat(512));
}

on_both_stores!(
    an_events_history_is_answered_a_page_at_a_time_with_its_total,
    an_event_that_failed_twice_shows_three_attempts_and_a_plain_one_none,
    a_target_answer_with_nul_bytes_is_recorded_in_either_mode,
    a_crashed_attempt_is_replayable_when_the_payload_is_kept_always,
    a_large_target_answer_keeps_its_first_bytes_in_the_history,
);

/// The command line: `events history` prints an event's timeline; `dead replay --all`
/// runs a bulk replay job in its own process.
#[actix_web::test]
async fn the_command_line_prints_a_timeline_and_replays_dead_letters_in_bulk() {
    let app = admin_app(Backend::Postgres, |_| {}).await;
    app.target.set(Behaviour::Status(400));
    for n in 0..2 {
        app.deliver(&format!("cli_{n}"), "{}").await;
    }
    app.target.set(Behaviour::Accept);
    let dir = std::env::temp_dir().join(format!("hookgate-history-{}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{}\"\nschema = \"{}\"\n[[providers]]\nname = \"{PROVIDER}\"\n\
             preset = \"none\"\nkey = [{{ header = \"X-Idempotency-Key\" }}]\n\
             target = {{ url = \"{}\" }}\n",
            app.db.url, app.db.schema, app.target.url
        ),
    )
    .unwrap();
    let run = |args: Vec<String>| {
        let config = config.clone();
        actix_web::rt::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
                .args(args)
                .arg("--config")
                .arg(config)
                .output()
                .unwrap()
        })
    };
    let out = run([
        "dead",
        "replay",
        "--all",
        "--provider",
        PROVIDER,
        "--rate",
        "100",
    ]
    .map(String::from)
    .to_vec())
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 replayed, 0 failed of 2"), "{stdout}");
    for n in 0..2 {
        assert_eq!(app.target.count(&TestApp::idem(&format!("cli_{n}"))), 2);
    }
    let out = run(["events", "history", PROVIDER, "cli_0"]
        .map(String::from)
        .to_vec())
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("#1 first_run dead"), "{stdout}");
    assert!(stdout.contains("#2 replay done"), "{stdout}");
    // A long history: the latest page, and how to see the rest.
    app.db.fill_history(PROVIDER, "cli_long", 120).await;
    let out = run(["events", "history", PROVIDER, "cli_long", "--limit", "10"]
        .map(String::from)
        .to_vec())
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let shown: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  #")).collect();
    assert_eq!(shown.len(), 10, "{stdout}");
    assert!(shown[0].starts_with("  #111 ") && shown[9].starts_with("  #120 "));
    assert!(
        stdout.contains("(10 of 120 history row(s) shown; older ones: --before 111)"),
        "{stdout}"
    );
    let refused = run(["events", "history", PROVIDER, "cli_long", "--before", "0"]
        .map(String::from)
        .to_vec())
    .await
    .unwrap();
    assert!(!refused.status.success(), "--before 0 is refused");
    std::fs::remove_dir_all(dir).unwrap();
}
