//! The HTTP surface: routes, the shared state handlers see, and nothing else.
//!
//! Handlers parse, verify and render; every decision about an event is the shard's.

mod admin;
mod error;
mod event_json;
mod health;
mod ingest;

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::web;

pub use error::ApiError;
pub use event_json::event_json;

use crate::config::Secret;
use crate::metrics::Metrics;
use crate::provider::Provider;
use crate::shard::Dispatcher;
use crate::store::Store;

/// State shared by every handler.
pub struct AppState {
    /// Providers by name.
    pub providers: HashMap<String, Provider>,
    /// The shards.
    pub dispatcher: Dispatcher,
    /// The store (for `/readyz`).
    pub store: Arc<dyn Store>,
    /// `server.max_body_bytes`.
    pub max_body_bytes: usize,
    /// `server.read_timeout`: the deadline for reading a request's body.
    pub read_timeout: std::time::Duration,
    /// Request-path logger.
    pub log: slog::Logger,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The admin bearer token; `None` disables `/admin/`.
    pub admin_token: Option<Secret>,
}

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
