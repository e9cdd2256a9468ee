//! Every route of the HTTP surface, and the answers for a wrong method or path.

use actix_web::web;

use super::error::ApiError;
use super::{admin, admin_api, console, health, ingest};

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
    // With the admin API disabled no `/admin/` route matches at all: the request meets
    // the node's 404 before any extractor reads it, so nothing shows the API.
    .service(
        web::scope("/admin")
            .guard(admin::enabled())
            .configure(console::routes)
            .configure(admin::routes)
            .configure(admin_api::routes),
    )
    .default_service(web::to(not_found));
}

async fn method_not_allowed() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}
