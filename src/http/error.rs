//! The one HTTP error type: it alone chooses the status code of every refused request.
//!
//! Every variant is something the caller can act on, with a JSON body
//! `{"error": "<code>", "message": "<text>"}`. Nothing refused here was claimed.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::claim::Path;
use crate::key::KeyError;
use crate::shard::{BUSY_RETRY_AFTER_SECS, STORE_RETRY_AFTER_SECS};
use crate::signature::SignatureError;
use crate::store::StoreError;

/// Why a request was refused before any claim.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No `[[providers]]` entry has this name.
    #[error("unknown provider {0:?}")]
    UnknownProvider(String),
    /// The body is larger than its limit (`server.max_body_bytes`; an operator's, 64 KiB).
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    /// The body could not be read.
    #[error("the body could not be read: {0}")]
    BadBody(String),
    /// The body did not arrive within `server.read_timeout` (seconds).
    #[error("the body did not arrive within {0} s")]
    SlowBody(f64),
    /// No valid idempotency key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The signature is missing, malformed, stale or wrong.
    #[error(transparent)]
    Signature(#[from] SignatureError),
    /// Only the documented methods are served.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// No such route.
    #[error("not found")]
    NotFound,
    /// An admin route without the right bearer token.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// No row for this key.
    #[error("no event {0}")]
    NoSuchEvent(String),
    /// An operator's body is not the JSON its call takes (serde's words say where).
    #[error("the body is not the JSON this call takes: {0}")]
    BadJson(String),
    /// An operator's query string is not one its call takes.
    #[error("the query string is not one this call takes: {0}")]
    BadQuery(String),
    /// A request the API cannot take, saying why.
    #[error("{0}")]
    BadRequest(&'static str),
    /// A `cursor` that no page gave out.
    #[error("the cursor is not one a page gave out")]
    BadCursor,
    /// Only dead letters can be replayed.
    #[error("the event is {0}, not dead; only dead letters can be replayed")]
    NotDead(&'static str),
    /// The event's provider is paused (by an operator, or by its target's `Retry-After`):
    /// nothing is delivered to it, replays included, until it is resumed.
    #[error("provider {provider} is paused: {why}; resume it to replay its events")]
    Paused {
        /// The provider.
        provider: String,
        /// What holds it.
        why: String,
    },
    /// The node cannot take the request now.
    #[error("try again later ({0})")]
    Unavailable(&'static str),
    /// The node holds as many request bodies as its budget allows; nothing was claimed.
    #[error("overloaded: {0}")]
    Overloaded(&'static str),
    /// A stored body that does not open here (a key missing from `[store.encryption]`):
    /// the event, its column and the key's id, never the body.
    #[error("{0}")]
    Unreadable(String),
    /// The store failed; the cause is logged, not shown.
    #[error("the store is unavailable")]
    Store(StoreError),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Sealed(why) => ApiError::Unreadable(why.to_string()),
            e => ApiError::Store(e),
        }
    }
}

impl ApiError {
    /// The machine-readable code in the body and in `webhook.rejected` logs.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::UnknownProvider(_) => "unknown_provider",
            ApiError::TooLarge(_) => "body_too_large",
            ApiError::BadBody(_) => "bad_body",
            ApiError::SlowBody(_) => "request_timeout",
            ApiError::Key(KeyError::NotJson) => "invalid_json",
            ApiError::Key(KeyError::Missing(_)) => "missing_key",
            ApiError::Key(_) => "invalid_key",
            ApiError::Signature(e) => e.code(),
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::NotFound => "not_found",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NoSuchEvent(_) => "no_such_event",
            ApiError::NotDead(_) => "not_dead",
            ApiError::Paused { .. } => "paused",
            ApiError::BadJson(_) => "invalid_json",
            ApiError::BadQuery(_) => "bad_query",
            ApiError::BadCursor => "bad_cursor",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Overloaded(_) => "overloaded",
            ApiError::Unreadable(_) => "unreadable",
            ApiError::Store(_) => "store_unavailable",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::UnknownProvider(_) | ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::SlowBody(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::BadBody(_)
            | ApiError::Key(_)
            | ApiError::BadJson(_)
            | ApiError::BadQuery(_)
            | ApiError::BadCursor
            | ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized | ApiError::Signature(_) => StatusCode::UNAUTHORIZED,
            ApiError::NoSuchEvent(_) => StatusCode::NOT_FOUND,
            ApiError::NotDead(_) | ApiError::Paused { .. } => StatusCode::CONFLICT,
            ApiError::Unreadable(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) | ApiError::Overloaded(_) | ApiError::Store(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        match self {
            ApiError::Unauthorized => {
                response.insert_header(("WWW-Authenticate", "Bearer"));
            }
            ApiError::Unavailable(_) | ApiError::Store(_) => {
                response.insert_header(("Retry-After", STORE_RETRY_AFTER_SECS.to_string()));
            }
            ApiError::Overloaded(_) => {
                response.insert_header(("Retry-After", BUSY_RETRY_AFTER_SECS.to_string()));
                response.insert_header(("Hookgate-Path", Path::Overloaded.as_str()));
            }
            // The rest of a stalled body may never come: end the connection.
            ApiError::SlowBody(_) => {
                response.force_close();
            }
            _ => {}
        }
        // 5xx bodies say only what kind of trouble it is; the cause goes to the log.
        response.json(serde_json::json!({
            "error": self.code(),
            "message": self.to_string(),
        }))
    }
}
