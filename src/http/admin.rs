//! The operator's HTTP API under `/admin/`, behind a bearer token.
//!
//! Enabled only when `[admin] token_env` names a variable holding a token; otherwise every
//! `/admin/` route is 404. The token is compared in constant time (over SHA-256 digests, so
//! its length does not leak either). Every admin handler calls [`authorize`] first and
//! extracts nothing that reads or refuses the request: the body and the query string are
//! parsed after it, so a caller without the token is answered 401 before a byte of its
//! body is read.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{guard, web, HttpRequest, HttpResponse};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::event_json::{event_json, summary_json};
use super::state::AppState;
use crate::claim::Path;
use crate::key::EventId;
use crate::shard::gate::Hold;
use crate::shard::Reply;
use crate::store::operator::SearchFilter;
use crate::store::{PageCursor, SearchPage};

/// Dead letters listed when no `limit` is given, and the most one request may ask for.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 1000;

/// Most bytes of rows one list answer carries. A row's summary has no payload and is a few
/// hundred bytes, but its last error is text from outside: a few megabytes is enough to
/// read, and bounds what one request can make the node build.
const MAX_ANSWER_BYTES: usize = 4 << 20;

/// Matches only while the admin API is on (a token is configured): the guard of the whole
/// `/admin/` scope (`routes.rs`).
pub fn enabled() -> impl guard::Guard {
    guard::fn_guard(|ctx| {
        ctx.app_data::<web::Data<AppState>>()
            .is_some_and(|state| state.admin_token.is_some())
    })
}

/// Registers the event and dead-letter routes inside the `/admin/` scope.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/events/{provider}/{key}", web::get().to(show_event))
        .route("/dead", web::get().to(list_dead))
        .route("/dead/{provider}/{key}/replay", web::post().to(replay));
}

/// Refuses the request unless it carries the configured bearer token. Reads headers only.
pub(super) fn authorize(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    let Some(token) = &state.admin_token else {
        return Err(ApiError::NotFound);
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized)?;
    let matches =
        Sha256::digest(given.as_bytes()).ct_eq(&Sha256::digest(token.expose().as_bytes()));
    if bool::from(matches) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// The query string as `T`, or a 400 in the API's words. Called after [`authorize`]: as an
/// extractor it would run before the token is checked.
pub(super) fn query<T: DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|e| ApiError::BadQuery(e.to_string()))
}

/// The provider and key of one event, as a path or a query names them. Read leniently:
/// a handler whose query takes more (an event's history page) checks its own fields.
#[derive(Deserialize)]
struct EventParams {
    provider: String,
    key: String,
}

/// The query of a call that takes nothing but the event it names (or nothing at all, on
/// the path forms): any other field is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventOnly {
    #[serde(rename = "provider")]
    _provider: Option<String>,
    #[serde(rename = "key")]
    _key: Option<String>,
}

/// The event a request names: `{provider}/{key}` of its path, or, on the routes without
/// them, `?provider=…&key=…` of its query string. Keys are the senders' to choose and a path
/// cannot carry every one (a browser collapses `.` and `..` segments, even percent-encoded,
/// so `/events/stripe/..` reaches the node as `/events/`); the query form carries any key
/// as it is. Called after [`authorize`]; a query without both is a 400.
pub(super) fn event_id(req: &HttpRequest) -> Result<EventId, ApiError> {
    let params: EventParams = if req.match_info().get("key").is_some() {
        req.match_info()
            .load()
            .map_err(|e| ApiError::BadQuery(e.to_string()))?
    } else {
        query(req)?
    };
    Ok(EventId::new(params.provider, params.key))
}

async fn show_event(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let _: EventOnly = query(&req)?;
    let id = event_id(&req)?;
    match state.store.operator().event(&id).await? {
        Some(record) => Ok(HttpResponse::Ok().json(event_json(&record))),
        None => Err(ApiError::NoSuchEvent(id.to_string())),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadQuery {
    provider: Option<String>,
    limit: Option<u32>,
    /// `next_cursor` of the page before.
    cursor: Option<String>,
}

async fn list_dead(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let query: DeadQuery = query(&req)?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let after = match &query.cursor {
        Some(text) => Some(PageCursor::decode(text).ok_or(ApiError::BadCursor)?),
        None => None,
    };
    let filter = SearchFilter {
        provider: query.provider,
        status: Some(crate::claim::Status::Dead),
        ..SearchFilter::default()
    };
    let page = state
        .store
        .operator()
        .search(&filter, after.as_ref(), limit)
        .await?;
    Ok(HttpResponse::Ok().json(bounded(&page, "dead")))
}

/// A page of a search as the answer's fields under `list` (its rows as JSON), stopping
/// early past [`MAX_ANSWER_BYTES`]: `truncated` when the bytes cut it short,
/// `next_cursor` (none on the last page), and `scan_stopped` when the search read its
/// budget of rows before the page was full (`next_cursor` goes on from there).
pub(super) fn bounded(page: &SearchPage, list: &str) -> serde_json::Value {
    let mut items = Vec::new();
    let mut bytes = 0;
    let mut truncated = false;
    let mut last = None;
    for row in &page.rows {
        let item = summary_json(row);
        bytes += item.to_string().len();
        if bytes > MAX_ANSWER_BYTES && !items.is_empty() {
            truncated = true;
            break;
        }
        items.push(item);
        last = Some(row);
    }
    let next = match last {
        Some(row) if truncated => Some(PageCursor::after(row.updated_at, &row.id)),
        _ => page.next.clone(),
    };
    serde_json::json!({
        list: items,
        "truncated": truncated,
        "next_cursor": next.map(|c| c.encode()),
        "scan_stopped": page.scan_stopped && !truncated,
    })
}

/// Replays one dead letter (`POST /admin/dead/…/replay`, and the operator API's
/// `POST /admin/api/events/…/replay` and `POST /admin/api/event/replay?provider=&key=`):
/// answers the row as the replay left it.
pub(super) async fn replay(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let _: EventOnly = query(&req)?;
    let named = event_id(&req)?;
    let runtime = state
        .providers
        .get(&*named.provider)
        .ok_or_else(|| ApiError::UnknownProvider(named.provider.to_string()))?;
    let id = EventId::new(Arc::clone(&runtime.name), named.key);
    let paused = |hold: Option<Hold>| ApiError::Paused {
        provider: runtime.name.to_string(),
        why: hold.map_or_else(|| "held".into(), Hold::describe),
    };
    let gate = state.dispatcher.gate();
    if let Some(hold) = gate.hold_of(&runtime.name) {
        return Err(paused(Some(hold)));
    }
    let answer = state
        .dispatcher
        .replay(id.clone(), Arc::clone(&runtime.target))
        .await;
    if let Reply::RetryLater { reason, .. } = answer.reply {
        if answer.path == Path::Paused {
            return Err(paused(gate.hold_of(&runtime.name)));
        }
        if answer.path != Path::Replay {
            return Err(ApiError::Unavailable(reason.as_str()));
        }
    }
    // The row says how the replay ended (done, or dead again), or why there was none.
    let record = state
        .store
        .operator()
        .event(&id)
        .await?
        .ok_or_else(|| ApiError::NoSuchEvent(id.to_string()))?;
    if let Reply::NotReplayable = answer.reply {
        return Err(ApiError::NotDead(record.status.as_str()));
    }
    let mut body = event_json(&record);
    body["path"] = Path::Replay.as_str().into();
    Ok(HttpResponse::Ok().json(body))
}
