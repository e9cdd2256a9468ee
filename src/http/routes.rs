//! Every route of the HTTP surface, and the answers for a wrong method or path.

use actix_web::web;

use super::error::ApiError;
use super::{admin, health, ingest};

/// Registers every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/webhooks/{provider}")
            .route(web::post().to(ingest::ingest))
            .default_service(web::to(method_not_allowed)),
    )
    .service(web::resource("/healthz").route(web::get().to(health::healthz)))
    .service(web::resource("/readyz").route(web::get().to(health::readyz)))
    .service(web::resource("/metrics").route(web::get().to(health::metrics)))
    .configure(admin::routes)
    .default_service(web::to(not_found));
}

async fn method_not_allowed() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}
