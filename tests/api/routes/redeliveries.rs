//! A sender's redelivery is the same event, whatever its headers say: the routes an event
//! has are fixed by its first accepted delivery, recorded on the main route's row, and a
//! redelivery whose headers or body would pick other routes changes none of them — a failed
//! main route is retried, never closed as filtered; another body under the same key is 422
//! on every route; a route's failed row is retried by the scheduler whichever route a later
//! delivery would have picked. Each on both stores, with parallel redeliveries and a count
//! at every target.

use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::Mode;
use hookgate::config::Config;
use hookgate::filter::{Condition, Filter};

use super::{count, event, prefix, route, wait_row, Routes, CRM};
use crate::helpers::{spawn_app_on, Backend, Behaviour, TestApp, TestTarget, PROVIDER};

/// A filter on one header: present (`true`) or absent (`false`).
fn header(name: &str, present: bool) -> Filter {
    Filter {
        all: vec![Condition {
            header: Some(name.into()),
            exists: Some(present),
            ..Condition::default()
        }],
    }
}

/// A retry policy whose backoff no test waits out (the scheduler is driven by hand).
fn slow_retries(c: &mut Config) {
    c.retry.base = Duration::from_secs(600);
    c.retry.cap = Duration::from_secs(1200);
}

/// Delivers `body` under `key` with `headers` besides the key's.
async fn deliver_with(app: &TestApp, key: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut all = vec![("X-Idempotency-Key", key)];
    all.extend_from_slice(headers);
    let answer = app
        .post(&format!("/webhooks/{PROVIDER}"), &all, body.to_owned())
        .await;
    format!("{} {}", answer.status, answer.path)
}

/// Slack marks its retries with `X-Slack-Retry-Num`; the main route takes first deliveries
/// only. Its first delivery fails; the sender's retries carry the header, which the
/// filter refuses — they retry the main route anyway (its row says it has the event), in
/// parallel, and the target sees one failure and one success.
async fn a_retry_the_main_filter_refuses_retries_the_failed_main_route(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        c.providers[0].target.filter = Some(header("X-Slack-Retry-Num", false));
    })
    .await;
    app.target.set(Behaviour::Status(500));
    let body = event("evt_sr", "message");
    let first = deliver_with(&app, "evt_sr", &[], &body).await;
    assert_eq!(first, "503 first_run");
    app.wait_status("evt_sr", "failed").await;

    app.target.set(Behaviour::Accept);
    let retries =
        (0..8).map(|_| deliver_with(&app, "evt_sr", &[("X-Slack-Retry-Num", "1")], &body));
    let answers = join_all(retries).await;
    let won = answers
        .iter()
        .filter(|a| *a == "201 retry_after_failure")
        .count();
    assert_eq!(won, 1, "one retry wins and delivers: {answers:?}");
    for a in &answers {
        assert!(
            matches!(
                a.as_str(),
                "201 retry_after_failure" | "201 duplicate_done" | "409 in_progress_elsewhere"
            ),
            "{answers:?}"
        );
    }
    app.wait_status("evt_sr", "done").await;
    assert_eq!(count(&app.target, "evt_sr"), 2, "one failure, one success");
}

/// Main takes invoices, crm customers. A body under a known key is compared with the
/// event's, whichever route this body would pick: another body is 422 and reaches nobody,
/// in parallel too.
async fn another_body_under_a_known_key_is_refused_whatever_route_it_would_pick(backend: Backend) {
    let crm = TestTarget::start().await;
    let app = spawn_app_on(backend, |c| {
        let p = &mut c.providers[0];
        p.target.filter = Some(prefix("/type", "invoice."));
        p.routes.push(route(
            &p.target,
            "crm",
            &crm,
            Some(prefix("/type", "customer.")),
        ));
    })
    .await;
    let paid = r#"{"id":"K1","type":"invoice.paid","amount":100}"#;
    assert_eq!(deliver_with(&app, "K1", &[], paid).await, "201 first_run");
    let more = r#"{"id":"K1","type":"invoice.paid","amount":999}"#;
    assert_eq!(
        deliver_with(&app, "K1", &[], more).await,
        "422 payload_mismatch"
    );
    let other = r#"{"id":"K1","type":"customer.created","amount":999}"#;
    let answers = join_all((0..6).map(|_| deliver_with(&app, "K1", &[], other))).await;
    for a in &answers {
        assert_eq!(a, "422 payload_mismatch", "{answers:?}");
    }
    assert_eq!(count(&app.target, "K1"), 1);
    assert_eq!(crm.total(), 0, "crm never receives the other body");
    assert_eq!(app.db.status(CRM, "K1").await, None, "nor gets a row");
}

