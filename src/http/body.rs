//! Reading a request body: whole, within `server.read_timeout`, at most a limit, and inside
//! the node's budget of body bytes in flight — a sender's delivery and an operator's
//! request alike. It reads bytes only; what they mean is the caller's to judge, and a
//! caller that must check a token checks it before calling this.

use actix_web::http::header;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::HttpRequest;
use futures_util::StreamExt;

use super::budget::Reserved;
use super::error::ApiError;
use super::state::AppState;

/// The whole body of `req`, or the refusal: 413 past `limit` bytes (by the declared length
/// before a byte is read), 503 `overloaded` past the node's budget, 408 when it has not
/// arrived within `server.read_timeout` (and the connection is closed). Its bytes stay in
/// the budget until the returned [`Reserved`] is dropped.
pub(super) async fn read(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    state: &AppState,
) -> Result<(Bytes, Reserved), ApiError> {
    let mut reserved = state.body_budget.reserve();
    let body = tokio::time::timeout(
        state.read_timeout,
        read_within(req, payload, limit, &mut reserved),
    )
    .await
    .map_err(|_| ApiError::SlowBody(state.read_timeout.as_secs_f64()))??;
    Ok((body, reserved))
}

/// Reads the whole body, refusing it as soon as it passes `limit` bytes, or when the
/// node's budget of body bytes cannot hold it. `reserved` grows chunk by chunk with the
/// bytes that arrived, never by the declared length: a sender that declares a large body
/// and sends a few bytes holds a few bytes.
async fn read_within(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
    reserved: &mut Reserved,
) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::TooLarge(limit));
    }
    let over_budget = ApiError::Overloaded("the node holds as many request bodies as it may");
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::BadBody(e.to_string()))?;
        let total = body.len() + chunk.len();
        if total > limit {
            return Err(ApiError::TooLarge(limit));
        }
        if !reserved.grow_to(total) {
            return Err(over_budget);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}
