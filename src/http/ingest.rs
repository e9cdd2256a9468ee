//! `POST /webhooks/{provider}`: read the body within its limit, verify the signature,
//! derive the key and fingerprint, pick the routes whose filters accept the event (the
//! main route's row is the event's record and answers; the other routes' rows are written
//! with the claim that writes it), answer a known-done key from the done cache, or hand the
//! event to its shard — then
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
use crate::trace::{Kind, Span, Upstream};

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
    let (traceparent, tracestate) = trace_headers(req.headers());
    let (context, sender) = tracer.request(traceparent, tracestate.as_deref());
    let mut span = RequestSpan {
        traced: Traced::new(tracer, context),
        sender,
        started,
        provider: state.providers.get(&provider).map(|p| Arc::clone(&p.name)),
        key: None,
        answered: None,
    };
    let traced = Some(Arc::clone(&span.traced));
    let answer = handle(
        &req,
        &provider,
        payload,
        &state,
        traced.as_ref(),
        &mut span.key,
    )
    .await;
    span.answered = Some(Answered::of(&answer));
    answer
}

/// The trace context headers of a request: its one `traceparent` (several are none, as
/// the recommendation says), and its `tracestate` headers joined as one list.
fn trace_headers(headers: &HeaderMap) -> (Option<&str>, Option<String>) {
    let mut parents = headers.get_all("traceparent");
    let parent = match (parents.next(), parents.next()) {
        (Some(one), None) => one.to_str().ok(),
        _ => None,
    };
    let states: Vec<&str> = headers
        .get_all("tracestate")
        .filter_map(|v| v.to_str().ok())
        .collect();
    let state = (!states.is_empty()).then(|| states.join(","));
    (parent, state)
}

/// What a request was answered, for its span.
struct Answered {
    status: StatusCode,
    path: Option<&'static str>,
    rejected: Option<&'static str>,
}

impl Answered {
    fn of(answer: &Result<HttpResponse, ApiError>) -> Self {
        match answer {
            Ok(response) => Self {
                status: response.status(),
                path: response
                    .headers()
                    .get("hookgate-path")
                    .and_then(|v| v.to_str().ok())
                    .and_then(Path::parse)
                    .map(Path::as_str),
                rejected: None,
            },
            Err(e) => Self {
                status: actix_web::ResponseError::status_code(e),
                path: None,
                rejected: Some(e.code()),
            },
        }
    }
}

/// A sender's request being traced. Recorded when dropped, so a request whose handler is
/// dropped before its answer (the server stopping it) still has the span its attempt is a
/// child of, failed.
struct RequestSpan {
    traced: Arc<Traced>,
    /// The sender's span, this one's parent or link.
    sender: Upstream,
    started: Instant,
    /// A configured provider's name (the caller's own text never reaches a span).
    provider: Option<Arc<str>>,
    key: Option<EventId>,
    /// `None`: the sender went away before the answer.
    answered: Option<Answered>,
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        let traced = &self.traced;
        let context = &traced.parent;
        if !context.sampled {
            return;
        }
        let rejected = self.answered.as_ref().is_some_and(|a| a.rejected.is_some());
        let parent = match &self.sender {
            Upstream::Parent(span) => Some(*span),
            Upstream::None | Upstream::Link(_) => None,
        };
        if rejected && parent.is_some() && !traced.tracer.draws() {
            // Refused before any claim: a caller's `sampled` flag does not get its own
            // requests recorded past the ratio (anyone can send one), drawn by hookgate:
            // the trace id is the caller's choice too.
            return;
        }
        let name = "POST /webhooks/{provider}";
        let start = traced.clock.ns(self.started);
        let mut span = Span::start(name, Kind::Server, context, parent, start);
        if let Upstream::Link(sender) = &self.sender {
            span.link(sender.clone());
        }
        span.set("http.request.method", "POST");
        span.set("http.route", "/webhooks/{provider}");
        match &self.provider {
            Some(name) => span.set("hookgate.provider", name),
            None => span.set("hookgate.provider", "unknown"),
        }
        if let Some(id) = &self.key {
            span.set("hookgate.event_key", &id.key);
            span.set("hookgate.scope", &id.provider);
        }
        match &self.answered {
            Some(answered) => {
                if let Some(path) = answered.path {
                    span.set("hookgate.path", path);
                }
                if let Some(code) = answered.rejected {
                    span.set("hookgate.rejected", code);
                }
                span.set(
                    "http.response.status_code",
                    i64::from(answered.status.as_u16()),
                );
                if answered.status.is_server_error() {
                    span.fail(answered.status.to_string());
                }
            }
            None => span.fail("the sender went away before the answer"),
        }
        span.end(&traced.tracer, traced.clock.ns(Instant::now()));
    }
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
            let mode = accepted.mode;
            if let Some(answer) =
                dispatcher.cached(&accepted.id, fingerprint, mode, traced.map(|t| &**t))
            {
                return Ok(render(answer));
            }
            let provider = &accepted.id.provider;
            if accepted.provider_mode == Mode::Sync && dispatcher.gate().held(provider) {
                // Paused: the sender keeps the event and comes back. A delivery the main
                // route's filter refuses is held too: whether it is delivered is the row's
                // to say (a retry of an event the main route has is delivered there).
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
                fingerprinter: Some(accepted.fingerprinter),
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
    /// Sync for an event its main route's filter did not accept, whatever the provider's
    /// mode: a new one is recorded at once (`filtered`), never queued on the main route.
    mode: Mode,
    /// The provider's mode.
    provider_mode: Mode,
    /// The main route's filter did not accept this delivery.
    filtered: bool,
    /// The other routes that accept it (see [`Event::others`]).
    others: Vec<Arc<crate::provider::Route>>,
    /// The provider's fingerprints (see [`Event::fingerprinter`]).
    fingerprinter: Arc<crate::canonical::Fingerprinter>,
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
    // Every delivery goes to the main route's row, the event's record: it answers the
    // sender and holds the fingerprint. The filters' choice below counts only if this is
    // the event's first accepted delivery (its claim or enqueue writes that row, and the
    // other routes' rows with it); a redelivery is answered from the row, whatever its
    // headers would pick now.
    let accepts = |r: &&Arc<crate::provider::Route>| {
        r.target
            .filter
            .as_ref()
            .is_none_or(|f| f.accepts(req.headers(), &parsed))
    };
    let (main, rest) = runtime
        .routes
        .split_first()
        .ok_or_else(|| ApiError::UnknownProvider(excerpt(provider)))?;
    let filtered = !accepts(&main);
    let others = rest.iter().filter(accepts).cloned().collect();
    Ok(Accepted {
        id: EventId::new(Arc::clone(&main.scope), key),
        fingerprint,
        body,
        _reserved: reserved,
        target: Arc::clone(&main.target),
        mode: if filtered { Mode::Sync } else { runtime.mode },
        provider_mode: runtime.mode,
        filtered,
        others,
        fingerprinter: Arc::clone(&runtime.fingerprint),
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