/// Main takes deliveries that carry `X-Main`; crm takes every event. The first delivery
/// (no header) fails at crm; a redelivery carrying `X-Main` changes nothing of the
/// event's routes: crm's failed row is retried by the scheduler, once delivered, and
/// main, which the event's first delivery did not pick, never receives it.
async fn a_failed_route_is_retried_whichever_route_a_redelivery_would_pick(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        slow_retries(c);
        let p = &mut c.providers[0];
        p.target.filter = Some(header("X-Main", true));
        p.routes.push(route(&p.target, "crm", &routes.crm, None));
    })
    .await;
    routes.crm.set(Behaviour::Status(500));
    let body = event("evt_sw", "invoice.paid");
    let first = deliver_with(&app, "evt_sw", &[], &body).await;
    assert!(first.starts_with("20"), "{first}");
    wait_row(&app, CRM, "evt_sw", "failed").await;

    routes.crm.set(Behaviour::Accept);
    let again =
        join_all((0..6).map(|_| deliver_with(&app, "evt_sw", &[("X-Main", "1")], &body))).await;
    for a in &again {
        assert!(a.ends_with("duplicate_done"), "{again:?}");
    }
    app.scheduler.by_hand().await;
    app.db.make_due(CRM, "evt_sw").await;
    app.scheduler.run_once().await.unwrap();
    wait_row(&app, CRM, "evt_sw", "done").await;
    assert_eq!(
        count(&routes.crm, "evt_sw"),
        2,
        "failed once, then delivered"
    );
    assert_eq!(app.target.total(), 0, "main never had the event");
}

/// The mirror: main takes deliveries without `X-Other`, crm only those with it. Main's
/// first delivery fails; redeliveries carrying `X-Other` retry main (not crm, which the
/// event does not have), and the sender's answer is main's.
async fn a_failed_main_route_is_retried_when_a_redelivery_would_pick_another(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        let p = &mut c.providers[0];
        p.target.filter = Some(header("X-Other", false));
        p.routes.push(route(
            &p.target,
            "crm",
            &routes.crm,
            Some(header("X-Other", true)),
        ));
    })
    .await;
    app.target.set(Behaviour::Status(500));
    let body = event("evt_sm", "invoice.paid");
    assert_eq!(
        deliver_with(&app, "evt_sm", &[], &body).await,
        "503 first_run"
    );
    app.wait_status("evt_sm", "failed").await;

    app.target.set(Behaviour::Accept);
    let again =
        join_all((0..6).map(|_| deliver_with(&app, "evt_sm", &[("X-Other", "1")], &body))).await;
    let won = again
        .iter()
        .filter(|a| *a == "201 retry_after_failure")
        .count();
    assert_eq!(won, 1, "{again:?}");
    app.wait_status("evt_sm", "done").await;
    assert_eq!(count(&app.target, "evt_sm"), 2);
    assert_eq!(routes.crm.total(), 0, "crm never had the event");
    assert_eq!(app.db.status(CRM, "evt_sm").await, None);
}

/// Queue mode: the routes are fixed by the first delivery as well. Main takes deliveries
/// without `X-Other`; a redelivery carrying it (main's filter refuses it) is a duplicate
/// of the queued event (202), never a new event for crm.
async fn a_queued_events_redelivery_keeps_its_routes(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        slow_retries(c);
        let p = &mut c.providers[0];
        p.mode = Some(Mode::Queue);
        p.target.filter = Some(header("X-Other", false));
        p.routes.push(route(
            &p.target,
            "crm",
            &routes.crm,
            Some(header("X-Other", true)),
        ));
    })
    .await;
    app.target.set(Behaviour::Status(500));
    let body = event("evt_sq", "invoice.paid");
    assert_eq!(deliver_with(&app, "evt_sq", &[], &body).await, "202 queued");
    app.wait_status("evt_sq", "failed").await;
    let again =
        join_all((0..6).map(|_| deliver_with(&app, "evt_sq", &[("X-Other", "1")], &body))).await;
    for a in &again {
        assert_eq!(a, "202 duplicate_queued", "{again:?}");
    }
    assert_eq!(routes.crm.total(), 0);
    assert_eq!(app.db.status(CRM, "evt_sq").await, None);
    assert_eq!(count(&app.target, "evt_sq"), 1);
}

on_both_stores!(
    a_retry_the_main_filter_refuses_retries_the_failed_main_route,
    another_body_under_a_known_key_is_refused_whatever_route_it_would_pick,
    a_failed_route_is_retried_whichever_route_a_redelivery_would_pick,
    a_failed_main_route_is_retried_when_a_redelivery_would_pick_another,
    a_queued_events_redelivery_keeps_its_routes,
);
