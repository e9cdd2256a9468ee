//! Traces an OpenTelemetry backend can read: the sender's W3C trace continued through the
//! request, each attempt and its claim, delivery and outcome write, and on to the
//! application; a queued event's every attempt in the trace of the request that accepted
//! it; log lines carrying their span's ids; an exporter that hangs or is refused costing
//! requests nothing; a sender's context linked instead when it is not trusted; the command
//! line's replay traced. The collector decodes the real OTLP/HTTP protobuf.

use std::time::Duration;

use hookgate::config::Config;
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, Span, SpanFlags};

use hookgate::secret::Secret;

use crate::helpers::{
    attr, bearer, dead_letter, eventually, queue_mode, spawn_app_on, spawn_app_with, Answering,
    Backend, Behaviour, Collector, TestApp, PROVIDER,
};

const SENDER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

fn traced(collector: &Collector) -> impl FnOnce(&mut Config) + '_ {
    move |c| {
        c.tracing.endpoint = Some(collector.url.clone());
        c.tracing.flush_interval = Duration::from_millis(20);
    }
}

fn sender_traceparent() -> String {
    format!("00-{SENDER_TRACE}-{SENDER_SPAN}-01")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `key` delivered with the sender's sampled `traceparent`.
async fn deliver_in_senders_trace(app: &TestApp, key: &str) -> crate::helpers::Answer {
    let parent = sender_traceparent();
    let headers = [("X-Idempotency-Key", key), ("traceparent", parent.as_str())];
    app.post(&format!("/webhooks/{PROVIDER}"), &headers, "{}".into())
        .await
}

/// The spans named `name` of `key`'s trace(s), in start order.
fn named<'a>(spans: &'a [Span], name: &str, key: &str) -> Vec<&'a Span> {
    let mut found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == name && attr(s, "hookgate.event_key").as_deref() == Some(key))
        .collect();
    found.sort_by_key(|s| s.start_time_unix_nano);
    found
}

/// The children of `parent`, by name.
fn child<'a>(spans: &'a [Span], parent: &Span, name: &str) -> &'a Span {
    let children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.name == name)
        .collect();
    assert_eq!(
        children.len(),
        1,
        "one {name} under {}: {spans:#?}",
        parent.name
    );
    children[0]
}

