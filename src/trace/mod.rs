//! Traces: W3C trace context in and out (`context`), spans and the node's tracer
//! (`span`), and the OTLP/HTTP exporter (`export`). Off unless `[tracing]` names an
//! endpoint. This file only re-exports.

mod context;
mod export;
mod span;

pub use context::{new_span_id, Sampler, SpanId, TraceContext, TraceId};
pub use export::{encode, settings, start};
pub use span::{Kind, Span, SpanRecord, Tracer, Upstream, Value, WallClock};
