//! Dead letters: `GET /admin/dead` lists them (a page, bounded), and replaying one, which
//! `POST /admin/dead/{provider}/{key}/replay` and the JSON API's replay routes share.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::shared::{authorize, bounded, event_id, query, scope_of, EventOnly};
use crate::claim::{Path, Status};
use crate::http::error::ApiError;
use crate::http::event_json::event_json;
use crate::http::state::AppState;
use crate::key::EventId;
use crate::shard::gate::Hold;
use crate::shard::Reply;
use crate::store::operator::SearchFilter;
use crate::store::PageCursor;

/// Dead letters listed when no `limit` is given, and the most one request may ask for.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 1000;

/// Registers the dead-letter routes inside the `/admin/` scope.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/dead", web::get().to(list_dead))
        .route("/dead/{provider}/{key}/replay", web::post().to(replay));
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadQuery {
    provider: Option<String>,
    /// Narrows `provider` to one of its routes.
    route: Option<String>,
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
        provider: query
            .provider
            .as_deref()
            .map(|p| scope_of(p, query.route.as_deref())),
        status: Some(Status::Dead),
        ..SearchFilter::default()
    };
    let page = state
        .store
        .operator()
        .search(&filter, after.as_ref(), limit)
        .await?;
    Ok(HttpResponse::Ok().json(bounded(&page, "dead")))
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
    let route = state
        .routes
        .get(&*named.provider)
        .ok_or_else(|| ApiError::UnknownProvider(named.provider.to_string()))?;
    let id = EventId::new(Arc::clone(&route.scope), named.key);
    let paused = |hold: Option<Hold>| ApiError::Paused {
        provider: route.scope.to_string(),
        why: hold.map_or_else(|| "held".into(), Hold::describe),
    };
    let gate = state.dispatcher.gate();
    if let Some(hold) = gate.hold_of(&route.scope) {
        return Err(paused(Some(hold)));
    }
    let answer = state
        .dispatcher
        .replay(id.clone(), Arc::clone(&route.target))
        .await;
    if let Reply::RetryLater { reason, .. } = answer.reply {
        if answer.path == Path::Paused {
            return Err(paused(gate.hold_of(&route.scope)));
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
