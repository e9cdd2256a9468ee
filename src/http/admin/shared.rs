//! What every handler under `/admin/` shares: the scope's guard ([`enabled`]: the admin API
//! is on only when `[admin] token_env` names a variable holding a token; otherwise every
//! `/admin/` route is 404), the token check, reading the query, the event a request names,
//! and a page of rows bounded in bytes.
//!
//! The token is compared in constant time (over SHA-256 digests, so its length does not
//! leak either). Every admin handler calls [`authorize`] first and extracts nothing that
//! reads or refuses the request: the body and the query string are parsed after it, so a
//! caller without the token is answered 401 before a byte of its body is read.

use actix_web::http::header;
use actix_web::{guard, web, HttpRequest};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::http::error::ApiError;
use crate::http::event_json::summary_json;
use crate::http::state::AppState;
use crate::key::EventId;
use crate::store::{PageCursor, SearchPage};

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
    route: Option<String>,
}

/// The scope a request names: `provider` (a provider's name, or a route's scope such as
/// `stripe.analytics`) narrowed to `route` if one is given (`main` is the provider's own).
pub(super) fn scope_of(provider: &str, route: Option<&str>) -> String {
    match route {
        None | Some(crate::key::MAIN_ROUTE) => provider.to_owned(),
        Some(route) => crate::config::route_scope(provider, Some(route)),
    }
}

/// The route a path-form request names in its query, if any (read leniently, as
/// [`EventParams`]).
#[derive(Deserialize)]
pub(super) struct RouteOnly {
    pub(super) route: Option<String>,
}

/// The query of a call that takes nothing but the event it names (or nothing at all, on
/// the path forms): any other field is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventOnly {
    #[serde(rename = "provider")]
    _provider: Option<String>,
    #[serde(rename = "key")]
    _key: Option<String>,
    #[serde(rename = "route")]
    _route: Option<String>,
}

/// The event a request names: `{provider}/{key}` of its path, or, on the routes without
/// them, `?provider=…&key=…` of its query string; either may add `?route=…`. Keys are the senders' to choose and a path
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
    let route = match req.match_info().get("key") {
        // The path form names its route in the query (or in the provider's scope).
        Some(_) => query::<RouteOnly>(req).ok().and_then(|q| q.route),
        None => params.route,
    };
    Ok(EventId::new(
        scope_of(&params.provider, route.as_deref()),
        params.key,
    ))
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
