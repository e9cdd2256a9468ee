//! Every path of docs/design.md's table is reached, answered as the table says, and labelled.

use crate::helpers::{spawn_app, spawn_app_with, Behaviour, TestApp, PROVIDER};

#[actix_web::test]
async fn a_first_delivery_runs_the_target_and_a_duplicate_replays_its_answer() {
    let app = spawn_app().await;

    let first = app.deliver("evt_1", r#"{"id":"evt_1"}"#).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.path, "first_run");
    assert_eq!(first.attempt, Some(1));
    assert_eq!(first.body, r#"{"received":"stripe:evt_1"}"#);

    let again = app.deliver("evt_1", r#"{"id":"evt_1"}"#).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.path, "duplicate_done");
    assert_eq!(again.attempt, Some(1));
    assert_eq!(again.body, first.body);
    assert_eq!(app.target.count(&TestApp::idem("evt_1")), 1);
}

#[actix_web::test]
async fn a_duplicate_is_replayed_from_the_row_when_the_cache_is_off() {
    let app = spawn_app_with(|c| c.cache.capacity = 0).await;
    app.deliver("evt_nc", "{}").await;
    let again = app.deliver("evt_nc", "{}").await;
    assert_eq!(again.path, "duplicate_done");
    assert_eq!(again.status, 201);
    assert_eq!(again.body, r#"{"received":"stripe:evt_nc"}"#);
    assert_eq!(app.target.count(&TestApp::idem("evt_nc")), 1);
}

#[actix_web::test]
async fn the_key_can_come_from_the_json_body() {
    let app = spawn_app().await;
    let answer = app
        .post(
            &format!("/webhooks/{PROVIDER}"),
            &[],
            r#"{"id":"evt_body"}"#.into(),
        )
        .await;
    assert_eq!(answer.path, "first_run");
    assert_eq!(app.target.count(&TestApp::idem("evt_body")), 1);
}

#[actix_web::test]
async fn a_failed_delivery_is_answered_503_and_the_next_one_retries() {
    let app = spawn_app().await;
    app.target.set(Behaviour::Status(500));
    let failed = app.deliver("evt_f", "{}").await;
    assert_eq!(failed.status, 503);
    assert_eq!(failed.path, "first_run");
    let retry_after = failed.retry_after.expect("Retry-After");
    assert!((36..=54).contains(&retry_after), "{retry_after}");
    assert_eq!(
        app.db.status(PROVIDER, "evt_f").await.as_deref(),
        Some("failed")
    );

    app.target.set(Behaviour::Accept);
    let retried = app.deliver("evt_f", "{}").await;
    assert_eq!(retried.status, 201);
    assert_eq!(retried.path, "retry_after_failure");
    assert_eq!(retried.attempt, Some(2));
    assert_eq!(app.target.count(&TestApp::idem("evt_f")), 2);
}

#[actix_web::test]
async fn a_key_held_by_a_live_attempt_is_answered_409_with_the_lease_left() {
    let app = spawn_app().await;
    app.target.set(Behaviour::Hang);
    let held = app.deliver("evt_h", "{}");
    let probe = async {
        app.target.wait_for(&TestApp::idem("evt_h"), 1).await;
        let busy = app.deliver("evt_h", "{}").await;
        app.target.release();
        busy
    };
    let (first, busy) = futures_util::join!(held, probe);
    assert_eq!(busy.status, 409);
    assert_eq!(busy.path, "in_progress_elsewhere");
    assert_eq!(busy.attempt, Some(1));
    let retry_after = busy.retry_after.expect("Retry-After");
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(first.status, 201);
    assert_eq!(first.path, "first_run");
    assert_eq!(app.target.count(&TestApp::idem("evt_h")), 1);
}

#[actix_web::test]
async fn the_same_key_with_another_payload_is_refused_422_and_not_delivered() {
    let app = spawn_app().await;
    app.deliver("evt_m", r#"{"amount":1}"#).await;
    let other = app.deliver("evt_m", r#"{"amount":2}"#).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.path, "payload_mismatch");
    assert_eq!(app.target.count(&TestApp::idem("evt_m")), 1);
}

#[actix_web::test]
async fn a_non_retryable_refusal_is_dead_lettered_and_duplicates_never_reach_the_target() {
    let app = spawn_app().await;
    app.target.set(Behaviour::Status(400));
    let dead = app.deliver("evt_d", "{}").await;
    assert_eq!(dead.status, 200);
    assert_eq!(dead.body, r#"{"status":"dead_lettered"}"#);
    assert_eq!(
        app.db.status(PROVIDER, "evt_d").await.as_deref(),
        Some("dead")
    );

    app.target.set(Behaviour::Accept);
    let again = app.deliver("evt_d", "{}").await;
    assert_eq!(again.status, 200);
    assert_eq!(again.path, "duplicate_dead");
    assert_eq!(again.body, r#"{"status":"dead_lettered"}"#);
    assert_eq!(app.target.count(&TestApp::idem("evt_d")), 1);
}

#[actix_web::test]
async fn the_last_allowed_attempt_makes_a_dead_letter() {
    let app = spawn_app_with(|c| c.retry.max_attempts = 2).await;
    app.target.set(Behaviour::Status(503));
    assert_eq!(app.deliver("evt_x", "{}").await.status, 503);
    let last = app.deliver("evt_x", "{}").await;
    assert_eq!(last.path, "retry_after_failure");
    assert_eq!(last.body, r#"{"status":"dead_lettered"}"#);
    let record = app
        .store
        .lookup(&hookgate::key::EventId::new(PROVIDER, "evt_x"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(record.dead_reason.as_deref(), Some("attempts_exhausted"));
    assert_eq!(record.payload.as_deref(), Some(&b"{}"[..]));
    assert_eq!(app.target.count(&TestApp::idem("evt_x")), 2);
}

#[actix_web::test]
async fn health_and_readiness_answer() {
    let app = spawn_app().await;
    assert_eq!(app.get("/healthz").await.status, 200);
    assert_eq!(app.get("/readyz").await.status, 200);
}

#[actix_web::test]
async fn the_target_receives_the_original_body_content_type_and_idempotency_headers() {
    let app = spawn_app().await;
    let body = r#"{ "id": "evt_hdr",  "amount": 12 }"#;
    app.target.set(Behaviour::Status(502));
    app.deliver("evt_hdr", body).await;
    let seen = app.target.last("stripe:evt_hdr");
    assert_eq!(seen.attempt.as_deref(), Some("1"));
    assert_eq!(seen.body, body.as_bytes());
    assert_eq!(seen.content_type.as_deref(), Some("application/json"));

    app.target.set(Behaviour::Accept);
    app.deliver("evt_hdr", body).await;
    assert_eq!(
        app.target.last("stripe:evt_hdr").attempt.as_deref(),
        Some("2")
    );
    assert_eq!(app.target.count("stripe:evt_hdr"), 2);
}
