//! The operator's surface: the admin API, dead-letter replay (HTTP and CLI), the retention
//! sweeper and `/metrics`. (`check-config`: `config/check_config.rs`.)

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::key::EventId;
use hookgate::metrics::Metrics;
use hookgate::retention::{SweepReport, Sweeper};
use hookgate::secret::Secret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{
    eventually, spawn_app, spawn_app_with, Backend, Behaviour, TestApp, TestDb, PROVIDER,
};

const TOKEN: &str = "s3cret-admin-token";

async fn admin_app() -> TestApp {
    spawn_app_with(|c| c.admin.token = Some(Secret::new(TOKEN))).await
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Makes `key` a dead letter through a sender's delivery refused with 400.
async fn dead_letter(app: &TestApp, key: &str) {
    app.target.set(Behaviour::Status(400));
    let answer = app.deliver(key, r#"{"id":"x"}"#).await;
    assert_eq!(answer.body, r#"{"status":"dead_lettered"}"#);
    app.target.set(Behaviour::Accept);
}

#[actix_web::test]
async fn the_admin_api_wants_the_token_and_is_absent_without_one() {
    let app = admin_app().await;
    let path = format!("/admin/events/{PROVIDER}/evt_1");
    assert_eq!(app.get(&path).await.status, 401);
    let wrong = bearer("wrong");
    let got = app.get_with(&path, &wrong).await;
    assert_eq!(got.status, 401);
    assert!(got.body.contains("unauthorized"));
    assert_eq!(app.get_with(&path, &bearer(TOKEN)).await.status, 404);

    let closed = spawn_app().await;
    assert_eq!(closed.get_with(&path, &bearer(TOKEN)).await.status, 404);
    // Disabled, every /admin/ route is 404 before anything reads the request: a query the
    // API would refuse (400) does not show that it exists.
    for probe in ["/admin/dead?limit=x", "/admin/dead", "/admin/anything"] {
        assert_eq!(closed.get(probe).await.status, 404, "{probe}");
    }
    let replay = format!("/admin/dead/{PROVIDER}/evt_1/replay");
    assert_eq!(closed.post(&replay, &[], String::new()).await.status, 404);
}

/// One raw request on its own connection (`head` without the blank line, then `body`, then
/// silence), and everything the server sends until it closes the connection. The 20 s is a
/// deadline for a hung test, not a timing claim.
async fn raw(app: &TestApp, head: &str, body: &str) -> String {
    let address = app.address.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(address).await.unwrap();
    conn.write_all(format!("{head}\r\n\r\n{body}").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The `error` code of a raw answer's JSON body.
fn error_code(answer: &str) -> String {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let body: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    body["error"].as_str().unwrap_or_default().to_owned()
}

/// The token is checked before a byte of the body is read: a client without it that
/// declares 2 MB and sends one byte is answered 401 without waiting for the rest, and holds
/// neither the connection nor a buffer.
#[actix_web::test]
async fn an_admin_post_without_the_token_is_refused_before_its_body_is_read() {
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.server.read_timeout = Duration::from_secs(1);
    })
    .await;
    for path in ["/admin/api/replays/plan", "/admin/api/replays"] {
        let answer = raw(
            &app,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: 2000000"
            ),
            "{",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
        assert_eq!(error_code(&answer), "unauthorized", "{path}: {answer}");
    }
}

/// `POST /admin/api/replays/plan` with the token, declaring `length` bytes and sending one.
fn operators_head(length: usize) -> String {
    format!(
        "POST /admin/api/replays/plan HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}",
        bearer(TOKEN)
    )
}

/// An operator's body is read like a sender's: within `server.read_timeout`, then 408
/// and the connection closed.
#[actix_web::test]
async fn an_operators_stalled_body_gets_408_within_read_timeout() {
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.server.read_timeout = Duration::from_secs(1);
    })
    .await;
    let stalled = raw(&app, &operators_head(100), "{").await;
    assert!(stalled.starts_with("HTTP/1.1 408"), "{stalled}");
    assert_eq!(error_code(&stalled), "request_timeout", "{stalled}");
}

/// A filter is small: an operator's body past 64 KiB is 413 before it is read.
#[actix_web::test]
async fn an_operators_body_over_64_kib_gets_413() {
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.server.read_timeout = Duration::from_secs(1);
    })
    .await;
    let oversized = raw(&app, &operators_head((64 << 10) + 1), "{").await;
    assert!(oversized.starts_with("HTTP/1.1 413"), "{oversized}");
    assert_eq!(error_code(&oversized), "body_too_large", "{oversized}");
}

