//! The exporter: one thread of its own that drains the tracer's bounded queue when a
//! batch's worth is in it (`tracing.batch_size`), at a flush, or every
//! `tracing.flush_interval` — never woken per span — and POSTs each batch to the collector as an OTLP/HTTP protobuf
//! `ExportTraceServiceRequest`. A collector that hangs or refuses costs this thread only:
//! the queue fills and the tracer drops (and counts) what does not fit, so no request
//! ever waits on an export. A failed export, and the spans a collector's partial success
//! rejected, are counted failed and logged, not retried.

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, status, SpanFlags};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;
use slog::{info, warn, Logger};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot, Notify};

use super::span::{Kind, SpanRecord, Tracer, Value};
use crate::config::TracingConfig;
use crate::metrics::TraceCounters;

/// The exporter's endpoint, TLS settings (its CA file read) and headers (their values
/// read from the environment by the config's loading), as `start` uses them; `check-config`
/// asks the same.
#[allow(clippy::type_complexity)]
pub fn settings(
    config: &TracingConfig,
) -> Result<
    (
        String,
        Option<Arc<rustls::ClientConfig>>,
        Vec<(HeaderName, HeaderValue)>,
    ),
    String,
> {
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
    Ok((endpoint, tls, headers))
}

/// Starts the exporter for `config` (its endpoint set) on a thread of its own; returns the
/// node's tracer. `node` is the exported `service.instance.id`.
pub fn start(
    config: &TracingConfig,
    node: &str,
    counters: TraceCounters,
    log: Logger,
) -> Result<Arc<Tracer>, String> {
    let (endpoint, tls, headers) = settings(config)?;
    let (queue, spans) = mpsc::channel(config.queue_size.max(1));
    let (flushes, flush_asked) = mpsc::unbounded_channel();
    let full = Arc::new(Notify::new());
    let shown = config.endpoint_shown().unwrap_or_default();
    let exporter = Exporter {
        endpoint,
        shown: shown.clone(),
        headers,
        tls,
        timeout: config.timeout,
        batch_size: config.batch_size.max(1),
        full: Arc::clone(&full),
        flush_interval: config.flush_interval,
        prefix: Prefix::new(&resource(&config.service_name, node)),
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
        config.trust_incoming,
        queue,
        (full, config.batch_size.max(1)),
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
    /// Told when a batch's worth is queued.
    full: Arc<Notify>,
    flush_interval: Duration,
    prefix: Prefix,
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
            // Woken by a full batch, a flush, or the interval — never per span: a span
            // sent to a parked receiver would wake this thread every time.
            let mut flush = None;
            tokio::select! {
                _ = self.full.notified() => {}
                _ = tokio::time::sleep(self.flush_interval) => {}
                Some(done) = flushes.recv() => flush = Some(done),
            }
            // Everything queued now, in batches.
            let closed = loop {
                match spans.try_recv() {
                    Ok(span) => {
                        batch.push(span);
                        if batch.len() == self.batch_size {
                            self.send(&client, &mut batch).await;
                        }
                    }
                    Err(TryRecvError::Empty) => break false,
                    Err(TryRecvError::Disconnected) => break true,
                }
            };
            if !batch.is_empty() {
                self.send(&client, &mut batch).await;
            }
            if let Some(done) = flush {
                let _ = done.send(());
            }
            if closed {
                return;
            }
        }
    }

    /// One export request; counts its spans exported or failed.
    async fn send(&self, client: &awc::Client, batch: &mut Vec<SpanRecord>) {
        let n = batch.len() as u64;
        let body = encode(&self.prefix, batch);
        batch.clear();
        let mut request = client
            .post(&self.endpoint)
            .insert_header(("content-type", "application/x-protobuf"));
        for (name, value) in &self.headers {
            request = request.insert_header((name.clone(), value.clone()));
        }
        // How many of the batch's spans the collector did not take, and why.
        let (rejected, failure) = match request.send_body(body).await {
            Ok(mut answer) if answer.status().is_success() => {
                // The body (an ExportTraceServiceResponse) is read, so the connection is
                // reused and a partial success is told apart; a body that does not decode
                // is no refusal (the status said the export was taken).
                let answered = answer.body().limit(64 * 1024).await.ok();
                let partial = answered
                    .and_then(|b| ExportTraceServiceResponse::decode(b).ok())
                    .and_then(|r| r.partial_success);
                match partial {
                    Some(p) if p.rejected_spans > 0 => {
                        let rejected = u64::try_from(p.rejected_spans).unwrap_or(n).min(n);
                        let why: String = p.error_message.chars().take(200).collect();
                        let error = format!("the collector rejected {rejected} of {n}: {why}");
                        (rejected, Some(error))
                    }
                    _ => (0, None),
                }
            }
            Ok(answer) => (
                n,
                Some(format!("the collector answered {}", answer.status())),
            ),
            Err(e) => (n, Some(e.to_string())),
        };
        self.counters.exported.inc_by(n - rejected);
        if let Some(error) = failure {
            self.counters.failed.inc_by(rejected);
            warn!(self.log, "tracing.export_failed";
                "endpoint" => &self.shown, "spans" => rejected, "error" => error);
        }
    }
}

