//! Every event's whole history and what operators do with it, on both stores: the attempts
//! table, payloads kept always, searching, and bulk replays run once across nodes.
//! (Pausing a provider: `pauses.rs`.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hookgate::claim::Mode;

use hookgate::secret::Secret;

use hookgate::config::KeepPayload;
use hookgate::key::EventId;
use hookgate::store::operator::SearchFilter;
use hookgate::worker::HttpDelivery;
use serde_json::{json, Value};

use crate::helpers::{
    base_config, eventually, start_node_on, Backend, Behaviour, FaultyStore, PanickingDelivery,
    TestApp, TestDb, TestTarget, ERROR_PAGE, PROVIDER,
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

/// The search pages by cursor, filters by status and key prefix, and refuses what it
/// cannot read.
async fn events_are_searched_by_filter_and_paged(backend: Backend) {
    let app = admin_app(backend, |_| {}).await;
    for n in 0..5 {
        app.deliver(&format!("ok_{n}"), "{}").await;
    }
    app.target.set(Behaviour::Status(400));
    for n in 0..2 {
        app.deliver(&format!("bad_{n}"), "{}").await;
    }
    let dead = get_json(&app, "/admin/api/events?status=dead").await;
    assert_eq!(dead["events"].as_array().unwrap().len(), 2);
    assert!(dead["next_cursor"].is_null());
    let mut seen = Vec::new();
    let mut path = "/admin/api/events?key_prefix=ok_&limit=2".to_owned();
    loop {
        let page = get_json(&app, &path).await;
        for e in page["events"].as_array().unwrap() {
            seen.push(e["event_key"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/admin/api/events?key_prefix=ok_&limit=2&cursor={c}"),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["ok_0", "ok_1", "ok_2", "ok_3", "ok_4"]);
    // A time range: everything changed in the last hour, nothing in the future.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let recent = get_json(
        &app,
        &format!("/admin/api/events?updated_after={}&limit=100", now - 3600.0),
    )
    .await;
    assert_eq!(recent["events"].as_array().unwrap().len(), 7);
    let future = get_json(
        &app,
        &format!("/admin/api/events?created_after={}", now + 60.0),
    )
    .await;
    assert_eq!(future["events"], json!([]));
    // `_` in a prefix is a character, not a wildcard.
    let none = get_json(&app, "/admin/api/events?key_prefix=ok%25").await;
    assert_eq!(none["events"], json!([]));
    let bad = app.get_with("/admin/api/events?status=gone", &auth()).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(app.get("/admin/api/events").await.status, 401);
}

/// Lists never carry payloads: six dead letters of 1 MB each are listed whole in a few
/// kilobytes — by `/admin/dead`, the search and the command line's `dead list` — each with
/// its payload's size; one event's page still has its payload whole.
async fn lists_of_large_dead_letters_carry_their_sizes_not_their_payloads(backend: Backend) {
    let app = admin_app(backend, |c| c.server.max_body_bytes = 2 << 20).await;
    app.target.set(Behaviour::Status(400));
    let filler = "x".repeat(1 << 20);
    for i in 0..6 {
        let body = format!(r#"{{"id":"evt_big{i}","filler":"{filler}"}}"#);
        let answer = app.deliver(&format!("evt_big{i}"), &body).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let size = (format!(r#"{{"id":"evt_big0","filler":"{filler}"}}"#)).len();
    for (path, list) in [
        ("/admin/dead?limit=1000", "dead"),
        ("/admin/api/events?status=dead&limit=500", "events"),
    ] {
        let answer = app.get_with(path, &auth()).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert!(
            answer.body.len() < 16 << 10,
            "{path}: {} bytes",
            answer.body.len()
        );
        let page: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(page["truncated"], false, "{path}");
        let items = page[list].as_array().unwrap();
        assert_eq!(items.len(), 6, "{path}");
        for item in items {
            assert!(item.get("payload").is_none(), "{path}: {item}");
            assert!(item.get("request_headers").is_none(), "{path}: {item}");
            assert_eq!(item["payload_bytes"], json!(size), "{path}: {item}");
        }
    }
    let rows = app
        .store
        .dead_letters(Some(PROVIDER), None, 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|r| r.payload_bytes == Some(size as u64)));
    let one = get_json(&app, &format!("/admin/api/events/{PROVIDER}/evt_big3")).await;
    assert_eq!(one["payload"].as_str().map(str::len), Some(size));
}

/// A search reads at most its budget of rows a page: one no row matches answers empty pages
/// that say so, each going on from where the last stopped, to the end; one few rows match
/// finds each of them once, in the page order, whichever page they fall in.
async fn a_search_reads_a_bounded_number_of_rows_a_page_and_goes_on_from_there(backend: Backend) {
    let db = crate::helpers::TestDb::on(backend).await;
    let store = db.store().await;
    let rows = 2 * hookgate::store::SCAN_BUDGET + 5_000;
    db.fill_dead(rows).await;
    let pages = |filter: SearchFilter| {
        let store = std::sync::Arc::clone(&store);
        async move {
            let mut pages = Vec::new();
            let mut after = None;
            loop {
                let page = store
                    .operator()
                    .search(&filter, after.as_ref(), 50)
                    .await
                    .unwrap();
                after = page.next.clone();
                pages.push(page);
                if after.is_none() {
                    return pages;
                }
                assert!(pages.len() < 10, "a search that never ends");
            }
        }
    };
    let nothing = pages(SearchFilter {
        provider: Some("nobody".into()),
        ..SearchFilter::default()
    })
    .await;
    assert_eq!(nothing.len(), 3, "{rows} rows read a budget at a time");
    assert!(nothing.iter().all(|p| p.rows.is_empty()));
    assert!(nothing[..2].iter().all(|p| p.scan_stopped));
    assert!(!nothing[2].scan_stopped);

    let few = pages(SearchFilter {
        key_prefix: Some("k2500".into()),
        ..SearchFilter::default()
    })
    .await;
    let keys: Vec<String> = few
        .iter()
        .flat_map(|p| p.rows.iter().map(|r| r.id.key.to_string()))
        .collect();
    assert_eq!(keys, ["k2500", "k25000"]);
    let first = store
        .operator()
        .search(&SearchFilter::default(), None, 50)
        .await
        .unwrap();
    assert_eq!(first.rows.len(), 50);
    assert_eq!(first.rows[0].id.key.as_ref(), "k1", "newest first");
    assert!(!first.scan_stopped);
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

/// The statistics count rows per status at most once per `admin.stats_max_age` on a node,
/// and say how old their counts are; the queue's depth is read each time. With a max age
/// of zero every call counts.
async fn the_statistics_count_the_table_once_per_max_age_and_say_how_old(backend: Backend) {
    let done = |stats: &Value| stats["providers"][0]["counts"]["done"].clone();
    let app = admin_app(backend, |c| {
        c.admin.stats_max_age = Duration::from_secs(3600);
    })
    .await;
    assert_eq!(app.deliver("evt_s1", "{}").await.status, 201);
    let first = get_json(&app, "/admin/api/stats").await;
    assert_eq!(done(&first), 1);
    assert_eq!(first["counts_max_age_s"], 3600.0);
    assert_eq!(app.deliver("evt_s2", "{}").await.status, 201);
    let second = get_json(&app, "/admin/api/stats").await;
    assert_eq!(done(&second), 1, "the counts of the first call: {second}");
    let (a, b) = (
        first["counts_age_s"].as_f64(),
        second["counts_age_s"].as_f64(),
    );
    assert!(
        a.is_some_and(|a| b.is_some_and(|b| b >= a)),
        "{first} {second}"
    );

    let live = admin_app(backend, |c| c.admin.stats_max_age = Duration::ZERO).await;
    assert_eq!(live.deliver("evt_s1", "{}").await.status, 201);
    assert_eq!(done(&get_json(&live, "/admin/api/stats").await), 1);
    assert_eq!(live.deliver("evt_s2", "{}").await.status, 201);
    assert_eq!(done(&get_json(&live, "/admin/api/stats").await), 2);
}

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

/// Keys are the senders' to choose, and a path cannot carry some of them (a browser makes
/// `/events/stripe/..` into `/events/`): the query form of the API,
/// `GET /admin/api/event?provider=&key=` and `POST /admin/api/event/replay?provider=&key=`,
/// opens and replays an event whatever its key. A query without a key, or naming no
/// provider, is refused and replays nothing; the path form still serves plain keys.
async fn an_event_with_any_key_is_opened_and_replayed_by_its_query(backend: Backend) {
    let app = admin_app(backend, |_| {}).await;
    let keys = ["..", ".", "a/b", "%2e%2e", "q?x=1&y", "h#x", "plus+ space"];
    app.target.set(Behaviour::Status(400));
    for key in keys {
        let answer = app.deliver(key, "{}").await;
        assert_eq!(answer.body, r#"{"status":"dead_lettered"}"#, "{key}");
    }
    app.target.set(Behaviour::Accept);
    for key in keys {
        let query = format!("provider={PROVIDER}&key={}", encoded(key));
        let event = get_json(&app, &format!("/admin/api/event?{query}")).await;
        assert_eq!(event["event_key"], key);
        assert_eq!(event["status"], "dead", "{key}");
        let (status, body) = post_json(
            &app,
            &format!("/admin/api/event/replay?{query}"),
            Value::Null,
        )
        .await;
        assert_eq!(status, 200, "{key}: {body}");
        assert_eq!(body["event_key"], key);
        assert_eq!(body["status"], "done", "{key}");
        let at_target = EventId::new(PROVIDER, key).header_value();
        assert_eq!(app.target.count(&at_target), 2, "{key}");
    }
    let plain = get_json(&app, &format!("/admin/api/events/{PROVIDER}/plus+%20space")).await;
    assert_eq!(plain["event_key"], "plus+ space");

    app.target.set(Behaviour::Status(400));
    app.deliver("still_dead", "{}").await;
    for (path, status) in [
        (format!("/admin/api/event/replay?provider={PROVIDER}"), 400),
        ("/admin/api/event/replay?key=still_dead".to_owned(), 400),
        (
            "/admin/api/event/replay?provider=nope&key=still_dead".to_owned(),
            404,
        ),
    ] {
        let (answered, body) = post_json(&app, &path, Value::Null).await;
        assert_eq!(answered, status, "{path}: {body}");
    }
    let missing = app
        .get_with(&format!("/admin/api/event?provider={PROVIDER}"), &auth())
        .await;
    assert_eq!(missing.status, 400, "{}", missing.body);
    let unknown = app
        .get_with(
            &format!("/admin/api/event?provider={PROVIDER}&key=nope"),
            &auth(),
        )
        .await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert_eq!(app.target.count(&TestApp::idem("still_dead")), 1);
    assert_eq!(
        app.db.status(PROVIDER, "still_dead").await.as_deref(),
        Some("dead")
    );
}

/// Every byte but letters and digits as `%XX`, for a query string.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
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
    the_statistics_count_the_table_once_per_max_age_and_say_how_old,
    an_events_history_is_answered_a_page_at_a_time_with_its_total,
    a_search_reads_a_bounded_number_of_rows_a_page_and_goes_on_from_there,
    lists_of_large_dead_letters_carry_their_sizes_not_their_payloads,
    an_event_that_failed_twice_shows_three_attempts_and_a_plain_one_none,
    a_target_answer_with_nul_bytes_is_recorded_in_either_mode,
    a_crashed_attempt_is_replayable_when_the_payload_is_kept_always,
    events_are_searched_by_filter_and_paged,
    a_bulk_replay_replays_each_dead_letter_once_across_nodes,
    a_bulk_replay_on_a_busy_node_waits_for_a_worker,
    a_bulk_replay_tries_again_what_the_store_failed_to_reopen,
    an_event_with_any_key_is_opened_and_replayed_by_its_query,
    a_large_target_answer_keeps_its_first_bytes_in_the_history,
    the_command_lines_bulk_replay_runs_its_own_job_and_leaves_an_older_one,
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
