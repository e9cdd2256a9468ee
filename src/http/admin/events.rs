//! `GET /admin/events/{provider}/{key}`: one event's row, the oldest of the operators' reads
//! (the JSON API under `/admin/api/` has the same and its attempts).

use actix_web::{web, HttpRequest, HttpResponse};

use super::shared::{authorize, event_id, query, EventOnly};
use crate::http::error::ApiError;
use crate::http::event_json::event_json;
use crate::http::state::AppState;

/// Registers the route inside the `/admin/` scope.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/events/{provider}/{key}", web::get().to(show_event));
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
