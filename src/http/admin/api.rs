//! The operators' JSON API under `/admin/api/` (behind the bearer token, as all of
//! `/admin/`): search events, one event with its attempts, replay one, statistics per
//! provider, pause and resume a provider, and bulk replays (plan, start, follow, cancel).
//! Answers are bounded in rows and bytes and paged by opaque cursors; request bodies are
//! read only after the token is checked, within `server.read_timeout` and
//! [`MAX_BODY_BYTES`].

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::dead::replay;
use std::sync::Arc;

use super::shared::{authorize, bounded, event_id, query, scope_of, RouteOnly};
use crate::http::body;
use crate::http::error::ApiError;
use crate::http::event_json::{attempt_json, event_json, route_json};
use crate::http::state::AppState;
use crate::key::EventId;
use crate::operator_work::jobs;
use crate::store::operator::{ReplayJob, SearchFilter, HISTORY_PAGE, MAX_HISTORY_PAGE};
use crate::store::PageCursor;

/// Events a page holds when no `limit` is given, and the most it may.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;
/// Items of a job shown with it.
const JOB_ITEMS: u32 = 200;
/// Replays a second when a job does not say.
const DEFAULT_RATE: f64 = 10.0;
/// Most bytes of an operator's request body: a bulk replay's filter and rate take a few
/// hundred, so 64 KiB leaves room for long key prefixes and little to hold per connection.
const MAX_BODY_BYTES: usize = 64 << 10;

/// Registers the routes (inside `/admin`).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/stats", web::get().to(stats))
        .route("/api/events", web::get().to(search))
        // One event by its query (any key), or by its path (keys a path can carry).
        .route("/api/event", web::get().to(event))
        .route("/api/event/replay", web::post().to(replay))
        .route("/api/events/{provider}/{key}", web::get().to(event))
        .route(
            "/api/events/{provider}/{key}/replay",
            web::post().to(replay),
        )
        .route("/api/providers/{provider}/pause", web::post().to(pause))
        .route("/api/providers/{provider}/resume", web::post().to(resume))
        .route("/api/replays/plan", web::post().to(plan))
        .route("/api/replays", web::post().to(start_job))
        .route("/api/replays", web::get().to(jobs))
        .route("/api/replays/{id}", web::get().to(job))
        .route("/api/replays/{id}/cancel", web::post().to(cancel_job));
}

/// The search's query string, field by field (a flattened filter would read its numbers
/// as strings: serde's `flatten` cannot parse a query string's values into numbers). As
/// every body and query the API takes, unknown fields are refused, never ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchQuery {
    provider: Option<String>,
    /// Narrows `provider` to one of its routes.
    route: Option<String>,
    status: Option<String>,
    path: Option<String>,
    key_prefix: Option<String>,
    mode: Option<String>,
    reason: Option<String>,
    created_after: Option<f64>,
    created_before: Option<f64>,
    updated_after: Option<f64>,
    updated_before: Option<f64>,
    limit: Option<u32>,
    cursor: Option<String>,
}

impl SearchQuery {
    /// The filter it asks for; an unknown status is a 400.
    fn filter(&self) -> Result<SearchFilter, ApiError> {
        let status =
            match &self.status {
                Some(text) => Some(crate::claim::Status::parse(text).ok_or(
                    ApiError::BadRequest("status: queued, in_progress, done, failed or dead"),
                )?),
                None => None,
            };
        if self.route.is_some() && self.provider.is_none() {
            return Err(ApiError::BadRequest("route: needs its provider"));
        }
        Ok(SearchFilter {
            provider: self
                .provider
                .as_deref()
                .map(|p| scope_of(p, self.route.as_deref())),
            status,
            path: self.path.clone(),
            key_prefix: self.key_prefix.clone(),
            mode: self.mode.clone(),
            reason: self.reason.clone(),
            created_after: self.created_after,
            created_before: self.created_before,
            updated_after: self.updated_after,
            updated_before: self.updated_before,
        })
    }
}

async fn search(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let query: SearchQuery = query(&req)?;
    let filter = query.filter()?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let after = match &query.cursor {
        Some(text) => Some(PageCursor::decode(text).ok_or(ApiError::BadCursor)?),
        None => None,
    };
    let page = state
        .store
        .operator()
        .search(&filter, after.as_ref(), limit)
        .await?;
    Ok(HttpResponse::Ok().json(bounded(&page, "events")))
}

async fn event(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let query: HistoryQuery = query(&req)?;
    let limit = query
        .limit
        .unwrap_or(HISTORY_PAGE)
        .clamp(1, MAX_HISTORY_PAGE);
    let before = match query.before {
        None => None,
        Some(n) => Some(
            i32::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or(ApiError::BadRequest("before: an attempt number, 1 or more"))?,
        ),
    };
    let id = event_id(&req)?;
    let operator = state.store.operator();
    let record = operator
        .event(&id)
        .await?
        .ok_or_else(|| ApiError::NoSuchEvent(id.to_string()))?;
    let page = operator.history(&id, before, limit).await?;
    let mut body = event_json(&record);
    body["attempt_count"] = record.attempts.into();
    body["attempts"] = page.attempts.iter().map(attempt_json).collect();
    body["attempts_total"] = page.total.into();
    body["attempts_before"] = page.before.into();
    body["routes"] = event_routes(&state, &id).await?.into();
    Ok(HttpResponse::Ok().json(body))
}

