//! `POST /webhooks/{provider}`: read the body within its limit, verify the signature,
//! derive the key and fingerprint, pick the routes whose filters accept the event (the first
//! answers, the others are queued with its claim), answer a known-done key from the done
//! cache, or hand the event to its shard — then
//! render the answer with `Hookgate-Path` and `Hookgate-Attempt`.
//!
//! Everything refused here is refused before any claim and logged as `webhook.rejected`.
//! A body that does not arrive within `server.read_timeout` is 408 and its connection is
//! closed, so slow senders cannot hold the node's connections.
//! No decision about an event is made here: the cache and the shard make them.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};
use serde_json::json;

use super::body;
use super::budget::Reserved;
use super::error::ApiError;
use super::state::AppState;
use crate::canonical::Body;
use crate::claim::{Mode, Path};
use crate::key::EventId;
use crate::provider::Target;
use crate::shard::{Answer, Event, Reply, Traced};
use crate::trace::{Kind, Span, SpanId, TraceContext, Tracer, WallClock};

/// The handler.
pub async fn ingest(
    req: HttpRequest,
    provider: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let provider = provider.into_inner();
    let Some(tracer) = &state.tracer else {
        return handle(&req, &provider, payload, &state, None, &mut None).await;
    };
    // Tracing on: the request's span continues the sender's trace (or starts one), and
    // the event's attempts are its children.
    let started = Instant::now();
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let (context, parent) = tracer.request(header("traceparent"), header("tracestate"));
    let traced = Traced::new(tracer, context);
    let mut key = None;
    let answer = handle(&req, &provider, payload, &state, Some(&traced), &mut key).await;
    if traced.parent.sampled {
        let known = state.providers.contains_key(&provider);
        let clock = WallClock::now();
        let start = clock.ns(started);
        let span = request_span(&traced.parent, parent, start, known.then_some(&*provider));
        request_ended(
            span,
            &answer,
            key.as_ref(),
            tracer,
            clock.ns(Instant::now()),
        );
    }
    answer
}

/// The span of a sender's request, started at `start`: named by its route, never by the
/// provider segment the caller wrote (only a configured name is an attribute).
fn request_span(
    context: &TraceContext,
    parent: Option<SpanId>,
    start: u64,
    provider: Option<&str>,
) -> Span {
    let name = "POST /webhooks/{provider}";
    let mut span = Span::start(name, Kind::Server, context, parent, start);
    span.set("http.request.method", "POST");
    span.set("http.route", "/webhooks/{provider}");
    span.set("hookgate.provider", provider.unwrap_or("unknown"));
    span
}

/// Ends a request's span with what it was answered: status, path, key or the refusal.
fn request_ended(
    mut span: Span,
    answer: &Result<HttpResponse, ApiError>,
    key: Option<&EventId>,
    tracer: &Tracer,
    end: u64,
) {
    if let Some(id) = key {
        span.set("hookgate.event_key", &id.key);
        span.set("hookgate.scope", &id.provider);
    }
    let status = match answer {
        Ok(response) => {
            if let Some(path) = response
                .headers()
                .get("hookgate-path")
                .and_then(|v| v.to_str().ok())
            {
                span.set("hookgate.path", path);
            }
            response.status()
        }
        Err(e) => {
            span.set("hookgate.rejected", e.code());
            actix_web::ResponseError::status_code(e)
        }
    };
    span.set("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.fail(status.to_string());
    }
    span.end(tracer, end);
}

/// The request's work: checked, keyed, answered from the cache or handed to its shard.
/// `key` learns the event's key once it is known (for the request's span).
async fn handle(
    req: &HttpRequest,
    provider: &str,
    payload: web::Payload,
    state: &AppState,
    traced: Option<&Arc<Traced>>,
    key: &mut Option<EventId>,
) -> Result<HttpResponse, ApiError> {
    match accept(req, provider, payload, state).await {
        Ok(accepted) => {
            if traced.is_some() {
                *key = Some(accepted.id.clone());
            }
            let dispatcher = &state.dispatcher;
            let fingerprint = accepted.fingerprint.as_deref();
            if let Some(answer) = dispatcher.cached(&accepted.id, fingerprint, accepted.mode) {
                return Ok(render(answer));
            }
            let provider = &accepted.id.provider;
            if accepted.mode == Mode::Sync && !accepted.filtered && dispatcher.gate().held(provider)
            {
                // Paused: the sender keeps the event and comes back. (A filtered event is
                // delivered nowhere, so a pause does not hold it.)
                state.metrics.attempt(&accepted.id.provider, Path::Paused);
                return Ok(render(Answer::paused(state.paused_retry_after)));
            }
            let event = Event {
                id: accepted.id,
                fingerprint: accepted.fingerprint,
                content_type: req
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                body: accepted.body,
                target: accepted.target,
                headers: kept_trace(req.headers().clone(), traced),
                mode: accepted.mode,
                filtered: accepted.filtered,
                others: accepted.others,
                trace: traced.cloned(),
            };
            Ok(render(match event.mode {
                Mode::Sync => dispatcher.dispatch(event).await,
                Mode::Queue => dispatcher.enqueue(event).await,
            }))
        }
        Err(e) => {
            // Only configured names reach a label or a log line; anything else is
            // `unknown`: the segment is the unauthenticated caller's own text (it could
            // forge lines, or be 100 KB long). A bounded, escaped excerpt goes to debug.
            let label = if state.providers.contains_key(provider) {
                provider
            } else {
                slog::debug!(state.log, "webhook.unknown_provider";
                    "excerpt" => excerpt(provider));
                "unknown"
            };
            state.metrics.rejected(label, e.code());
            slog::info!(state.log, "webhook.rejected";
                "provider" => label, "reason" => e.code());
            Err(e)
        }
    }
}