/// A malformed body or query is a 400 with the API's JSON error, and only after the
/// token: without it the answer is 401 whatever the request holds.
#[actix_web::test]
async fn a_malformed_admin_request_gets_a_json_400_after_the_token() {
    let app = admin_app().await;
    let token = bearer(TOKEN);
    let auth = [("Authorization", token.as_str())];
    let code = |body: &str| -> String {
        let body: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        body["error"].as_str().unwrap_or_default().to_owned()
    };
    for path in ["/admin/api/replays/plan", "/admin/api/replays"] {
        let answer = app.post(path, &auth, "{not json".to_owned()).await;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert_eq!(code(&answer.body), "invalid_json", "{path}: {answer:?}");
        let answer = app.post(path, &[], "{not json".to_owned()).await;
        assert_eq!(answer.status, 401, "{path}: {answer:?}");
    }
    for path in ["/admin/dead?limit=x", "/admin/api/events?limit=x"] {
        let answer = app.get_with(path, &token).await;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert_eq!(code(&answer.body), "bad_query", "{path}: {answer:?}");
        assert_eq!(app.get(path).await.status, 401, "{path}");
    }
    let answer = app.get_with("/admin/api/replays/x", &token).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    assert_eq!(code(&answer.body), "no_such_event", "{answer:?}");
    assert_eq!(app.get("/admin/api/replays/x").await.status, 401);
}

/// Operators' work has connections of its own: with more operator requests stuck in the
/// store (pauses blocked on a lock the test holds on the paused-providers table, until a
/// deadline far off) than the node has connections for senders, senders are still
/// answered, at once and claimed; the stuck requests hold operator connections only.
#[actix_web::test]
async fn operator_requests_stuck_in_the_store_take_no_connection_a_sender_needs() {
    let app = std::rc::Rc::new(
        spawn_app_with(|c| {
            c.admin.token = Some(Secret::new(TOKEN));
            c.store.pool_size = 2;
            // A sender that finds no free connection is refused soon, not after the test.
            c.store.pool_timeout = Duration::from_secs(1);
            // The stuck requests stay stuck while the senders are tried.
            c.store.statement_timeout = Some(Duration::from_secs(25));
            // No pause poll of the node's own joins the stuck requests.
            c.queue.poll_interval = Duration::from_secs(3600);
        })
        .await,
    );
    let lock = app.db.lock_pg_table("hookgate_paused").await;
    let stuck: Vec<_> = (0..4)
        .map(|_| {
            let app = std::rc::Rc::clone(&app);
            actix_rt::spawn(async move {
                app.post(
                    &format!("/admin/api/providers/{PROVIDER}/pause"),
                    &[("Authorization", &bearer(TOKEN))],
                    String::new(),
                )
                .await
            })
        })
        .collect();
    // As many statements stuck as the pool that runs them has connections.
    app.db.wait_for_waiters_on("hookgate_paused", 2).await;

    for n in 0..3 {
        let answer = app.deliver(&format!("evt_beside_{n}"), "{}").await;
        assert_eq!(
            (answer.status, answer.path.as_str()),
            (201, "first_run"),
            "a sender beside stuck operators: {answer:?}"
        );
    }
    lock.release().await;
    for request in stuck {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
    }
}

