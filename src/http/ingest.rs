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
use std::time::SystemTime;

use actix_web::http::header::{self, HeaderValue};
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
use crate::shard::{Answer, Event, Reply};

/// The handler.
pub async fn ingest(
    req: HttpRequest,
    provider: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let provider = provider.into_inner();
    match accept(&req, &provider, payload, &state).await {
        Ok(accepted) => {
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
                headers: req.headers().clone(),
                mode: accepted.mode,
                filtered: accepted.filtered,
                others: accepted.others,
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
            let label = if state.providers.contains_key(&provider) {
                provider.as_str()
            } else {
                slog::debug!(state.log, "webhook.unknown_provider";
                    "excerpt" => excerpt(&provider));
                "unknown"
            };
            state.metrics.rejected(label, e.code());
            slog::info!(state.log, "webhook.rejected";
                "provider" => label, "reason" => e.code());
            Err(e)
        }
    }
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
