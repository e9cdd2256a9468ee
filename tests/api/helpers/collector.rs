//! An OpenTelemetry collector as far as hookgate's exporter can tell: an OTLP/HTTP
//! receiver that decodes every export request with the official protobuf definitions
//! (`opentelemetry-proto`) and keeps the spans — or one that hangs, refuses, or takes each
//! export in part.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use super::eventually;

/// How the collector answers exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answering {
    /// Decodes and keeps the spans, answers 200.
    Accept,
    /// Never answers.
    Hang,
    /// Answers 503 without reading.
    Refuse,
    /// Takes an export in part: keeps all its spans but the last, and answers 200 with a
    /// partial success saying one span was rejected.
    RejectOne,
}

#[derive(Clone)]
struct State {
    answering: Answering,
    spans: Arc<Mutex<Vec<Span>>>,
    requests: Arc<AtomicUsize>,
    service: Arc<Mutex<Option<String>>>,
}

/// A running collector.
pub struct Collector {
    /// Its traces endpoint (`…/v1/traces`).
    pub url: String,
    state: State,
}

impl Collector {
    /// Starts a collector answering as `answering`.
    pub async fn start(answering: Answering) -> Self {
        let state = State {
            answering,
            spans: Arc::default(),
            requests: Arc::default(),
            service: Arc::default(),
        };
        let data = web::Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(64 * 1024 * 1024))
                .route("/v1/traces", web::post().to(export))
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind the collector");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        Self {
            url: format!("http://127.0.0.1:{port}/v1/traces"),
            state,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.state.spans.lock().unwrap().clone()
    }

    /// Export requests received so far.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// The `service.name` of the last export.
    pub fn service(&self) -> Option<String> {
        self.state.service.lock().unwrap().clone()
    }

    /// Waits until `n` spans named `name` whose `hookgate.event_key` is `key` arrived;
    /// returns every span of their traces.
    pub async fn wait_for(&self, name: &str, key: &str, n: usize) -> Vec<Span> {
        eventually(&format!("{n} {name} spans of {key}"), || async {
            let spans = self.spans();
            spans
                .iter()
                .filter(|s| s.name == name && attr(s, "hookgate.event_key").as_deref() == Some(key))
                .count()
                >= n
        })
        .await;
        self.spans()
    }
}

async fn export(body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    state.requests.fetch_add(1, Ordering::SeqCst);
    match state.answering {
        Answering::Hang => std::future::pending().await,
        Answering::Refuse => HttpResponse::ServiceUnavailable().finish(),
        Answering::Accept | Answering::RejectOne => {
            let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
            let mut rejected = 0;
            for resource in request.resource_spans {
                let service = resource.resource.and_then(|r| {
                    r.attributes
                        .into_iter()
                        .find(|a| a.key == "service.name")
                        .and_then(|a| match a.value?.value? {
                            Value::StringValue(s) => Some(s),
                            _ => None,
                        })
                });
                *state.service.lock().unwrap() = service;
                for scope in resource.scope_spans {
                    let mut spans = scope.spans;
                    if state.answering == Answering::RejectOne && rejected == 0 {
                        rejected += i64::from(spans.pop().is_some());
                    }
                    state.spans.lock().unwrap().extend(spans);
                }
            }
            let answer = ExportTraceServiceResponse {
                partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
                    rejected_spans: rejected,
                    error_message: "one span refused".into(),
                }),
            };
            HttpResponse::Ok()
                .content_type("application/x-protobuf")
                .body(answer.encode_to_vec())
        }
    }
}

/// A span's attribute as text (a string, or a number written out).
pub fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(n) => Some(n.to_string()),
        other => Some(format!("{other:?}")),
    }
}