/// A migration whose table lock is held by a long reader gives its lock request up after a
/// short lock timeout instead of queuing every claim behind it, tries again, and applies
/// once the reader is gone: a claim made while it waits is answered, within its deadline,
/// while the reader still reads; the migrations' bookkeeping ends complete.
#[actix_web::test]
async fn a_migration_waiting_for_a_long_reader_holds_no_claim_behind_it() {
    let db = crate::helpers::TestDb::new().await;
    let config = hookgate::config::StoreConfig {
        // Far past the migration's lock timeout: a claim that waits for the reader fails.
        statement_timeout: Some(Duration::from_secs(20)),
        ..db.store_config()
    };
    let store = db.store_with(config.clone()).await;
    // An upgrade still to apply, one that alters the events table (ACCESS EXCLUSIVE).
    db.execute("DELETE FROM hookgate_migrations WHERE version = 4")
        .await;
    let reader = db.read_in_open_transaction("webhook_events").await;
    let upgrading = hookgate::store::open(&config).await.unwrap();
    let waits = std::sync::Mutex::new(Vec::new());
    let on_wait = |wait: &hookgate::store::MigrationWait| {
        waits.lock().unwrap().push(wait.error.clone());
    };
    let migrated = upgrading.migrate_reporting(&on_wait);
    let claimed = async {
        // The migration has asked for the table and waits behind the reader.
        db.wait_for_table_waiters(1).await;
        let claimed = store
            .claim(
                &EventId::new(PROVIDER, "evt_during_migration"),
                None,
                Duration::from_secs(30),
                None,
            )
            .await;
        reader.release().await;
        claimed
    };
    let (migrated, claimed) = futures_util::join!(migrated, claimed);
    assert!(
        matches!(claimed, Ok(hookgate::claim::ClaimResult::Won { .. })),
        "a claim beside a waiting migration: {claimed:?}"
    );
    migrated.expect("the migration applies once the reader is gone");
    let waits = waits.into_inner().unwrap();
    assert!(
        !waits.is_empty() && waits.iter().all(|w| w.contains("lock timeout")),
        "each wait reported: {waits:?}"
    );
    assert_eq!(db.migrations().await, db.all_migrations());
}

/// `/readyz` answers from a store check at most a second old: unauthenticated callers
/// cannot make it cost a store round trip each.
#[actix_web::test]
async fn readiness_costs_the_store_at_most_a_ping_a_second() {
    use std::sync::atomic::Ordering;
    let db = crate::helpers::TestDb::new().await;
    let target = crate::helpers::TestTarget::start().await;
    let config = crate::helpers::base_config(&db, &target);
    let store = std::sync::Arc::new(crate::helpers::FaultyStore::new(
        db.store_with(config.store.clone()).await,
    ));
    let delivery = std::sync::Arc::new(hookgate::worker::HttpDelivery);
    let app = crate::helpers::start_node_on(db, target, config, delivery, store.clone()).await;
    let started = std::time::Instant::now();
    let before = store.pings.load(Ordering::SeqCst);
    for _ in 0..50 {
        assert_eq!(app.get("/readyz").await.status, 200);
    }
    let pings = store.pings.load(Ordering::SeqCst) - before;
    let seconds = started.elapsed().as_secs() as usize;
    assert!(
        pings <= seconds + 1,
        "{pings} pings in {seconds} s for 50 calls"
    );
}

/// The families the shipped alerts and dashboard read are served from the first scrape,
/// whatever mode the providers are in.
#[actix_web::test]
async fn every_family_the_deploy_files_use_is_served_by_a_sync_only_node() {
    let app = spawn_app().await;
    let metrics = app.get("/metrics").await.body;
    for family in [
        r#"hookgate_queue_rows{provider="stripe"} 0"#,
        r#"hookgate_queue_oldest_due_seconds{provider="stripe"} 0"#,
        r#"hookgate_actor_panics_total{actor="shard"} 0"#,
    ] {
        assert!(metrics.contains(family), "missing {family} in\n{metrics}");
    }
}