/// The request's headers with its `traceparent` (and `tracestate`) replaced by the context
/// of hookgate's span for it: kept with the row, they are what its later attempts continue.
fn kept_trace(mut headers: HeaderMap, traced: Option<&Arc<Traced>>) -> HeaderMap {
    if let Some(traced) = traced {
        let context = &traced.parent;
        if let Ok(value) = HeaderValue::from_str(&context.traceparent()) {
            headers.insert(HeaderName::from_static("traceparent"), value);
        }
        headers.remove("tracestate");
        if let Some(state) = context.state.as_deref() {
            if let Ok(value) = HeaderValue::from_str(state) {
                headers.insert(HeaderName::from_static("tracestate"), value);
            }
        }
    }
    headers
}

/// A request that passed every check, before it becomes an [`Event`].
struct Accepted {
    id: EventId,
    fingerprint: Option<String>,
    body: Bytes,
    /// The body's bytes in the node's budget, held until the request is answered.
    _reserved: Reserved,
    target: Arc<Target>,
    /// Sync for an event its target's filter did not accept, whatever the provider's mode:
    /// it is answered at once (`filtered`), never queued.
    mode: Mode,
    /// No route's filter accepted it.
    filtered: bool,
    /// The other routes that accept it (see [`Event::others`]).
    others: Vec<Arc<crate::provider::Route>>,
}

/// Everything checked before a claim, in order: provider, body size, signature, key.
async fn accept(
    req: &HttpRequest,
    provider: &str,
    payload: web::Payload,
    state: &AppState,
) -> Result<Accepted, ApiError> {
    let runtime = state
        .providers
        .get(provider)
        .ok_or_else(|| ApiError::UnknownProvider(excerpt(provider)))?;
    let (body, reserved) = body::read(req, payload, state.max_body_bytes, state).await?;
    runtime
        .verifier
        .verify(req.headers(), &body, SystemTime::now())?;
    let parsed = Body::new(&body);
    let key = runtime.key.derive(req.headers(), &parsed)?;
    let fingerprint = runtime.fingerprint.fingerprint(&parsed);
    // The routes whose filters accept the event; the first answers (the main route when
    // it accepts), the others get rows of their own with its claim.
    let mut accepting = runtime.routes.iter().filter(|r| {
        r.target
            .filter
            .as_ref()
            .is_none_or(|f| f.accepts(req.headers(), &parsed))
    });
    let answering = accepting.next();
    let others = accepting.cloned().collect();
    // No route accepts it: recorded on the main route's row as filtered, so that its
    // redeliveries are duplicates too.
    let filtered = answering.is_none();
    let route = answering.unwrap_or(&runtime.routes[0]);
    Ok(Accepted {
        id: EventId::new(Arc::clone(&route.scope), key),
        fingerprint,
        body,
        _reserved: reserved,
        target: Arc::clone(&route.target),
        mode: if filtered { Mode::Sync } else { runtime.mode },
        filtered,
        others,
    })
}

/// Turns the shard's answer into the sender's response.
fn render(answer: Answer) -> HttpResponse {
    let (status, retry_after, body) = match &answer.reply {
        Reply::Result(result) => {
            let status = StatusCode::from_u16(result.status).unwrap_or(StatusCode::OK);
            let mut builder = labelled(status, &answer);
            if let Some(ct) = &result.content_type {
                builder.insert_header((header::CONTENT_TYPE, ct.as_str()));
            }
            return builder.body(result.body.clone());
        }
        &Reply::Busy { retry_after } => (
            StatusCode::CONFLICT,
            Some(retry_after),
            json!({"status": "in_progress", "retry_after_s": retry_after}),
        ),
        &Reply::RetryLater {
            retry_after,
            reason,
        } => (
            StatusCode::SERVICE_UNAVAILABLE,
            Some(retry_after),
            json!({"status": "retry_later", "reason": reason.as_str(), "retry_after_s": retry_after}),
        ),
        Reply::DeadLettered => (StatusCode::OK, None, json!({"status": "dead_lettered"})),
        Reply::Queued => (StatusCode::ACCEPTED, None, json!({"status": "queued"})),
        Reply::NotReplayable => (StatusCode::CONFLICT, None, json!({"error": "not_dead"})),
        Reply::Mismatch => (
            StatusCode::UNPROCESSABLE_ENTITY,
            None,
            json!({
                "error": "payload_mismatch",
                "message": "this idempotency key was first seen with a different payload",
            }),
        ),
    };
    let mut builder = labelled(status, &answer);
    if let Some(secs) = retry_after {
        builder.insert_header((header::RETRY_AFTER, secs.to_string()));
    }
    builder.json(body)
}

/// A response builder carrying `Hookgate-Path` and, where known, `Hookgate-Attempt`.
fn labelled(status: StatusCode, answer: &Answer) -> HttpResponseBuilder {
    let mut builder = HttpResponse::build(status);
    builder.insert_header((
        "Hookgate-Path",
        HeaderValue::from_static(answer.path.as_str()),
    ));
    if let Some(attempts) = answer.attempts {
        builder.insert_header(("Hookgate-Attempt", attempts.to_string()));
    }
    builder
}

/// Characters of an unknown provider name kept in its debug line.
const EXCERPT_CHARS: usize = 64;

/// The first [`EXCERPT_CHARS`] characters of `text`, control characters escaped.
fn excerpt(text: &str) -> String {
    text.chars()
        .take(EXCERPT_CHARS)
        .flat_map(char::escape_default)
        .collect()
}
