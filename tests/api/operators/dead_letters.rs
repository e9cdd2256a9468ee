//! Dead letters for an operator: an event and the dead letters read, the list paged by
//! cursor, and a replay — by the admin API or the command line — that delivers once, is
//! refused for an event that is not dead, leaves a dead letter again when it fails, and
//! keeps its lease where the provider now queues.

use std::time::Duration;

use futures_util::future::join_all;
use hookgate::key::EventId;
use hookgate::secret::Secret;

use crate::helpers::{bearer, dead_letter};
use crate::helpers::{eventually, spawn_app_with, Behaviour, TestApp, PROVIDER};

const TOKEN: &str = "s3cret-admin-token";

async fn admin_app() -> TestApp {
    spawn_app_with(|c| c.admin.token = Some(Secret::new(TOKEN))).await
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