/// `traceparent` as the target received it: (trace id, parent span id, flags).
fn parts(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "{traceparent}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

/// A sender's sampled trace is continued: the request's span is its child, the attempt
/// the request's, the claim, delivery and outcome write the attempt's; the application
/// receives a `traceparent` whose parent is the delivery's span; the attempt's log lines
/// carry its ids.
#[actix_web::test]
async fn a_first_run_is_one_trace_from_the_sender_to_the_application() {
    let collector = Collector::start(Answering::Accept).await;
    let app = spawn_app_with(traced(&collector)).await;
    let answer = app
        .post(
            &format!("/webhooks/{PROVIDER}"),
            &[
                ("X-Idempotency-Key", "evt_t1"),
                ("traceparent", &sender_traceparent()),
                ("tracestate", "vendor=opaque"),
            ],
            "{}".into(),
        )
        .await;
    assert_eq!((answer.status, answer.path.as_str()), (201, "first_run"));
    let spans = collector.wait_for("attempt", "evt_t1", 1).await;
    let request = eventually_request(&collector, "evt_t1").await;
    let spans = if spans.contains(&request) {
        spans
    } else {
        collector.spans()
    };

    assert_eq!(hex(&request.trace_id), SENDER_TRACE);
    assert_eq!(hex(&request.parent_span_id), SENDER_SPAN);
    assert_eq!(request.kind, SpanKind::Server as i32);
    assert_eq!(request.trace_state, "vendor=opaque");
    assert_eq!(
        attr(&request, "hookgate.path").as_deref(),
        Some("first_run")
    );
    assert_eq!(
        attr(&request, "http.response.status_code").as_deref(),
        Some("201")
    );
    assert_eq!(
        attr(&request, "hookgate.provider").as_deref(),
        Some(PROVIDER)
    );

    let attempt = named(&spans, "attempt", "evt_t1")[0];
    assert_eq!(attempt.trace_id, request.trace_id);
    assert_eq!(attempt.parent_span_id, request.span_id);
    for (key, value) in [
        ("hookgate.provider", PROVIDER),
        ("hookgate.path", "first_run"),
        ("hookgate.attempt", "1"),
        ("hookgate.outcome", "delivered"),
        ("http.response.status_code", "201"),
        ("hookgate.mode", "sync"),
    ] {
        assert_eq!(
            attr(attempt, key).as_deref(),
            Some(value),
            "{key}: {attempt:#?}"
        );
    }
    let claim = child(&spans, attempt, "claim");
    let deliver = child(&spans, attempt, "deliver");
    let record = child(&spans, attempt, "record");
    assert_eq!(deliver.kind, SpanKind::Client as i32);
    assert_eq!(attr(record, "hookgate.written").as_deref(), Some("applied"));
    assert!(claim.end_time_unix_nano <= deliver.start_time_unix_nano);
    assert!(deliver.end_time_unix_nano <= record.end_time_unix_nano);
    assert!(attempt.start_time_unix_nano <= claim.start_time_unix_nano);

    // The application's own spans join the trace under the delivery.
    let received = app.target.traceparents(&TestApp::idem("evt_t1"));
    assert_eq!(received.len(), 1);
    let (trace, parent, flags) = parts(&received[0]);
    assert_eq!((trace.as_str(), flags.as_str()), (SENDER_TRACE, "01"));
    assert_eq!(parent, hex(&deliver.span_id));

    // Its log lines carry the attempt's ids; no payload reaches a span.
    for msg in ["webhook.claim", "webhook.done"] {
        let lines = app.log.events(msg, "evt_t1");
        assert_eq!(lines.len(), 1, "{msg}");
        assert_eq!(lines[0]["trace_id"], SENDER_TRACE, "{msg}");
        assert_eq!(lines[0]["span_id"], hex(&attempt.span_id), "{msg}");
    }
    assert_eq!(collector.service().as_deref(), Some("hookgate"));
}

/// The request span of `key`, once exported (it ends after the attempt's).
async fn eventually_request(collector: &Collector, key: &str) -> Span {
    let name = "POST /webhooks/{provider}";
    collector.wait_for(name, key, 1).await;
    named(&collector.spans(), name, key)[0].clone()
}

/// A failed first run, the sender's retry and its duplicate: each request its own trace
/// (no `traceparent` sent: a new one each), the failure's attempt marked failed with the
/// target's status, the retry's attempt `retry_after_failure` number 2, and the duplicate
/// a request span alone, labelled with its path.
#[actix_web::test]
async fn a_retry_after_failure_and_a_duplicate_each_tell_their_path() {
    let collector = Collector::start(Answering::Accept).await;
    let app = spawn_app_with(traced(&collector)).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_t2", "{}").await.status, 503);
    app.target.set(Behaviour::Accept);
    let retry = app.deliver("evt_t2", "{}").await;
    assert_eq!(
        (retry.status, retry.path.as_str()),
        (201, "retry_after_failure")
    );
    let duplicate = app.deliver("evt_t2", "{}").await;
    assert_eq!(duplicate.path, "duplicate_done");

    let name = "POST /webhooks/{provider}";
    collector.wait_for(name, "evt_t2", 3).await;
    let spans = collector.wait_for("attempt", "evt_t2", 2).await;
    let requests = named(&spans, name, "evt_t2");
    let attempts = named(&spans, "attempt", "evt_t2");
    assert_eq!((requests.len(), attempts.len()), (3, 2));
    let paths: Vec<_> = requests
        .iter()
        .map(|r| attr(r, "hookgate.path").unwrap_or_default())
        .collect();
    assert_eq!(
        paths,
        ["first_run", "retry_after_failure", "duplicate_done"]
    );
    for r in &requests {
        assert!(r.parent_span_id.is_empty(), "a new trace: {r:#?}");
    }
    assert_ne!(requests[0].trace_id, requests[1].trace_id);

    let failed = attempts[0];
    assert_eq!(failed.parent_span_id, requests[0].span_id);
    assert_eq!(attr(failed, "hookgate.outcome").as_deref(), Some("failed"));
    assert_eq!(
        attr(failed, "http.response.status_code").as_deref(),
        Some("500")
    );
    assert!(
        attr(failed, "hookgate.retry_delay_s").is_some(),
        "{failed:#?}"
    );
    assert_eq!(failed.status.as_ref().map(|s| s.code), Some(2), "ERROR");
    let retried = attempts[1];
    assert_eq!(retried.parent_span_id, requests[1].span_id);
    assert_eq!(
        attr(retried, "hookgate.path").as_deref(),
        Some("retry_after_failure")
    );
    assert_eq!(attr(retried, "hookgate.attempt").as_deref(), Some("2"));
    assert_eq!(
        attr(retried, "hookgate.outcome").as_deref(),
        Some("delivered")
    );
    // The duplicate ran no attempt: nothing in its trace but its request.
    let in_duplicate = spans.iter().filter(|s| s.trace_id == requests[2].trace_id);
    assert_eq!(in_duplicate.count(), 1);
}

/// A queued event delivered on its third try is one story: every attempt a child of the
/// request that accepted it (its context kept with the row), each delivery's
/// `traceparent` naming that attempt's delivery span.
async fn a_queued_event_is_one_trace_to_its_third_try(backend: Backend) {
    queued_event_in_one_trace(backend, false).await;
}

/// The same with the store sealing what it keeps: the trace context is kept in the sealed
/// request headers, and each attempt still continues it.
async fn a_sealed_queued_event_is_one_trace_to_its_third_try(backend: Backend) {
    queued_event_in_one_trace(backend, true).await;
}

async fn queued_event_in_one_trace(backend: Backend, sealed: bool) {
    let collector = Collector::start(Answering::Accept).await;
    let app = spawn_app_on(backend, |c| {
        queue_mode(c);
        traced(&collector)(c);
        if sealed {
            c.store.encryption.keys = vec![hookgate::config::KeyConfig {
                id: "trace".into(),
                env: "HOOKGATE_TEST_KEY_trace".into(),
            }];
            c.store.encryption.keyring = Some(crate::helpers::keyring(&["trace"]));
        }
    })
    .await;
    app.scheduler.by_hand().await;
    app.target.set(Behaviour::Status(500));
    let answer = deliver_in_senders_trace(&app, "evt_t3").await;
    assert_eq!(answer.status, 202);
    for tries in 1..=2 {
        app.wait_ended("evt_t3", "failed", tries).await;
        if tries == 2 {
            app.target.set(Behaviour::Accept);
        }
        app.db.make_due(PROVIDER, "evt_t3").await;
        eventually("the scheduler to take it again", || async {
            app.scheduler.run_once().await.unwrap().taken == 1
        })
        .await;
    }
    app.wait_ended("evt_t3", "done", 3).await;

    let request = eventually_request(&collector, "evt_t3").await;
    let spans = collector.wait_for("attempt", "evt_t3", 3).await;
    assert_eq!(hex(&request.trace_id), SENDER_TRACE);
    assert_eq!(attr(&request, "hookgate.path").as_deref(), Some("queued"));
    let attempts = named(&spans, "attempt", "evt_t3");
    assert_eq!(attempts.len(), 3);
    let received = app.target.traceparents(&TestApp::idem("evt_t3"));
    assert_eq!(received.len(), 3);
    let expected = [
        ("first_run", "failed"),
        ("retry_after_failure", "failed"),
        ("retry_after_failure", "delivered"),
    ];
    for (i, (attempt, (path, outcome))) in attempts.iter().zip(expected).enumerate() {
        assert_eq!(attempt.trace_id, request.trace_id, "try {}", i + 1);
        assert_eq!(attempt.parent_span_id, request.span_id, "try {}", i + 1);
        assert_eq!(attr(attempt, "hookgate.attempt"), Some((i + 1).to_string()));
        assert_eq!(attr(attempt, "hookgate.path").as_deref(), Some(path));
        assert_eq!(attr(attempt, "hookgate.outcome").as_deref(), Some(outcome));
        assert_eq!(attr(attempt, "hookgate.mode").as_deref(), Some("queue"));
        let deliver = child(&spans, attempt, "deliver");
        let (trace, parent, _) = parts(&received[i]);
        assert_eq!(
            (trace.as_str(), parent),
            (SENDER_TRACE, hex(&deliver.span_id))
        );
    }
}

on_both_stores!(
    a_queued_event_is_one_trace_to_its_third_try,
    a_sealed_queued_event_is_one_trace_to_its_third_try,
);

/// The value of the `hookgate_trace_spans_total` series for `outcome`.
async fn spans_counted(app: &TestApp, outcome: &str) -> u64 {
    let metrics = app.get("/metrics").await.body;
    let series = format!("hookgate_trace_spans_total{{outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
}

/// A collector that never answers: the exporter's one request hangs, its queue fills, and
/// every span past it is dropped and counted — while every event is answered and
/// delivered once. One that refuses: its spans are counted failed.
#[actix_web::test]
async fn a_collector_that_hangs_or_refuses_costs_requests_nothing() {
    for (answering, counted) in [(Answering::Hang, "dropped"), (Answering::Refuse, "failed")] {
        let collector = Collector::start(answering).await;
        let app = spawn_app_with(|c| {
            traced(&collector)(c);
            c.tracing.queue_size = 4;
            c.tracing.batch_size = 2;
            c.tracing.timeout = Duration::from_secs(60);
        })
        .await;
        let keys: Vec<String> = (0..30).map(|i| format!("evt_h{i}")).collect();
        let answers =
            futures_util::future::join_all(keys.iter().map(|k| app.deliver(k, "{}"))).await;
        for (key, answer) in keys.iter().zip(&answers) {
            assert_eq!(
                (answer.status, answer.path.as_str()),
                (201, "first_run"),
                "{key}"
            );
            assert_eq!(app.target.count(&TestApp::idem(key)), 1, "{key}");
        }
        eventually(&format!("spans counted {counted}"), || async {
            spans_counted(&app, counted).await > 0
        })
        .await;
        eventually("an export to reach the collector", || async {
            collector.requests() >= 1
        })
        .await;
        assert_eq!(spans_counted(&app, "exported").await, 0, "{answering:?}");
    }
}

/// A collector that takes an export in part (200, `partial_success.rejected_spans` > 0):
/// the spans it rejected are counted failed, not exported.
#[actix_web::test]
async fn spans_a_collector_rejects_in_a_partial_success_are_counted_failed() {
    let collector = Collector::start(Answering::RejectOne).await;
    let app = spawn_app_with(traced(&collector)).await;
    assert_eq!(app.deliver("evt_t13", "{}").await.status, 201);
    // A first run's five spans: the request, the attempt, its claim, delivery and record.
    eventually("the five spans counted", || async {
        spans_counted(&app, "exported").await + spans_counted(&app, "failed").await >= 5
    })
    .await;
    let requests = collector.requests() as u64;
    assert!(requests >= 1);
    assert_eq!(
        spans_counted(&app, "failed").await,
        requests,
        "one a request"
    );
    assert_eq!(
        spans_counted(&app, "exported").await,
        collector.spans().len() as u64
    );
    assert_eq!(spans_counted(&app, "exported").await + requests, 5);
}

/// A node's stop sends the spans still waiting for their batch: with a minute's
/// `flush_interval`, the spans of a delivered event are only exported by the stop.
#[actix_web::test]
async fn a_stop_sends_the_spans_still_waiting() {
    let collector = Collector::start(Answering::Accept).await;
    let mut app = spawn_app_with(|c| {
        traced(&collector)(c);
        c.tracing.flush_interval = Duration::from_secs(60);
    })
    .await;
    assert_eq!(app.deliver("evt_t4", "{}").await.status, 201);
    assert!(
        collector.spans().is_empty(),
        "the batch waits for its minute"
    );
    app.shutdown().await;
    let spans = collector.spans();
    assert_eq!(named(&spans, "attempt", "evt_t4").len(), 1, "{spans:#?}");
    let request = named(&spans, "POST /webhooks/{provider}", "evt_t4");
    assert_eq!(request.len(), 1, "{spans:#?}");
}

/// A sender's trace flagged not sampled: nothing is exported, and the application still
/// gets the trace, flagged so, with the sender's span as its parent. A request refused
/// before any claim is not recorded past the ratio however its `traceparent` is flagged
/// (anyone can send one); an accepted one keeps its sender's decision.
#[actix_web::test]
async fn sampling_follows_the_sender_except_for_requests_refused_before_a_claim() {
    let collector = Collector::start(Answering::Accept).await;
    let mut app = spawn_app_with(|c| {
        traced(&collector)(c);
        c.tracing.sampling_ratio = 0.0;
    })
    .await;
    let unsampled = format!("00-{SENDER_TRACE}-{SENDER_SPAN}-00");
    let sampled = sender_traceparent();
    let post = |path: String, key: &'static str, parent: String| {
        let app = &app;
        async move {
            let headers = [("X-Idempotency-Key", key), ("traceparent", parent.as_str())];
            app.post(&path, &headers, "{}".into()).await.status
        }
    };
    let webhooks = format!("/webhooks/{PROVIDER}");
    assert_eq!(post(webhooks.clone(), "evt_t5", unsampled).await, 201);
    assert_eq!(post(webhooks, "evt_t6", sampled.clone()).await, 201);
    assert_eq!(
        post("/webhooks/nobody".into(), "evt_t7", sampled).await,
        404
    );
    let received = app.target.traceparents(&TestApp::idem("evt_t5"));
    assert_eq!(received.len(), 1);
    let (trace, parent, flags) = parts(&received[0]);
    assert_eq!(
        (trace.as_str(), parent.as_str(), flags.as_str()),
        (SENDER_TRACE, SENDER_SPAN, "00")
    );

    app.shutdown().await;
    let spans = collector.spans();
    assert!(named(&spans, "attempt", "evt_t5").is_empty(), "{spans:#?}");
    assert_eq!(
        named(&spans, "attempt", "evt_t6").len(),
        1,
        "the sender's decision"
    );
    let refused = spans
        .iter()
        .filter(|s| attr(s, "hookgate.rejected").is_some());
    assert_eq!(refused.count(), 0, "{spans:#?}");
}

/// A sender cannot steer the sampling of its refused requests with the trace id it picks:
/// an id whose last 8 bytes are zero falls below any ratio's bound for ids, yet at one in a
/// billion none of twenty refused requests carrying it is recorded — while an accepted
/// request in that trace keeps its sender's decision (so the export did work).
#[actix_web::test]
async fn a_senders_chosen_trace_id_does_not_get_its_refused_requests_recorded() {
    let collector = Collector::start(Answering::Accept).await;
    let mut app = spawn_app_with(|c| {
        traced(&collector)(c);
        c.tracing.sampling_ratio = 1e-9;
    })
    .await;
    let steering = format!("00-deadbeefdeadbeef0000000000000000-{SENDER_SPAN}-01");
    for i in 0..20 {
        let key = format!("evt_r{i}");
        let headers = [
            ("X-Idempotency-Key", key.as_str()),
            ("traceparent", steering.as_str()),
        ];
        let answer = app.post("/webhooks/nobody", &headers, "{}".into()).await;
        assert_eq!(answer.status, 404, "{key}");
    }
    let headers = [("X-Idempotency-Key", "evt_t10"), ("traceparent", &steering)];
    let accepted = app
        .post(&format!("/webhooks/{PROVIDER}"), &headers, "{}".into())
        .await;
    assert_eq!(accepted.status, 201);
    app.shutdown().await;
    let spans = collector.spans();
    assert_eq!(named(&spans, "attempt", "evt_t10").len(), 1, "{spans:#?}");
    let refused = spans
        .iter()
        .filter(|s| attr(s, "hookgate.rejected").is_some());
    assert_eq!(refused.count(), 0, "{spans:#?}");
}

/// `tracing.trust_incoming = false`: a sender's context is linked, not continued. The
/// request starts a trace of hookgate's own, its span linked to the sender's (with its
/// `tracestate`, flagged remote), the attempt its child, and the application receives
/// hookgate's trace under the delivery span.
#[actix_web::test]
async fn an_untrusted_senders_context_is_linked_and_the_application_gets_hookgates_trace() {
    let collector = Collector::start(Answering::Accept).await;
    let app = spawn_app_with(|c| {
        traced(&collector)(c);
        c.tracing.trust_incoming = false;
    })
    .await;
    let answer = app
        .post(
            &format!("/webhooks/{PROVIDER}"),
            &[
                ("X-Idempotency-Key", "evt_t11"),
                ("traceparent", &sender_traceparent()),
                ("tracestate", "vendor=opaque"),
            ],
            "{}".into(),
        )
        .await;
    assert_eq!(answer.status, 201);
    let request = eventually_request(&collector, "evt_t11").await;
    let spans = collector.wait_for("attempt", "evt_t11", 1).await;
    assert_ne!(hex(&request.trace_id), SENDER_TRACE, "{request:#?}");
    assert!(request.parent_span_id.is_empty(), "a root: {request:#?}");
    assert_eq!(request.trace_state, "", "nothing continued from outside");
    assert_eq!(request.links.len(), 1, "{request:#?}");
    let link = &request.links[0];
    assert_eq!(
        (hex(&link.trace_id), hex(&link.span_id)),
        (SENDER_TRACE.to_owned(), SENDER_SPAN.to_owned())
    );
    assert_eq!(link.trace_state, "vendor=opaque");
    let remote = SpanFlags::ContextHasIsRemoteMask as u32 | SpanFlags::ContextIsRemoteMask as u32;
    assert_eq!(link.flags, remote | 1, "sampled, remote");

    let attempt = named(&spans, "attempt", "evt_t11")[0];
    assert_eq!(attempt.trace_id, request.trace_id);
    assert_eq!(attempt.parent_span_id, request.span_id);
    let deliver = child(&spans, attempt, "deliver");
    let received = app.target.traceparents(&TestApp::idem("evt_t11"));
    assert_eq!(received.len(), 1);
    let (trace, parent, flags) = parts(&received[0]);
    assert_eq!(trace, hex(&request.trace_id));
    assert_eq!((parent, flags.as_str()), (hex(&deliver.span_id), "01"));
}

/// Untrusted, a sender's `sampled` flag decides nothing: at a ratio of 0 its request is
/// not recorded, and the application receives hookgate's own trace flagged not sampled,
/// not the sender's.
#[actix_web::test]
async fn an_untrusted_senders_sampled_flag_does_not_decide_what_is_recorded() {
    let collector = Collector::start(Answering::Accept).await;
    let mut app = spawn_app_with(|c| {
        traced(&collector)(c);
        c.tracing.trust_incoming = false;
        c.tracing.sampling_ratio = 0.0;
    })
    .await;
    assert_eq!(deliver_in_senders_trace(&app, "evt_t12").await.status, 201);
    let received = app.target.traceparents(&TestApp::idem("evt_t12"));
    assert_eq!(received.len(), 1);
    let (trace, parent, flags) = parts(&received[0]);
    assert_ne!(trace, SENDER_TRACE);
    assert_ne!(parent, SENDER_SPAN);
    assert_eq!(flags, "00");
    app.shutdown().await;
    let spans = collector.spans();
    assert!(spans.is_empty(), "{spans:#?}");
}

/// A sender that hangs up before its answer (the target is slow): its request's span is
/// still recorded, and the attempt that went on is its child.
#[actix_web::test]
async fn a_request_whose_sender_went_away_keeps_its_span() {
    let collector = Collector::start(Answering::Accept).await;
    let mut app = spawn_app_with(traced(&collector)).await;
    app.target.set(Behaviour::Hang);
    let impatient = awc::Client::builder()
        .timeout(Duration::from_millis(300))
        .finish();
    let gone = impatient
        .post(format!("{}/webhooks/{PROVIDER}", app.address))
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-Idempotency-Key", "evt_t8"))
        .send_body("{}")
        .await;
    assert!(gone.is_err(), "the sender gave up: {gone:?}");
    app.target.wait_for(&TestApp::idem("evt_t8"), 1).await;
    app.target.release();
    app.wait_status("evt_t8", "done").await;
    app.shutdown().await;
    let spans = collector.spans();
    let request = named(&spans, "POST /webhooks/{provider}", "evt_t8");
    assert_eq!(request.len(), 1, "{spans:#?}");
    let attempt = named(&spans, "attempt", "evt_t8");
    assert_eq!(attempt.len(), 1, "{spans:#?}");
    assert_eq!(attempt[0].parent_span_id, request[0].span_id);
}

/// An operator's replay of a dead letter is a trace of its own, rooted at its attempt, and
/// its claim line carries that attempt's ids.
#[actix_web::test]
async fn an_operators_replay_is_a_trace_rooted_at_its_attempt() {
    const TOKEN: &str = "trace-replay-token";
    let collector = Collector::start(Answering::Accept).await;
    let mut app = spawn_app_with(|c| {
        traced(&collector)(c);
        c.admin.token = Some(Secret::new(TOKEN));
    })
    .await;
    dead_letter(&app, "evt_t9").await;
    let token = bearer(TOKEN);
    let path = format!("/admin/dead/{PROVIDER}/evt_t9/replay");
    let answer = app
        .post(&path, &[("Authorization", &token)], String::new())
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    app.shutdown().await;
    let spans = collector.spans();
    let attempts = named(&spans, "attempt", "evt_t9");
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let replay = attempts[1];
    assert_eq!(attr(replay, "hookgate.path").as_deref(), Some("replay"));
    assert!(replay.parent_span_id.is_empty(), "a root: {replay:#?}");
    assert_ne!(replay.trace_id, attempts[0].trace_id);
    child(&spans, replay, "deliver");
    let claims: Vec<_> = app
        .log
        .events("webhook.claim", "evt_t9")
        .into_iter()
        .filter(|l| l["path"] == "replay")
        .collect();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["trace_id"], hex(&replay.trace_id));
    assert_eq!(claims[0]["span_id"], hex(&replay.span_id));
}