#[actix_web::test]
async fn an_operator_reads_an_event_and_the_dead_letters() {
    let app = admin_app().await;
    dead_letter(&app, "evt_dl").await;
    let token = bearer(TOKEN);

    let event = app
        .get_with(&format!("/admin/events/{PROVIDER}/evt_dl"), &token)
        .await;
    assert_eq!(event.status, 200);
    let row: serde_json::Value = serde_json::from_str(&event.body).unwrap();
    assert_eq!(row["status"], "dead");
    assert_eq!(row["dead_reason"], "non_retryable");
    assert_eq!(row["payload"], r#"{"id":"x"}"#);
    assert_eq!(row["request_headers"]["x-idempotency-key"], "evt_dl");

    let list = app
        .get_with("/admin/dead?provider=stripe&limit=10", &token)
        .await;
    let list: serde_json::Value = serde_json::from_str(&list.body).unwrap();
    assert_eq!(list["dead"].as_array().map(Vec::len), Some(1));
    assert_eq!(list["dead"][0]["event_key"], "evt_dl");
}

#[actix_web::test]
async fn the_dead_letter_list_pages_by_cursor_and_refuses_a_forged_one() {
    let app = admin_app().await;
    for i in 0..5 {
        dead_letter(&app, &format!("evt_page{i}")).await;
    }
    let token = bearer(TOKEN);
    let mut keys = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let path = match &cursor {
            Some(c) => format!("/admin/dead?limit=2&cursor={c}"),
            None => "/admin/dead?limit=2".to_owned(),
        };
        let page: serde_json::Value =
            serde_json::from_str(&app.get_with(&path, &token).await.body).unwrap();
        let items = page["dead"].as_array().unwrap();
        keys.extend(
            items
                .iter()
                .map(|i| i["event_key"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    keys.sort();
    assert_eq!(
        keys,
        (0..5).map(|i| format!("evt_page{i}")).collect::<Vec<_>>()
    );
    let forged = app.get_with("/admin/dead?cursor=garbage", &token).await;
    assert_eq!(forged.status, 400);
    assert!(forged.body.contains("bad_cursor"), "{}", forged.body);
}

#[actix_web::test]
async fn twenty_parallel_replays_deliver_a_dead_letter_exactly_once() {
    let app = admin_app().await;
    dead_letter(&app, "evt_rp").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_rp")), 1);

    let token = bearer(TOKEN);
    let auth = [("Authorization", token.as_str())];
    let path = format!("/admin/dead/{PROVIDER}/evt_rp/replay");
    let answers = join_all((0..20).map(|_| app.post(&path, &auth, String::new()))).await;
    assert_eq!(app.target.count(&TestApp::idem("evt_rp")), 2, "{answers:?}");
    let replayed: Vec<_> = answers.iter().filter(|a| a.status == 200).collect();
    assert_eq!(replayed.len(), 1, "{answers:?}");
    let row: serde_json::Value = serde_json::from_str(&replayed[0].body).unwrap();
    assert_eq!(row["path"], "replay");
    assert_eq!(row["status"], "done");
    assert_eq!(row["attempts"], 2);
    assert!(answers
        .iter()
        .filter(|a| a.status != 200)
        .all(|a| a.status == 409 && a.body.contains("not_dead")));
    assert_eq!(
        app.target.last(&TestApp::idem("evt_rp")).attempt.as_deref(),
        Some("2")
    );

    // The sender's own redelivery now gets the replay's result, not the target.
    let again = app.deliver("evt_rp", r#"{"id":"x"}"#).await;
    assert_eq!(again.path, "duplicate_done");
    assert_eq!(again.status, 201);
    assert_eq!(app.target.count(&TestApp::idem("evt_rp")), 2);
}

#[actix_web::test]
async fn replaying_an_event_that_is_not_dead_is_refused_clearly() {
    let app = admin_app().await;
    let token = bearer(TOKEN);
    app.deliver("evt_ok", "{}").await;
    let done = app
        .post(
            &format!("/admin/dead/{PROVIDER}/evt_ok/replay"),
            &[("Authorization", &token)],
            String::new(),
        )
        .await;
    assert_eq!(done.status, 409);
    assert!(done.body.contains("done, not dead"), "{done:?}");
    let unknown = app
        .post(
            &format!("/admin/dead/{PROVIDER}/nope/replay"),
            &[("Authorization", &token)],
            String::new(),
        )
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(app.target.count(&TestApp::idem("evt_ok")), 1);
}

#[actix_web::test]
async fn a_failed_replay_is_dead_again_and_the_cli_replay_delivers_once() {
    let app = admin_app().await;
    dead_letter(&app, "evt_cli").await;
    let config = crate::helpers::base_config(&app.db, &app.target);
    let id = EventId::new(PROVIDER, "evt_cli");

    app.target.set(Behaviour::Status(503));
    let line = hookgate::cli::replay(&config, id.clone())
        .await
        .expect("replay ran");
    assert!(line.contains("dead again"), "{line}");
    let row = app.store.lookup(&id).await.unwrap().unwrap();
    assert_eq!(row.status.as_str(), "dead");
    assert_eq!(row.dead_reason.as_deref(), Some("replay_failed"));

    app.target.set(Behaviour::Accept);
    let line = hookgate::cli::replay(&config, id.clone())
        .await
        .expect("replay ran");
    assert!(line.contains("done"), "{line}");
    assert_eq!(
        app.store
            .lookup(&id)
            .await
            .unwrap()
            .unwrap()
            .status
            .as_str(),
        "done"
    );
    let err = hookgate::cli::replay(&config, id).await.unwrap_err();
    assert!(err.to_string().contains("not dead"), "{err}");
    assert_eq!(app.target.count(&TestApp::idem("evt_cli")), 3);
}

/// A sync dead letter replayed on a node where its provider now runs in queue mode, with a
/// target timeout longer than the lease (allowed there, since queue attempts renew their
/// lease): the replay starts, keeps its lease while the target holds it past the lease's
/// end — so the sender's redelivery meanwhile is told 409, not run again — and delivers
/// the event once.
#[actix_web::test]
async fn a_sync_dead_letter_replays_where_its_provider_now_queues_past_the_lease() {
    let app = admin_app().await;
    dead_letter(&app, "evt_mq").await;
    let node = app
        .second_node(|c| {
            c.admin.token = Some(Secret::new(TOKEN));
            c.providers[0].mode = Some(hookgate::claim::Mode::Queue);
            c.queue.poll_interval = Duration::from_secs(3600);
            c.lease.duration = Duration::from_secs(2);
            c.retry.base = Duration::from_secs(3);
            c.store.statement_timeout = Some(Duration::from_secs(1));
            c.providers[0].target.timeout = Duration::from_secs(30);
        })
        .await;
    let idem = TestApp::idem("evt_mq");
    app.target.set(Behaviour::Hang);

    let token = bearer(TOKEN);
    let path = format!("/admin/dead/{PROVIDER}/evt_mq/replay");
    let auth = [("Authorization", token.as_str())];
    let replay = node.post(&path, &auth, String::new());
    let meanwhile = async {
        eventually("the replay to reach the target", || async {
            app.target.count(&idem) == 2
        })
        .await;
        eventually("the replay to outlast its first lease", || async {
            app.db.lease_state(PROVIDER, "evt_mq").await.2 > 2.5
        })
        .await;
        let (status, attempts, _, lease_left) = app.db.lease_state(PROVIDER, "evt_mq").await;
        let again = app.deliver("evt_mq", r#"{"id":"x"}"#).await;
        app.target.release();
        (status, attempts, lease_left, again)
    };
    let (answer, (status, attempts, lease_left, again)) =
        futures_util::future::join(replay, meanwhile).await;
    assert_eq!((status.as_str(), attempts), ("in_progress", 2));
    assert!(lease_left > 0.0, "the lease was not renewed: {lease_left}");
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        app.db.status(PROVIDER, "evt_mq").await.as_deref(),
        Some("done")
    );
    assert_eq!(app.target.count(&idem), 2);
}

#[actix_web::test]
async fn the_sweeper_deletes_only_expired_rows() {
    let app = spawn_app().await;
    app.deliver("evt_keep", "{}").await;
    dead_letter(&app, "evt_dead").await;
    let mut retention = hookgate::config::RetentionConfig::default();
    let sweeper = |retention| {
        Sweeper::new(
            Arc::clone(&app.store),
            retention,
            Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
    };
    assert_eq!(
        sweeper(retention.clone()).run_once().await.unwrap(),
        SweepReport::default()
    );
    retention.done = Duration::ZERO;
    let report = sweeper(retention.clone()).run_once().await.unwrap();
    assert_eq!(report, SweepReport { done: 1, dead: 0 });
    retention.dead = Duration::ZERO;
    let report = sweeper(retention).run_once().await.unwrap();
    assert_eq!(report, SweepReport { done: 0, dead: 1 });
    assert_eq!(app.db.count_rows().await, 0);
}

/// A backlog of expired rows larger than any fixed number of batches a pass once allowed
/// (100 batches of `sweep_batch`) is removed by one pass, which then reports no backlog;
/// the backlog and the tables' sizes are metrics. The rows age with the store's clock (on
/// Postgres the ring's slot that took them ages too, as it would have had no pass run for
/// a week); a pass that cannot remove them shows how far behind it is.
async fn one_retention_pass_removes_a_backlog_of_any_size(backend: Backend) {
    // A store without a node: no sweeper of a node's own runs beside the test's passes.
    let db = TestDb::on(backend).await;
    let store = db.store().await;
    // Past retention (a week) and its last turn (a quarter more), where a ring keeps rows.
    let week = Duration::from_secs(10 * 24 * 3600);
    db.insert_done_rows(PROVIDER, "old_", 2_500, Duration::ZERO)
        .await;
    db.advance_clock(week).await;
    db.insert_done_rows(PROVIDER, "new_", 10, Duration::ZERO)
        .await;
    let retention = hookgate::config::RetentionConfig {
        sweep_batch: 10,
        ..hookgate::config::RetentionConfig::default()
    };
    let metrics = Arc::new(Metrics::new());
    let sweeper = Sweeper::new(
        Arc::clone(&store),
        retention.clone(),
        Arc::clone(&metrics),
        hookgate::logging::discard(),
    );
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(
        report,
        SweepReport {
            done: 2_500,
            dead: 0
        }
    );
    assert_eq!(db.count_rows().await, 10, "the rows inside retention stay");
    let text = metrics.render();
    assert!(
        text.contains("hookgate_retention_backlog_seconds 0.0"),
        "{text}"
    );
    let events = text
        .lines()
        .find(|l| l.starts_with("hookgate_table_bytes{table=\"webhook_events\"}"))
        .unwrap_or_else(|| panic!("{text}"));
    let bytes: u64 = events.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes > 0, "{events}");

    // Rows left past retention show as the backlog: on SQLite a pass with no time to
    // delete more than a row; on Postgres a pass whose truncation cannot have its lock (a
    // long report reads the table).
    db.insert_done_rows(PROVIDER, "late_", 5, Duration::ZERO)
        .await;
    db.advance_clock(week).await;
    let behind = hookgate::config::RetentionConfig {
        sweep_interval: Duration::ZERO,
        sweep_batch: 1,
        ..hookgate::config::RetentionConfig::default()
    };
    let sweeper = |retention| {
        Sweeper::new(
            Arc::clone(&store),
            retention,
            Arc::clone(&metrics),
            hookgate::logging::discard(),
        )
    };
    let reader = match backend {
        Backend::Postgres => Some(db.read_in_open_transaction("webhook_events").await),
        Backend::Sqlite => None,
    };
    sweeper(behind).run_once().await.unwrap();
    let backlog = || {
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with("hookgate_retention_backlog_seconds "))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .unwrap()
    };
    assert!(
        backlog() > 3600.0,
        "a day past retention shows: {}",
        backlog()
    );
    if let Some(reader) = reader {
        reader.release().await;
    }
    sweeper(retention).run_once().await.unwrap();
    assert_eq!(backlog(), 0.0, "caught up");
    assert_eq!(db.count_rows().await, 0, "every row was past retention");
}

#[actix_web::test]
async fn metrics_count_the_requests_made() {
    let app = spawn_app().await;
    for key in ["m1", "m2", "m3"] {
        app.deliver(key, "{}").await;
    }
    app.deliver("m1", "{}").await;
    app.deliver("m2", "{}").await;
    app.post("/webhooks/nobody", &[], "{}".into()).await;
    app.target.set(Behaviour::Status(500));
    app.deliver("m4", "{}").await;

    let text = app.get("/metrics").await.body;
    for line in [
        r#"hookgate_attempts_total{provider="stripe",path="first_run"} 4"#,
        r#"hookgate_attempts_total{provider="stripe",path="duplicate_done"} 2"#,
        r#"hookgate_rejected_total{provider="unknown",reason="unknown_provider"} 1"#,
        r#"hookgate_deliveries_total{provider="stripe",outcome="delivered"} 3"#,
        r#"hookgate_deliveries_total{provider="stripe",outcome="failed"} 1"#,
        r#"hookgate_delivery_seconds_count{provider="stripe"} 4"#,
        "hookgate_cache_hits_total 2",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

/// The schema of the last release (migrations 1 to 5, as their files say), with a dead
/// letter in it, upgrades: only the migrations after 5 are applied, each once, and the row
/// is listed as before.
async fn a_schema_of_the_last_release_upgrades_and_keeps_its_rows(backend: Backend) {
    let db = crate::helpers::TestDb::on(backend).await;
    let (files, now) = match backend {
        Backend::Postgres => (
            [
                include_str!("../../../src/store/postgres/migrations/0001_webhook_events.sql"),
                include_str!("../../../src/store/postgres/migrations/0002_request_headers.sql"),
                include_str!("../../../src/store/postgres/migrations/0003_queue.sql"),
                include_str!("../../../src/store/postgres/migrations/0004_throttles.sql"),
                include_str!("../../../src/store/postgres/migrations/0005_history.sql"),
            ],
            "now()",
        ),
        Backend::Sqlite => (
            [
                include_str!("../../../src/store/sqlite/migrations/0001_webhook_events.sql"),
                include_str!("../../../src/store/sqlite/migrations/0002_request_headers.sql"),
                include_str!("../../../src/store/sqlite/migrations/0003_queue.sql"),
                include_str!("../../../src/store/sqlite/migrations/0004_throttles.sql"),
                include_str!("../../../src/store/sqlite/migrations/0005_history.sql"),
            ],
            "unixepoch('subsec')",
        ),
    };
    if backend == Backend::Postgres {
        db.apply_sql(&format!("CREATE SCHEMA {}", db.schema)).await;
    }
    for sql in files {
        db.apply_sql(sql).await;
    }
    db.apply_sql(&format!(
        "CREATE TABLE hookgate_migrations (version integer PRIMARY KEY,
                                           applied_at {} NOT NULL DEFAULT ({now}));
         INSERT INTO hookgate_migrations (version) VALUES (1), (2), (3), (4), (5);
         INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                     dead_reason, created_at, updated_at)
         VALUES ('{PROVIDER}', 'evt_old', 'dead', 1, 'first_run', 'non_retryable', {now},
                 {now})",
        if backend == Backend::Postgres {
            "timestamptz"
        } else {
            "REAL"
        },
    ))
    .await;
    let store = db.store().await;
    store
        .migrate()
        .await
        .expect("a second migrate changes nothing");
    assert_eq!(db.migrations().await, db.all_migrations());
    let dead = store.dead_letters(Some(PROVIDER), None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id.key.as_ref(), "evt_old");
    let items = store.operator().job_items(1, 10).await.unwrap();
    assert!(items.is_empty(), "the new index serves a job's page");
}

on_both_stores!(
    a_schema_of_the_last_release_upgrades_and_keeps_its_rows,
    one_retention_pass_removes_a_backlog_of_any_size,
);
