//! The exporter: one thread of its own that takes finished spans from the tracer's bounded
//! queue, batches them (`tracing.batch_size`, or what came within `tracing.flush_interval`)
//! and POSTs each batch to the collector as an OTLP/HTTP protobuf
//! `ExportTraceServiceRequest`. A collector that hangs or refuses costs this thread only:
//! the queue fills and the tracer drops (and counts) what does not fit, so no request
//! ever waits on an export. A failed export is counted and logged, not retried.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prost::Message;
use slog::{info, warn, Logger};
use tokio::sync::{mpsc, oneshot};

use super::span::{Kind, SpanRecord, Tracer, Value};
use crate::config::TracingConfig;
use crate::metrics::TraceCounters;

/// Starts the exporter for `config` (its endpoint set) on a thread of its own; returns the
/// node's tracer. `node` is the exported `service.instance.id`.
pub fn start(
    config: &TracingConfig,
    node: &str,
    counters: TraceCounters,
    log: Logger,
) -> Result<Arc<Tracer>, String> {
    let endpoint = config
        .endpoint
        .clone()
        .ok_or("tracing.endpoint is not set")?;
    let tls = if endpoint.starts_with("https://") {
        Some(crate::tls::client_config(
            config.ca_file.as_deref(),
            crate::tls::Verify::Full,
        )?)
    } else {
        None
    };
    let mut headers = Vec::with_capacity(config.headers.len());
    for (name, value) in &config.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| format!("tracing.headers_env: {name:?}: {e}"))?;
        let value = HeaderValue::from_str(value.expose())
            .map_err(|e| format!("tracing.headers_env: the value of {name}: {e}"))?;
        headers.push((name, value));
    }
    let (queue, spans) = mpsc::channel(config.queue_size.max(1));
    let (flushes, flush_asked) = mpsc::unbounded_channel();
    let shown = config.endpoint_shown().unwrap_or_default();
    let exporter = Exporter {
        endpoint,
        shown: shown.clone(),
        headers,
        tls,
        timeout: config.timeout,
        batch_size: config.batch_size.max(1),
        flush_interval: config.flush_interval,
        resource: resource(&config.service_name, node),
        counters: counters.clone(),
        log: log.clone(),
    };
    std::thread::Builder::new()
        .name("hookgate-otlp".into())
        .spawn(move || actix_rt::System::new().block_on(exporter.run(spans, flush_asked)))
        .map_err(|e| format!("starting the trace exporter: {e}"))?;
    info!(log, "tracing.started";
        "endpoint" => shown, "sampling_ratio" => config.sampling_ratio);
    Ok(Arc::new(Tracer::new(
        config.sampling_ratio,
        queue,
        flushes,
        counters.dropped,
    )))
}

struct Exporter {
    endpoint: String,
    /// The endpoint as logs show it (no credentials, no query).
    shown: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    tls: Option<Arc<rustls::ClientConfig>>,
    timeout: Duration,
    batch_size: usize,
    flush_interval: Duration,
    resource: Resource,
    counters: TraceCounters,
    log: Logger,
}

impl Exporter {
    /// Batches and sends until every tracer of the node is gone, then sends what is left.
    /// A flush sends whatever is queued at once, then answers.
    async fn run(
        self,
        mut spans: mpsc::Receiver<SpanRecord>,
        mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    ) {
        let builder = awc::Client::builder()
            .disable_redirects()
            .timeout(self.timeout);
        let client = match &self.tls {
            Some(tls) => builder
                .connector(awc::Connector::new().rustls_0_23(Arc::clone(tls)))
                .finish(),
            None => builder.finish(),
        };
        let mut batch = Vec::with_capacity(self.batch_size);
        loop {
            let mut flush = tokio::select! {
                n = spans.recv_many(&mut batch, self.batch_size) => {
                    if n == 0 {
                        return;
                    }
                    None
                }
                Some(done) = flushes.recv() => Some(done),
            };
            // A batch fills for `flush_interval` at most, unless a flush is asked meanwhile.
            let flush_at = tokio::time::Instant::from_std(Instant::now() + self.flush_interval);
            while flush.is_none() && batch.len() < self.batch_size {
                let room = self.batch_size - batch.len();
                tokio::select! {
                    got = tokio::time::timeout_at(flush_at, spans.recv_many(&mut batch, room)) => {
                        if matches!(got, Ok(0) | Err(_)) {
                            break;
                        }
                    }
                    Some(done) = flushes.recv() => flush = Some(done),
                }
            }
            if !batch.is_empty() {
                self.send(&client, std::mem::take(&mut batch)).await;
            }
            if let Some(done) = flush {
                // Everything queued now, in batches.
                loop {
                    while batch.len() < self.batch_size {
                        match spans.try_recv() {
                            Ok(span) => batch.push(span),
                            Err(_) => break,
                        }
                    }
                    if batch.is_empty() {
                        break;
                    }
                    self.send(&client, std::mem::take(&mut batch)).await;
                }
                let _ = done.send(());
            }
        }
    }