/// The command line's `hookgate dead replay` is traced as the admin API's replay is: a
/// trace of its own rooted at its attempt, the target sent a `traceparent` under its
/// delivery span — and the spans are sent before the command exits (with a minute's
/// `flush_interval`, only its flush at the end sends them).
#[actix_web::test]
async fn the_command_lines_replay_is_a_trace_rooted_at_its_attempt_sent_before_it_exits() {
    let collector = Collector::start(Answering::Accept).await;
    // The node is not traced: every span the collector gets is the command line's.
    let app = spawn_app_with(|_| {}).await;
    dead_letter(&app, "evt_t14").await;
    let tracing = format!(
        "[tracing]\nendpoint = \"{}\"\nflush_interval = \"1m\"\n",
        collector.url
    );
    let out = app
        .run_cli_with(&["dead", "replay", PROVIDER, "evt_t14"], &tracing)
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("; done"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = collector.spans();
    let attempts = named(&spans, "attempt", "evt_t14");
    assert_eq!(attempts.len(), 1, "{spans:#?}");
    let replay = attempts[0];
    assert_eq!(attr(replay, "hookgate.path").as_deref(), Some("replay"));
    assert_eq!(
        attr(replay, "hookgate.outcome").as_deref(),
        Some("delivered")
    );
    assert!(replay.parent_span_id.is_empty(), "a root: {replay:#?}");
    child(&spans, replay, "claim");
    child(&spans, replay, "record");
    let deliver = child(&spans, replay, "deliver");
    let received = app.target.traceparents(&TestApp::idem("evt_t14"));
    assert_eq!(received.len(), 1, "only the replay was traced");
    let (trace, parent, flags) = parts(&received[0]);
    assert_eq!(
        (trace, parent, flags.as_str()),
        (hex(&replay.trace_id), hex(&deliver.span_id), "01")
    );
}

/// Tracing off (the default): the target gets no trace context, whatever the sender sent,
/// and no log line carries trace ids.
#[actix_web::test]
async fn with_tracing_off_nothing_is_traced() {
    let app = spawn_app_with(|_| {}).await;
    let answer = deliver_in_senders_trace(&app, "evt_t0").await;
    assert_eq!(answer.status, 201);
    assert!(app.target.traceparents(&TestApp::idem("evt_t0")).is_empty());
    let lines = app.log.events("webhook.done", "evt_t0");
    assert_eq!(lines.len(), 1);
    assert!(lines[0].get("trace_id").is_none(), "{}", lines[0]);
}
