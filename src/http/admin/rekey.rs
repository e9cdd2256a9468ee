//! A rekey as a job this node runs for an operator: `POST /admin/api/store/rekey` starts it
//! (`batch`, `rate` and `check` in the query), `GET` shows its progress, `DELETE` stops it
//! after its page. The job is `operator_work::rekey`'s, the same loop `hookgate store rekey`
//! runs.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::shared::{authorize, query};
use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::operator_work::rekey::{DEFAULT_BATCH, DEFAULT_RATE};

/// Registers the rekey routes inside the `/admin/` scope.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/store/rekey", web::post().to(start))
        .route("/api/store/rekey", web::get().to(status))
        .route("/api/store/rekey", web::delete().to(stop));
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartQuery {
    batch: Option<u32>,
    rate: Option<f64>,
    check: Option<bool>,
}

async fn start(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let q: StartQuery = query(&req)?;
    let batch = q.batch.unwrap_or(DEFAULT_BATCH);
    let rate = q.rate.unwrap_or(DEFAULT_RATE);
    if !((1..=10_000).contains(&batch) && rate.is_finite() && rate > 0.0) {
        return Err(ApiError::BadRequest(
            "batch is 1 to 10000 rows and rate a positive number of rows a second",
        ));
    }
    match state.rekey.start(
        std::sync::Arc::clone(&state.store),
        batch,
        rate,
        q.check.unwrap_or(false),
        state.log.clone(),
    ) {
        Ok(status) => Ok(HttpResponse::Accepted().json(status)),
        Err(why) => Ok(HttpResponse::Conflict()
            .json(serde_json::json!({ "error": "rekey_refused", "message": why }))),
    }
}

async fn status(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    match state.rekey.status() {
        Some(status) => Ok(HttpResponse::Ok().json(status)),
        None => Err(ApiError::NotFound),
    }
}

async fn stop(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    let stopping = state.rekey.stop();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "stopping": stopping })))
}