    /// One export request; counts its spans exported or failed.
    async fn send(&self, client: &awc::Client, batch: Vec<SpanRecord>) {
        let n = batch.len() as u64;
        let body = encode(&self.resource, batch);
        let mut request = client
            .post(&self.endpoint)
            .insert_header(("content-type", "application/x-protobuf"));
        for (name, value) in &self.headers {
            request = request.insert_header((name.clone(), value.clone()));
        }
        let failure = match request.send_body(body).await {
            Ok(mut answer) if answer.status().is_success() => {
                // The body (an ExportTraceServiceResponse) is read so the connection is
                // reused; a partial success is not told apart.
                let _ = answer.body().limit(64 * 1024).await;
                None
            }
            Ok(answer) => Some(format!("the collector answered {}", answer.status())),
            Err(e) => Some(e.to_string()),
        };
        match failure {
            None => {
                self.counters.exported.inc_by(n);
            }
            Some(error) => {
                self.counters.failed.inc_by(n);
                warn!(self.log, "tracing.export_failed";
                    "endpoint" => &self.shown, "spans" => n, "error" => error);
            }
        }
    }
}

/// The exported resource: who made these spans.
fn resource(service: &str, node: &str) -> Resource {
    Resource {
        attributes: vec![
            attribute("service.name", &Value::from(service)),
            attribute("service.instance.id", &Value::from(node)),
            attribute("telemetry.sdk.name", &Value::from("hookgate")),
        ],
        ..Default::default()
    }
}

/// `batch` as the body of one OTLP/HTTP protobuf export request.
pub fn encode(resource: &Resource, batch: Vec<SpanRecord>) -> Vec<u8> {
    let spans = batch.into_iter().map(span).collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "hookgate".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
    .encode_to_vec()
}

fn span(record: SpanRecord) -> Span {
    let kind = match record.kind {
        Kind::Internal => span::SpanKind::Internal,
        Kind::Server => span::SpanKind::Server,
        Kind::Client => span::SpanKind::Client,
    };
    let status = match &record.error {
        Some(message) => Status {
            message: message.clone(),
            code: status::StatusCode::Error as i32,
        },
        None => Status::default(),
    };
    Span {
        trace_id: record.trace_id.to_vec(),
        span_id: record.span_id.to_vec(),
        trace_state: record.state.as_deref().unwrap_or_default().to_owned(),
        parent_span_id: record.parent.map(|p| p.to_vec()).unwrap_or_default(),
        // The sampled flag (every exported span is sampled).
        flags: 1,
        name: record.name.into(),
        kind: kind as i32,
        start_time_unix_nano: record.start_ns,
        end_time_unix_nano: record.end_ns,
        attributes: record
            .attributes
            .iter()
            .map(|(key, value)| attribute(key, value))
            .collect(),
        status: Some(status),
        ..Default::default()
    }
}

fn attribute(key: &str, value: &Value) -> KeyValue {
    let value = match value {
        Value::Str(s) => any_value::Value::StringValue(s.to_string()),
        Value::Int(n) => any_value::Value::IntValue(*n),
    };
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::context::TraceContext;
    use crate::trace::span::Span as Timed;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn a_batch_encodes_as_the_collectors_protobuf() {
        let (tx, mut rx) = mpsc::channel(4);
        let (flushes, _) = mpsc::unbounded_channel();
        let tracer = Tracer::new(1.0, tx, flushes, Counter::default());
        let ctx = TraceContext::root(true);
        let mut attempt = Timed::start("attempt", Kind::Internal, &ctx, None, 1);
        attempt.set("hookgate.attempt", 2);
        attempt.fail("the target answered 500");
        attempt.end(&tracer, 2);
        let record = rx.try_recv().unwrap();
        let body = encode(&resource("hookgate", "node-a"), vec![record]);
        let decoded = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let spans = &decoded.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].name, "attempt");
        assert_eq!(spans[0].trace_id, ctx.trace_id.to_vec());
        assert!(spans[0].parent_span_id.is_empty());
        assert_eq!(
            spans[0].status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
        let attempt = &spans[0].attributes[0];
        assert_eq!(attempt.key, "hookgate.attempt");
        assert_eq!(
            attempt.value.as_ref().unwrap().value,
            Some(any_value::Value::IntValue(2))
        );
    }
}
