//! Bad input gets a clear JSON error and claims nothing.

use awc::http::Method;

use hookgate::secret::Secret;

use crate::helpers::{spawn_app, spawn_app_with, TestApp, PROVIDER};

#[actix_web::test]
async fn every_bad_request_is_refused_with_its_code_and_nothing_is_claimed() {
    let app = spawn_app_with(|c| c.server.max_body_bytes = 64).await;
    let hook = format!("/webhooks/{PROVIDER}");
    let long_key = "k".repeat(256);
    let cases = [
        Case::new(
            "unknown provider",
            "/webhooks/nobody",
            "{}",
            404,
            "unknown_provider",
        ),
        Case::new(
            "body over the limit",
            &hook,
            &format!(r#"{{"id":"{}"}}"#, "x".repeat(100)),
            413,
            "body_too_large",
        ),
        Case::new("not JSON", &hook, "not json", 400, "invalid_json"),
        Case::new("no key", &hook, r#"{"other":1}"#, 400, "missing_key"),
        Case::new("key too long", &hook, "{}", 400, "invalid_key").header(&long_key),
        Case::new(
            "control character",
            &hook,
            r#"{"id":"a\u0001b"}"#,
            400,
            "invalid_key",
        ),
        Case::new("empty key", &hook, r#"{"id":""}"#, 400, "invalid_key"),
    ];
    for case in cases {
        let headers: Vec<(&str, &str)> = case
            .key_header
            .iter()
            .map(|k| ("X-Idempotency-Key", k.as_str()))
            .collect();
        let answer = app.post(&case.path, &headers, case.body.clone()).await;
        assert_eq!(answer.status, case.status, "{}: {answer:?}", case.what);
        let json: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON error");
        assert_eq!(json["error"], case.code, "{}", case.what);
        assert!(
            json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            case.what
        );
    }
    assert_eq!(app.db.count_rows().await, 0);
    assert_eq!(app.target.total(), 0);
}

#[actix_web::test]
async fn a_wrong_method_is_405_and_an_unknown_route_404() {
    let app = spawn_app().await;
    let get = app
        .request(Method::GET, &format!("/webhooks/{PROVIDER}"))
        .await;
    assert_eq!(get.status, 405);
    assert!(get.body.contains("method_not_allowed"));
    assert_eq!(app.request(Method::GET, "/nowhere").await.status, 404);
    assert_eq!(app.db.count_rows().await, 0);
}

struct Case {
    what: &'static str,
    path: String,
    body: String,
    key_header: Option<String>,
    status: u16,
    code: &'static str,
}

impl Case {
    fn new(what: &'static str, path: &str, body: &str, status: u16, code: &'static str) -> Self {
        Self {
            what,
            path: path.to_owned(),
            body: body.to_owned(),
            key_header: None,
            status,
            code,
        }
    }

    fn header(mut self, key: &str) -> Self {
        self.key_header = Some(key.to_owned());
        self
    }
}

#[actix_web::test]
async fn random_provider_names_never_grow_the_metrics() {
    let app = spawn_app().await;
    let before = app.get("/metrics").await.body.len();
    for i in 0..200 {
        let name = format!("/webhooks/random{i}x{}", fastrand::u32(..));
        assert_eq!(app.post(&name, &[], "{}".into()).await.status, 404);
    }
    let text = app.get("/metrics").await.body;
    assert!(
        !text.contains("random"),
        "an unconfigured name became a label"
    );
    assert!(
        text.contains(
            r#"hookgate_rejected_total{provider="unknown",reason="unknown_provider"} 200"#
        ),
        "{text}"
    );
    assert!(text.len() < before + 2048, "{} -> {}", before, text.len());
}

/// The provider segment of an unknown `/webhooks/<name>` is the unauthenticated caller's
/// own text: it never reaches a log line at the default level (a `%0A` would forge a line
/// in the text format, a 20 KB name would make a 20 KB line).
#[actix_web::test]
async fn an_unknown_provider_name_never_reaches_the_log() {
    let app = spawn_app().await;
    let forged = "/webhooks/x%0A%7B%22msg%22:%22webhook.done%22%7D";
    assert_eq!(app.post(forged, &[], "{}".into()).await.status, 404);
    let long = format!("/webhooks/{}", "n".repeat(20_000));
    let answer = app.post(&long, &[], "{}".into()).await;
    assert_eq!(answer.status, 404);
    assert!(
        answer.body.len() < 1024,
        "{} bytes answered",
        answer.body.len()
    );
    let rejected: Vec<_> = app
        .log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "webhook.rejected")
        .collect();
    assert_eq!(rejected.len(), 2, "{rejected:?}");
    for line in &rejected {
        assert_eq!(line["provider"], "unknown", "{line}");
        assert!(line.to_string().len() < 1024, "{line}");
    }
}

/// A misspelled field anywhere the admin API takes JSON or a query — a bulk replay's filter
/// above all, where an ignored field would widen the job to every dead letter — is a 400
/// naming the field, and nothing is planned, started or listed.
#[actix_web::test]
async fn a_misspelled_admin_field_is_refused_and_starts_nothing() {
    let app = spawn_app_with(|c| c.admin.token = Some(Secret::new("bad-input-token"))).await;
    let auth = [("Authorization", "Bearer bad-input-token")];
    app.target.set(crate::helpers::Behaviour::Status(400));
    assert_eq!(app.deliver("evt_dead", "{}").await.status, 200);
    let bodies = [
        r#"{"filter":{"provder":"nobody"}}"#,
        r#"{"filtr":{"provider":"nobody"}}"#,
        r#"{"filter":{},"rate":1,"extra":true}"#,
    ];
    for path in ["/admin/api/replays/plan", "/admin/api/replays"] {
        for body in bodies {
            let answer = app.post(path, &auth, body.to_owned()).await;
            assert_eq!(answer.status, 400, "{path} {body}: {answer:?}");
            assert!(answer.body.contains("invalid_json"), "{}", answer.body);
            assert!(answer.body.contains("unknown field"), "{}", answer.body);
        }
    }
    let jobs = app
        .get_with("/admin/api/replays", "Bearer bad-input-token")
        .await;
    assert_eq!(jobs.body, r#"{"jobs":[]}"#, "a job was started");
    for path in [
        "/admin/api/events?provder=nobody",
        "/admin/dead?provder=nobody",
        "/admin/api/event?provider=stripe&key=evt_dead&limt=1",
        "/admin/api/events/stripe/evt_dead?limt=1",
        "/admin/events/stripe/evt_dead?limt=1",
    ] {
        let answer = app.get_with(path, "Bearer bad-input-token").await;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert!(answer.body.contains("bad_query"), "{}", answer.body);
    }
    for path in [
        "/admin/api/event/replay?provider=stripe&key=evt_dead&force=1",
        "/admin/api/events/stripe/evt_dead/replay?force=1",
    ] {
        let answer = app.post(path, &auth, String::new()).await;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
    }
    assert_eq!(app.target.count(&TestApp::idem("evt_dead")), 1, "replayed");
}
