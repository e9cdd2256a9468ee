//! One POST of an event the way the benches' senders make it — a JSON body, the key in
//! `X-Idempotency-Key` — and what came back: status, `Hookgate-Path`, `Retry-After` and
//! body. The retry loops around it (what counts as done, how long to wait) are each
//! scenario's own.

use actix_web::web::Bytes;
use awc::error::SendRequestError;

/// A node's answer to one POST.
pub struct Reply {
    /// Its HTTP status.
    pub status: u16,
    /// `Hookgate-Path`, or `-` when the answer has none.
    pub path: String,
    /// `Retry-After` in seconds, when it is a number.
    pub retry_after: Option<u64>,
    /// The body; empty if it could not be read.
    pub body: Bytes,
}

/// POSTs `body` for `key` to `url` and reads the whole answer.
pub async fn post_event(
    client: &awc::Client,
    url: &str,
    key: &str,
    body: &str,
) -> Result<Reply, SendRequestError> {
    let mut response = client
        .post(url)
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-Idempotency-Key", key))
        .send_body(body.to_owned())
        .await?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let path = header("Hookgate-Path").unwrap_or_else(|| "-".into());
    let retry_after = header("Retry-After").and_then(|v| v.parse::<u64>().ok());
    let body = response.body().await.unwrap_or_default();
    Ok(Reply {
        status: response.status().as_u16(),
        path,
        retry_after,
        body,
    })
}