/// The exported resource: who made these spans.
fn resource(service: &str, node: &str) -> Resource {
    Resource {
        attributes: vec![
            attribute("service.name", &Value::Owned(service.to_owned())),
            attribute("service.instance.id", &Value::Owned(node.to_owned())),
            attribute("telemetry.sdk.name", &Value::from("hookgate")),
        ],
        ..Default::default()
    }
}

/// What every export request of a node begins with: its resource and instrumentation
/// scope, encoded once by the official message types.
pub struct Prefix {
    resource: Vec<u8>,
    scope: Vec<u8>,
}

impl Prefix {
    /// The prefix for `resource`, scope `hookgate` at this version.
    pub fn new(resource: &Resource) -> Self {
        let scope = InstrumentationScope {
            name: "hookgate".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        Self {
            resource: resource.encode_to_vec(),
            scope: scope.encode_to_vec(),
        }
    }
}

/// `batch` as the body of one OTLP/HTTP protobuf export request
/// (`ExportTraceServiceRequest` → `ResourceSpans` → `ScopeSpans` → `Span`s).
///
/// The spans are written field by field with prost's wire-format primitives, straight from
/// hookgate's records: building the generated message types first cost some twenty
/// allocations a span (every id, name, key and value its own `Vec` or `String`). The
/// field numbers are those of `opentelemetry/proto/trace/v1/trace.proto`; the tests decode
/// the result with the generated types.
pub fn encode(prefix: &Prefix, batch: &[SpanRecord]) -> Vec<u8> {
    let mut spans = Vec::with_capacity(batch.len() * 256);
    let mut one = Vec::with_capacity(512);
    for record in batch {
        one.clear();
        span(record, &mut one);
        delimited(2, &one, &mut spans); // ScopeSpans.spans
    }
    let mut scope_spans = Vec::with_capacity(spans.len() + prefix.scope.len() + 8);
    delimited(1, &prefix.scope, &mut scope_spans); // ScopeSpans.scope
    scope_spans.extend_from_slice(&spans);
    let mut resource_spans = Vec::with_capacity(scope_spans.len() + prefix.resource.len() + 16);
    delimited(1, &prefix.resource, &mut resource_spans); // ResourceSpans.resource
    delimited(2, &scope_spans, &mut resource_spans); // ResourceSpans.scope_spans
    let mut request = Vec::with_capacity(resource_spans.len() + 8);
    delimited(1, &resource_spans, &mut request); // ExportTraceServiceRequest.resource_spans
    request
}

/// One `Span` message's fields.
fn span(record: &SpanRecord, out: &mut Vec<u8>) {
    let kind = match record.kind {
        Kind::Internal => span::SpanKind::Internal,
        Kind::Server => span::SpanKind::Server,
        Kind::Client => span::SpanKind::Client,
    };
    delimited(1, &record.trace_id, out);
    delimited(2, &record.span_id, out);
    if let Some(state) = record.state.as_deref() {
        delimited(3, state.as_bytes(), out);
    }
    if let Some(parent) = &record.parent {
        delimited(4, parent, out);
    }
    delimited(5, record.name.as_bytes(), out);
    varint(6, kind as u64, out);
    fixed64(7, record.start_ns, out);
    fixed64(8, record.end_ns, out);
    for (key, value) in &record.attributes {
        key_value(9, key, value, out);
    }
    if let Some(to) = &record.link {
        // Link { trace_id = 1, span_id = 2, trace_state = 3, flags = 6 (fixed32): the
        // linked context's sampled flag, and that it came from another process }.
        let mut link = Vec::with_capacity(48);
        delimited(1, &to.trace_id, &mut link);
        delimited(2, &to.span_id, &mut link);
        if let Some(state) = to.state.as_deref() {
            delimited(3, state.as_bytes(), &mut link);
        }
        let flags = u32::from(to.sampled)
            | SpanFlags::ContextHasIsRemoteMask as u32
            | SpanFlags::ContextIsRemoteMask as u32;
        encode_key(6, WireType::ThirtyTwoBit, &mut link);
        link.extend_from_slice(&flags.to_le_bytes());
        delimited(13, &link, out); // Span.links
    }
    if let Some(message) = &record.error {
        // Status { message = 2, code = 3 (ERROR) }.
        let mut status = Vec::with_capacity(message.len() + 8);
        delimited(2, message.as_bytes(), &mut status);
        varint(3, status::StatusCode::Error as u64, &mut status);
        delimited(15, &status, out);
    }
    // Span.flags (fixed32): the sampled flag, as every exported span is sampled.
    encode_key(16, WireType::ThirtyTwoBit, out);
    out.extend_from_slice(&1u32.to_le_bytes());
}

/// A `KeyValue` field `tag` (key = 1, value = 2: an `AnyValue`, string_value = 1 or
/// int_value = 3), written in place: its lengths are known before its bytes.
fn key_value(tag: u32, key: &str, value: &Value, out: &mut Vec<u8>) {
    let delimited_len = |n: usize| 1 + encoded_len_varint(n as u64) + n;
    let (text, int) = match value {
        Value::Static(s) => (Some(s.as_bytes()), 0),
        Value::Str(s) => (Some(s.as_bytes()), 0),
        Value::Owned(s) => (Some(s.as_bytes()), 0),
        // int64 is a varint of the two's complement.
        Value::Int(n) => (None, *n as u64),
    };
    let any = match text {
        Some(text) => delimited_len(text.len()),
        None => 1 + encoded_len_varint(int),
    };
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint((delimited_len(key.len()) + delimited_len(any)) as u64, out);
    delimited(1, key.as_bytes(), out);
    encode_key(2, WireType::LengthDelimited, out);
    encode_varint(any as u64, out);
    match text {
        Some(text) => delimited(1, text, out),
        None => varint(3, int, out),
    }
}

fn delimited(tag: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn varint(tag: u32, value: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::Varint, out);
    encode_varint(value, out);
}

fn fixed64(tag: u32, value: u64, out: &mut Vec<u8>) {
    encode_key(tag, WireType::SixtyFourBit, out);
    out.extend_from_slice(&value.to_le_bytes());
}

fn attribute(key: &str, value: &Value) -> KeyValue {
    let value = match value {
        Value::Static(s) => any_value::Value::StringValue((*s).to_owned()),
        Value::Str(s) => any_value::Value::StringValue(s.to_string()),
        Value::Owned(s) => any_value::Value::StringValue(s.clone()),
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
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn a_batch_encodes_as_the_collectors_protobuf() {
        let (tx, mut rx) = mpsc::channel(4);
        let (flushes, _) = mpsc::unbounded_channel();
        let tracer = Tracer::new(
            1.0,
            true,
            tx,
            (Arc::default(), 1),
            flushes,
            Counter::default(),
        );
        let mut ctx = TraceContext::root(true);
        ctx.state = Some(Arc::from("vendor=opaque"));
        let parent = crate::trace::new_span_id();
        let mut attempt = Timed::start("attempt", Kind::Client, &ctx, Some(parent), 1_000);
        attempt.set("hookgate.attempt", 2);
        attempt.set("hookgate.retry_delay_s", -1);
        attempt.set("hookgate.path", "retry_after_failure");
        attempt.set("hookgate.event_key", &Arc::from("evt_1"));
        attempt.set("server.address", String::from("app.example.com"));
        attempt.fail("the target answered 500");
        attempt.end(&tracer, 2_500);
        let mut root = Timed::start("request", Kind::Server, &ctx.child(), None, 900);
        let sender = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("rojo=00f067aa0ba902b7"),
        )
        .unwrap();
        root.link(sender.clone());
        root.end(&tracer, 3_000);
        let records = [rx.try_recv().unwrap(), rx.try_recv().unwrap()];
        let body = encode(&Prefix::new(&resource("hookgate", "node-a")), &records);
        let decoded = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        assert_eq!(decoded.resource_spans.len(), 1);
        let resource = decoded.resource_spans[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[1].key, "service.instance.id");
        let scope = &decoded.resource_spans[0].scope_spans[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "hookgate");
        let spans = &scope.spans;
        assert_eq!(spans.len(), 2);
        let s = &spans[0];
        assert_eq!(s.name, "attempt");
        assert_eq!(s.trace_id, ctx.trace_id.to_vec());
        assert_eq!(s.span_id, ctx.span_id.to_vec());
        assert_eq!(s.parent_span_id, parent.to_vec());
        assert_eq!(s.trace_state, "vendor=opaque");
        assert_eq!(s.kind, span::SpanKind::Client as i32);
        assert_eq!(
            (s.start_time_unix_nano, s.end_time_unix_nano),
            (1_000, 2_500)
        );
        assert_eq!(s.flags, 1);
        let status = s.status.as_ref().unwrap();
        assert_eq!(status.code, status::StatusCode::Error as i32);
        assert_eq!(status.message, "the target answered 500");
        let values: Vec<(&str, Option<any_value::Value>)> = s
            .attributes
            .iter()
            .map(|a| (a.key.as_str(), a.value.clone().and_then(|v| v.value)))
            .collect();
        let text = |t: &str| Some(any_value::Value::StringValue(t.into()));
        assert_eq!(
            values,
            [
                ("hookgate.attempt", Some(any_value::Value::IntValue(2))),
                (
                    "hookgate.retry_delay_s",
                    Some(any_value::Value::IntValue(-1))
                ),
                ("hookgate.path", text("retry_after_failure")),
                ("hookgate.event_key", text("evt_1")),
                ("server.address", text("app.example.com")),
            ]
        );
        assert!(s.links.is_empty());
        let root = &spans[1];
        assert!(root.parent_span_id.is_empty() && root.status.is_none());
        assert_eq!(root.kind, span::SpanKind::Server as i32);
        assert_eq!(root.links.len(), 1);
        let link = &root.links[0];
        assert_eq!(link.trace_id, sender.trace_id.to_vec());
        assert_eq!(link.span_id, sender.span_id.to_vec());
        assert_eq!(link.trace_state, "rojo=00f067aa0ba902b7");
        assert_eq!(link.flags & SpanFlags::TraceFlagsMask as u32, 1, "sampled");
        assert_ne!(link.flags & SpanFlags::ContextHasIsRemoteMask as u32, 0);
        assert_ne!(
            link.flags & SpanFlags::ContextIsRemoteMask as u32,
            0,
            "remote"
        );
        assert!(link.attributes.is_empty());
    }
}
