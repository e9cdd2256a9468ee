//! Every route of the HTTP surface, the answers for a wrong method or path, and the headers
//! every answer under `/admin/` carries.

use actix_web::http::header;
use actix_web::middleware::DefaultHeaders;
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
    // With the admin API disabled no `/admin/` route matches at all: the request meets
    // the node's 404 before any extractor reads it, so nothing shows the API.
    .service(
        web::scope("/admin")
            .guard(admin::enabled())
            .wrap(admin_headers())
            .configure(admin::console::routes)
            .configure(admin::events::routes)
            .configure(admin::dead::routes)
            .configure(admin::rekey::routes)
            .configure(admin::api::routes),
    )
    .default_service(web::to(not_found));
}

/// Headers on every answer under `/admin/` (errors, redirects and the scope's 404 too):
/// payloads, kept headers and tokens' answers stay out of browser and proxy caches, and no
/// answer is read as another type than the one it names.
fn admin_headers() -> DefaultHeaders {
    DefaultHeaders::new()
        .add((header::CACHE_CONTROL, "no-store"))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
}

async fn method_not_allowed() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}
