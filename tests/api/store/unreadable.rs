//! Rows whose bodies do not open, on both stores: a queue row sealed by a key this node does
//! not have (dropped, or encryption turned off) or moved from another row is ended once as
//! an `unreadable` dead letter naming the key — counted, logged, never delivered, never
//! taken again — and replayed once the key is back; and `store.encryption.require_sealed`
//! refuses a plaintext body written into the table where a sealed one belongs, as
//! `check-config --rows` says when it can be turned on.

use std::time::Duration;

use hookgate::config::Config;
use hookgate::secret::Secret;

use crate::helpers::{
    bearer, eventually, queue_mode, seal_config, spawn_app_on, Backend, Behaviour, TestApp,
    PROVIDER,
};

const TOKEN: &str = "unreadable-admin-token";

/// Queue mode, the scheduler by hand, backoffs no test waits out, the admin API on.
fn queued(c: &mut Config) {
    queue_mode(c);
    c.retry.base = Duration::from_secs(600);
    c.retry.cap = Duration::from_secs(1200);
    c.admin.token = Some(Secret::new(TOKEN));
}

/// Queue events accepted on `app`, each one's first attempt (started at once, a worker
/// being idle) failed: `failed` rows, then made due now.
async fn failed_rows(app: &TestApp, keys: &[&str]) {
    app.target.set(Behaviour::Status(500));
    for key in keys {
        let answer = app.deliver(key, &format!(r#"{{"id":"{key}"}}"#)).await;
        assert_eq!(answer.status, 202, "{answer:?}");
        app.wait_ended(key, "failed", 1).await;
    }
    app.target.set(Behaviour::Accept);
    for key in keys {
        app.db.make_due(PROVIDER, key).await;
    }
}

/// Rows sealed by key `old`, taken by a node that has only `new` (a key dropped while
/// rows still needed it): each becomes an `unreadable` dead letter once — its error names
/// the key, the sealed-store errors count it, `webhook.dead` says so — and is never
/// delivered or taken again; its stored payload is left as it was, so a node with the key
/// replays it, once.
async fn a_queue_row_sealed_by_a_missing_key_is_an_unreadable_dead_letter_once(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queued(c);
        seal_config(c, &["old"], false);
    })
    .await;
    app.scheduler.by_hand().await;
    failed_rows(&app, &["evt_u1", "evt_u2"]).await;
    let node = app
        .second_node(|c| {
            queued(c);
            seal_config(c, &["new"], false);
        })
        .await;
    node.scheduler.by_hand().await;
    let before = app.target.total();
    eventually("the new node to take both rows", || async {
        node.scheduler.run_once().await.unwrap();
        let dead = node.log.events("webhook.dead", "evt_u1").len()
            + node.log.events("webhook.dead", "evt_u2").len();
        dead == 2
    })
    .await;
    for key in ["evt_u1", "evt_u2"] {
        node.wait_ended(key, "dead", 1).await;
        let row = node.db.ending(PROVIDER, key).await;
        assert_eq!(row.dead_reason.as_deref(), Some("unreadable"), "{row:?}");
        let error = row.last_error.unwrap_or_default();
        assert!(error.contains("\"old\""), "names the key it needs: {error}");
        let dead = node.log.events("webhook.dead", key);
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0]["reason"], "unreadable", "{dead:?}");
    }
    assert_eq!(app.target.total(), before, "nothing delivered");
    let sealed = node
        .metric("hookgate_store_errors_total{kind=\"sealed\"}")
        .await;
    assert_eq!(sealed, 2.0);
    let reason =
        r#"hookgate_dead_letters_total{provider="stripe",route="main",reason="unreadable"}"#;
    assert_eq!(node.metric(reason).await, 2.0);

    // Ended once: nothing is due, nothing more is tried.
    let attempts = node.db.ending(PROVIDER, "evt_u1").await.attempts;
    node.scheduler.run_once().await.unwrap();
    assert_eq!(node.db.ending(PROVIDER, "evt_u1").await.attempts, attempts);
    assert_eq!(node.log.events("webhook.dead", "evt_u1").len(), 1);

    // A node with the key replays it: delivered once.
    let replay = app
        .post(
            &format!("/admin/dead/{PROVIDER}/evt_u1/replay"),
            &[("Authorization", &bearer(TOKEN))],
            String::new(),
        )
        .await;
    assert_eq!(replay.status, 200, "{}", replay.body);
    app.wait_status("evt_u1", "done").await;
    assert_eq!(
        app.target.count(&TestApp::idem("evt_u1")),
        2,
        "failed, then delivered"
    );
}