/// The event's row on each route of its provider (this one included), as summaries: a
/// route with no row did not take the event (its filter, or it was added since).
async fn event_routes(state: &AppState, id: &EventId) -> Result<Vec<Value>, ApiError> {
    let Some(provider) = state.providers.get(crate::key::provider_of(&id.provider)) else {
        return Ok(Vec::new());
    };
    let mut routes = Vec::with_capacity(provider.routes.len());
    for route in &provider.routes {
        let row = EventId::new(Arc::clone(&route.scope), Arc::clone(&id.key));
        let record = state.store.lookup(&row).await?;
        routes.push(route_json(&route.name, &route.scope, record.as_ref()));
    }
    Ok(routes)
}

/// One event's page of history: `limit` attempts (default [`HISTORY_PAGE`], at most
/// [`MAX_HISTORY_PAGE`]) numbered below `before` (default: the latest). The query form
/// names the event here too (read by [`event_id`]); no other field is taken.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    #[serde(rename = "provider")]
    _provider: Option<String>,
    #[serde(rename = "key")]
    _key: Option<String>,
    #[serde(rename = "route")]
    _route: Option<String>,
    limit: Option<u32>,
    before: Option<i64>,
}

async fn stats(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    // The queue's depth is read each time: its index holds only unfinished queue rows.
    let (counts, age) = state
        .stats
        .get(|| state.store.operator().status_counts())
        .await?;
    let depths = state.store.queue_depth().await?;
    // One entry per route, by its scope (a provider's main route is the provider's name).
    let mut names: Vec<&String> = state.routes.keys().collect();
    names.sort();
    let providers: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let route = &state.routes[name];
            let runtime = &state.providers[&*route.provider];
            let counts: serde_json::Map<String, Value> = counts
                .iter()
                .filter(|c| c.provider == *name)
                .map(|c| (c.status.clone(), json!(c.rows)))
                .collect();
            let depth = depths.iter().find(|d| d.provider == *name);
            let minutes: Vec<Value> = state
                .metrics
                .paths_per_minute(name)
                .into_iter()
                .map(|(minute, counts)| {
                    let counts: serde_json::Map<String, Value> = counts
                        .into_iter()
                        .map(|(path, n)| (path.to_owned(), json!(n)))
                        .collect();
                    json!({ "minute": minute, "counts": counts })
                })
                .collect();
            let gate = state.dispatcher.gate();
            json!({
                "name": name,
                "provider": &*route.provider,
                "route": &*route.name,
                "mode": runtime.mode.as_str(),
                "paused": gate.held(name),
                "target_pause_s": gate.target_pause_left(name).map(|left| left.as_secs_f64()),
                "counts": counts,
                "queue": {
                    "rows": depth.map_or(0, |d| d.rows),
                    "oldest_due_s": depth.map_or(0.0, |d| d.oldest_due.as_secs_f64()),
                },
                "paths_per_minute": minutes,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "providers": providers,
        "counts_age_s": age.as_secs_f64(),
        "counts_max_age_s": state.stats.max_age().as_secs_f64(),
    })))
}

async fn pause(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    set_paused(req, path.into_inner(), state, true).await
}

async fn resume(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    set_paused(req, path.into_inner(), state, false).await
}

/// Pauses or resumes `provider` (every route of it) or one route (`?route=`, or its scope
/// as the provider) in the store (every node follows within a poll) and on this node at
/// once.
async fn set_paused(
    req: HttpRequest,
    provider: String,
    state: web::Data<AppState>,
    paused: bool,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let named: RouteOnly = query(&req)?;
    let scope = scope_of(&provider, named.route.as_deref());
    let route = state
        .routes
        .get(&scope)
        .ok_or_else(|| ApiError::UnknownProvider(scope.clone()))?;
    state
        .store
        .operator()
        .set_paused(&route.scope, paused)
        .await?;
    state.operator_work.refresh_pauses().await?;
    if !paused {
        // A resume also ends the pause the target asked for, on this node (every route's,
        // for a provider).
        let gate = state.dispatcher.gate();
        for other in state.routes.values() {
            if other.scope == route.scope || other.provider == route.scope {
                gate.end_target_pause(&other.scope);
            }
        }
        state.dispatcher.signals().arrived();
    }
    Ok(HttpResponse::Ok().json(json!({ "provider": &*route.scope, "paused": paused })))
}

/// A bulk replay's request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobRequest {
    #[serde(default)]
    filter: SearchFilter,
    /// Narrows the filter's provider to one of its routes.
    route: Option<String>,
    /// Gives the matching events (done ones unless the filter names a status) to this
    /// route of their provider instead of replaying them: a job to a route.
    to_route: Option<String>,
    rate: Option<f64>,
}

