//! `GET /healthz` (the process answers), `GET /readyz` (the store answers too) and
//! `GET /metrics` (Prometheus text).

use std::time::{Duration, Instant};

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::state::AppState;
use crate::shard::STORE_RETRY_AFTER_SECS;

/// 200 while the process serves HTTP.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// How old a store answer `/readyz` may repeat: unauthenticated callers cannot make it
/// cost more than a ping a second (on SQLite, the single writer's).
const READY_FOR: Duration = Duration::from_secs(1);

/// 200 when every shard is alive and the store answered a query at most [`READY_FOR`] ago,
/// else 503 (a load balancer stops sending).
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let crashed = state.dispatcher.crashed_shards();
    if !crashed.is_empty() {
        return HttpResponse::ServiceUnavailable()
            .json(json!({"status": "shard_crashed", "shards": crashed}));
    }
    let recent = state
        .readiness
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .filter(|(at, _)| at.elapsed() < READY_FOR)
        .map(|(_, answer)| answer);
    let answer = match recent {
        Some(answer) => answer,
        None => {
            let answer = state.store.ping().await.map_err(|e| e.to_string());
            *state.readiness.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((Instant::now(), answer.clone()));
            answer
        }
    };
    // Paused providers are not a fault: the node is ready, and says which it holds.
    let mut paused: Vec<&str> = state
        .providers
        .keys()
        .filter(|p| state.dispatcher.gate().held(p))
        .map(String::as_str)
        .collect();
    paused.sort_unstable();
    match answer {
        Ok(()) => HttpResponse::Ok().json(json!({"status": "ready", "paused": paused})),
        Err(e) => {
            slog::warn!(state.log, "readyz.store_unavailable"; "error" => %e);
            HttpResponse::ServiceUnavailable()
                .insert_header(("Retry-After", STORE_RETRY_AFTER_SECS.to_string()))
                .json(json!({"status": "store_unavailable"}))
        }
    }
}

/// The node's metrics in the Prometheus text format.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    state.metrics.body_bytes_in_flight(state.body_budget.used());
    let gate = state.dispatcher.gate();
    for provider in state.providers.keys() {
        let left = gate.target_pause_left(provider).unwrap_or_default();
        state.metrics.target_pause(provider, left.as_secs_f64());
    }
    for scope in state.routes.keys() {
        let window = gate.window(scope).unwrap_or(0);
        state.metrics.gate_window(scope, window);
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