/// A sealed payload copied from another row does not open where it now stands: its taker
/// ends it as an `unreadable` dead letter instead of leaving it leased, to be taken again
/// at every lease's end past `max_attempts`.
async fn a_queue_row_whose_payload_was_moved_is_ended_not_taken_forever(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queued(c);
        c.retry.max_attempts = 3;
        seal_config(c, &["k"], false);
    })
    .await;
    app.scheduler.by_hand().await;
    failed_rows(&app, &["evt_m1", "evt_m2"]).await;
    app.db.copy_payload(PROVIDER, "evt_m1", "evt_m2").await;
    eventually("both rows to be taken", || async {
        app.scheduler.run_once().await.unwrap();
        app.log.events("webhook.dead", "evt_m2").len() == 1
            && app.db.status(PROVIDER, "evt_m1").await.as_deref() == Some("done")
    })
    .await;
    app.wait_ended("evt_m2", "dead", 2).await;
    let row = app.db.ending(PROVIDER, "evt_m2").await;
    assert_eq!(row.dead_reason.as_deref(), Some("unreadable"));
    assert_eq!(
        row.attempts, 2,
        "one failure, then the take that found it unreadable"
    );
    app.wait_status("evt_m1", "done").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_m2")), 1);
}

/// Someone who can write the table but holds no key writes a payload in plain: with
/// `require_sealed` it is refused (an `unreadable` dead letter), never delivered; the
/// same write on a node without it is read as it stands (rows from before encryption was
/// on are), which is what the setting is for. `check-config --rows` says which.
async fn require_sealed_refuses_a_plaintext_body_written_into_the_table(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queued(c);
        seal_config(c, &["k"], true);
    })
    .await;
    app.scheduler.by_hand().await;
    failed_rows(&app, &["evt_p1"]).await;
    let injected = br#"{"id":"evt_p1","note":"INJECTED-BY-DB-WRITER"}"#;
    app.db.write_payload(PROVIDER, "evt_p1", injected).await;
    eventually("the row to be taken", || async {
        app.scheduler.run_once().await.unwrap();
        app.log.events("webhook.dead", "evt_p1").len() == 1
    })
    .await;
    app.wait_ended("evt_p1", "dead", 2).await;
    let row = app.db.ending(PROVIDER, "evt_p1").await;
    assert_eq!(row.dead_reason.as_deref(), Some("unreadable"));
    assert!(
        row.last_error.unwrap_or_default().contains("plaintext"),
        "says why"
    );
    let idem = TestApp::idem("evt_p1");
    assert_eq!(app.target.count(&idem), 1, "only the first, failed attempt");
    let last = String::from_utf8_lossy(&app.target.last(&idem).body).into_owned();
    assert!(
        !last.contains("INJECTED"),
        "the plaintext reached the target"
    );

    // `check-config --rows` counts the plaintext body and fails with the setting on.
    let out = app
        .run_cli_sealed(&["check-config", "--rows"], &["k"], true)
        .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("1 plaintext bodies would be refused"),
        "{text}"
    );
}

/// Without `require_sealed`, a plaintext body is read as it stands (the rows of a store
/// from before encryption was on): the same write is delivered. This is the behaviour the
/// setting exists to refuse.
async fn without_require_sealed_a_plaintext_body_is_read_as_it_stands(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        queued(c);
        seal_config(c, &["k"], false);
    })
    .await;
    app.scheduler.by_hand().await;
    failed_rows(&app, &["evt_p2"]).await;
    let plain = br#"{"id":"evt_p2","note":"PLAIN-FROM-BEFORE"}"#;
    app.db.write_payload(PROVIDER, "evt_p2", plain).await;
    eventually("the plaintext row to be delivered", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_p2").await.as_deref() == Some("done")
    })
    .await;
    let last = app.target.last(&TestApp::idem("evt_p2")).body;
    assert!(String::from_utf8_lossy(&last).contains("PLAIN-FROM-BEFORE"));
}

on_both_stores!(
    a_queue_row_sealed_by_a_missing_key_is_an_unreadable_dead_letter_once,
    a_queue_row_whose_payload_was_moved_is_ended_not_taken_forever,
    require_sealed_refuses_a_plaintext_body_written_into_the_table,
    without_require_sealed_a_plaintext_body_is_read_as_it_stands,
);
