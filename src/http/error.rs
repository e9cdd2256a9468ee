//! The one HTTP error type: it alone chooses the status code of every refused request.
//!
//! Every variant is something the caller can act on, with a JSON body
//! `{"error": "<code>", "message": "<text>"}`. Nothing refused here was claimed.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::key::KeyError;

/// Why a request was refused before any claim.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No `[[providers]]` entry has this name.
    #[error("unknown provider {0:?}")]
    UnknownProvider(String),
    /// The body is larger than `server.max_body_bytes`.
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    /// The body could not be read.
    #[error("the body could not be read: {0}")]
    BadBody(String),
    /// No valid idempotency key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// Only the documented methods are served.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// No such route.
    #[error("not found")]
    NotFound,
}

impl ApiError {
    /// The machine-readable code in the body and in `webhook.rejected` logs.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::UnknownProvider(_) => "unknown_provider",
            ApiError::TooLarge(_) => "body_too_large",
            ApiError::BadBody(_) => "bad_body",
            ApiError::Key(KeyError::NotJson) => "invalid_json",
            ApiError::Key(KeyError::Missing(_)) => "missing_key",
            ApiError::Key(_) => "invalid_key",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::NotFound => "not_found",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::UnknownProvider(_) | ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BadBody(_) | ApiError::Key(_) => StatusCode::BAD_REQUEST,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(serde_json::json!({
            "error": self.code(),
            "message": self.to_string(),
        }))
    }
}
