//! `GET /healthz` (the process answers) and `GET /readyz` (the store answers too).

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::AppState;

/// 200 while the process serves HTTP.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// 200 when the store answers a query now, else 503 (a load balancer stops sending).
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    match state.store.ping().await {
        Ok(()) => HttpResponse::Ok().json(json!({"status": "ready"})),
        Err(e) => {
            slog::warn!(state.log, "readyz.store_unavailable"; "error" => %e);
            HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", "5"))
                .json(json!({"status": "store_unavailable"}))
        }
    }
}