impl JobRequest {
    /// The request in `payload`, read after [`authorize`] (a `web::Json` extractor would
    /// read the body before the token is checked, with no deadline).
    async fn read(
        req: &HttpRequest,
        payload: web::Payload,
        state: &AppState,
    ) -> Result<Self, ApiError> {
        let (bytes, _reserved) = body::read(req, payload, MAX_BODY_BYTES, state).await?;
        let mut request: Self =
            serde_json::from_slice(&bytes).map_err(|e| ApiError::BadJson(e.to_string()))?;
        if let Some(route) = request.route.take() {
            let provider = request
                .filter
                .provider
                .as_deref()
                .ok_or(ApiError::BadRequest("route: needs the filter's provider"))?;
            request.filter.provider = Some(scope_of(provider, Some(&route)));
        }
        Ok(request)
    }
}

/// The filter as a bulk replay reads it, or a 400.
fn replay_filter(filter: SearchFilter) -> Result<SearchFilter, ApiError> {
    jobs::normalize(filter).ok_or(ApiError::BadRequest(
        "a bulk replay takes dead letters (status dead) or failed queue rows (status failed)",
    ))
}

/// A job request's filter and the job's text: a replay's filter, or a job to a route (its
/// route one of the filter's provider's, not the one the filter reads), or a 400.
fn job_spec(request: JobRequest, state: &AppState) -> Result<(SearchFilter, String), ApiError> {
    let Some(to_route) = request.to_route else {
        let filter = replay_filter(request.filter)?;
        let text = serde_json::to_string(&filter).map_err(|_| ApiError::BadRequest("filter"))?;
        return Ok((filter, text));
    };
    let from = request
        .filter
        .provider
        .as_deref()
        .ok_or(ApiError::BadRequest(
            "to_route: needs the filter's provider",
        ))?;
    let provider = crate::key::provider_of(from);
    let scope = scope_of(provider, Some(&to_route));
    if !state.routes.contains_key(scope.as_str()) {
        return Err(ApiError::BadRequest(
            "to_route: not a route of the filter's provider",
        ));
    }
    if scope == from {
        return Err(ApiError::BadRequest(
            "to_route: the filter already reads that route's rows",
        ));
    }
    let filter = jobs::normalize_to_route(request.filter);
    let job = jobs::ToRoute {
        filter: filter.clone(),
        to_route,
    };
    let text = serde_json::to_string(&job).map_err(|_| ApiError::BadRequest("filter"))?;
    Ok((filter, text))
}

async fn plan(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let (filter, _) = job_spec(JobRequest::read(&req, payload, &state).await?, &state)?;
    let count = state.store.operator().count(&filter).await?;
    Ok(HttpResponse::Ok().json(json!({ "count": count, "filter": filter })))
}

async fn start_job(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let request = JobRequest::read(&req, payload, &state).await?;
    let rate = request.rate.unwrap_or(DEFAULT_RATE);
    let (filter, text) = job_spec(request, &state)?;
    if !(rate.is_finite() && rate > 0.0 && rate <= 10_000.0) {
        return Err(ApiError::BadRequest(
            "rate: replays a second, above 0, at most 10000",
        ));
    }
    let operator = state.store.operator();
    let total = operator.count(&filter).await?;
    let id = operator.create_job(&text, total, rate).await?;
    let job = operator
        .job(id)
        .await?
        .ok_or_else(|| ApiError::NoSuchEvent(format!("replay job {id}")))?;
    Ok(HttpResponse::Created().json(job_json(&job)))
}

async fn jobs(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let jobs = state.store.operator().jobs(50).await?;
    let jobs: Vec<Value> = jobs.iter().map(job_json).collect();
    Ok(HttpResponse::Ok().json(json!({ "jobs": jobs })))
}

async fn job(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let id = job_id(&req)?;
    let operator = state.store.operator();
    let job = operator
        .job(id)
        .await?
        .ok_or_else(|| ApiError::NoSuchEvent(format!("replay job {id}")))?;
    let items = operator.job_items(id, JOB_ITEMS).await?;
    let mut body = job_json(&job);
    // What the event it is on waits for (its provider's pause), as its item notes it.
    let waiting = items
        .iter()
        .find(|item| item.outcome == "running")
        .and_then(|item| item.detail.as_deref())
        .filter(|_| job.status == "running");
    body["waiting"] = json!(waiting);
    body["items"] = json!(items);
    Ok(HttpResponse::Ok().json(body))
}

async fn cancel_job(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let id = job_id(&req)?;
    let operator = state.store.operator();
    operator.cancel_job(id).await?;
    let job = operator
        .job(id)
        .await?
        .ok_or_else(|| ApiError::NoSuchEvent(format!("replay job {id}")))?;
    Ok(HttpResponse::Ok().json(job_json(&job)))
}

/// The `{id}` of a job's path, read after [`authorize`] (a `web::Path<i64>` extractor would
/// answer a caller without the token 404 in actix's words); one that is not a number names
/// no job.
fn job_id(req: &HttpRequest) -> Result<i64, ApiError> {
    let text = req.match_info().query("id");
    text.parse()
        .map_err(|_| ApiError::NoSuchEvent(format!("replay job {text}")))
}

fn job_json(job: &ReplayJob) -> Value {
    json!(job)
}
