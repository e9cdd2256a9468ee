//! The delivery seam: how one event is handed to the target application.
//!
//! [`HttpDelivery`] POSTs the original body over a pooled keep-alive client. Tests plug in
//! their own [`Delivery`] (for example one that panics) to exercise the worker's crash
//! handling. A delivery only reports what happened; it never touches the store.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::web::Bytes;
use futures_util::future::LocalBoxFuture;

use crate::claim::StoredResult;
use crate::outcome::DeliveryOutcome;
use crate::signature::standard::sign;

/// Largest target body cached as the replayable result, and the most of an answer read:
/// past it the node stops reading. A larger body is not kept: the result keeps its status
/// and content type and replays an empty body, and the history its first bytes. Webhook
/// handlers answer with a few bytes; this bounds the row, the in-memory cache and what one
/// answer can make a worker hold.
pub const RESULT_BODY_LIMIT: usize = 64 * 1024;

/// Everything a delivery needs, already decided by the shard.
#[derive(Debug, Clone)]
pub struct DeliveryRequest {
    /// The target URL.
    pub url: Arc<str>,
    /// The target's time limit (shorter than the lease, by config rule).
    pub timeout: Duration,
    /// The original body, byte for byte.
    pub body: Bytes,
    /// The original content type.
    pub content_type: Option<String>,
    /// `provider:key`, sent as `Idempotency-Key`.
    pub idempotency_key: String,
    /// The attempt number, sent as `Hookgate-Attempt`.
    pub attempt: i32,
    /// With a key, the request is signed the Standard Webhooks way (`webhook-id` = the
    /// idempotency key, `webhook-timestamp`, `webhook-signature`).
    pub signing_key: Option<Arc<[u8]>>,
    /// For an `https://` target: how its certificate is checked (system roots or the
    /// provider's `target.ca_file`, host name included).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// With tracing on: the `traceparent` sent (its parent is the attempt's delivery
    /// span) and the `tracestate` carried along.
    pub trace: Option<(String, Option<Arc<str>>)>,
}

/// The delivery seam.
pub trait Delivery: Send + Sync + 'static {
    /// Delivers one event. Runs on a worker actor's thread; may panic (the worker catches).
    fn deliver(&self, request: DeliveryRequest) -> LocalBoxFuture<'static, DeliveryOutcome>;
}

/// Delivery over HTTP/1.1 (TLS for `https://` targets) with keep-alive connections, pools
/// per worker thread. A certificate that does not verify fails the attempt with the
/// reason as its error — never a downgrade to plain HTTP.
#[derive(Debug, Default)]
pub struct HttpDelivery;

thread_local! {
    /// awc clients are bound to their thread; each arbiter thread keeps one pool for plain
    /// HTTP and one per TLS configuration (one per provider with an https:// target).
    static CLIENTS: RefCell<HashMap<usize, awc::Client>> = RefCell::new(HashMap::new());
}

/// The key of `tls`'s client in [`CLIENTS`].
fn slot(tls: Option<&Arc<rustls::ClientConfig>>) -> usize {
    tls.map_or(0, |c| Arc::as_ptr(c) as usize)
}

/// This thread's client for `tls` (`None`: plain HTTP). A client's connector fixes its TLS
/// settings, so each provider's settings get their own pool.
fn client(tls: Option<&Arc<rustls::ClientConfig>>) -> awc::Client {
    let slot = slot(tls);
    CLIENTS.with(|clients| {
        clients
            .borrow_mut()
            .entry(slot)
            .or_insert_with(|| {
                let builder = awc::Client::builder()
                    .disable_redirects()
                    .timeout(Duration::from_secs(3600));
                match tls {
                    Some(config) => builder
                        .connector(awc::Connector::new().rustls_0_23(Arc::clone(config)))
                        .finish(),
                    None => builder.finish(),
                }
            })
            .clone()
    })
}

impl Delivery for HttpDelivery {
    fn deliver(&self, request: DeliveryRequest) -> LocalBoxFuture<'static, DeliveryOutcome> {
        let client = client(request.tls.as_ref());
        Box::pin(async move {
            // The whole exchange, body included, ends by the target timeout: awc's own
            // timeout covers the wait for the answer's head only, and a target that sent
            // its status and then stalled its body would hold the attempt for ever.
            let deadline = tokio::time::Instant::now() + request.timeout;
            let mut outgoing = client
                .post(&*request.url)
                .timeout(request.timeout)
                .insert_header(("Idempotency-Key", request.idempotency_key.as_str()))
                .insert_header(("Hookgate-Attempt", request.attempt.to_string()));
            if let Some((traceparent, tracestate)) = &request.trace {
                outgoing = outgoing.insert_header(("traceparent", traceparent.as_str()));
                if let Some(state) = tracestate {
                    outgoing = outgoing.insert_header(("tracestate", &**state));
                }
            }
            if let Some(ct) = &request.content_type {
                outgoing = outgoing.insert_header(("Content-Type", ct.as_str()));
            }
            if let Some(key) = &request.signing_key {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
                let id = request.idempotency_key.as_str();
                let signature = sign(key, id, now, &request.body);
                outgoing = outgoing
                    .insert_header(("webhook-id", id))
                    .insert_header(("webhook-timestamp", now.to_string()))
                    .insert_header(("webhook-signature", signature));
            }
            let mut response = match outgoing.send_body(request.body).await {
                Ok(response) => response,
                Err(e) => return DeliveryOutcome::Unreachable(e.to_string()),
            };
            if response.status().is_informational() {
                // An interim head (`103 Early Hints`, an unasked `100 Continue`): awc takes
                // it for the answer and would pool its connection with the final answer
                // still to come, for the next request to read as its own. This thread's
                // pool is let go (its connections close once their requests end), and the
                // attempt is a failure whose outcome nobody knows: the target may have acted.
                CLIENTS.with(|clients| clients.borrow_mut().remove(&slot(request.tls.as_ref())));
                let status = response.status();
                return DeliveryOutcome::Unreachable(format!(
                    "the target sent an interim answer ({status}), which hookgate cannot read past"
                ));
            }
            let status = response.status().as_u16();
            let success = response.status().is_success();
            let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok());
            let retry_after = (!success)
                .then(|| header("Retry-After"))
                .flatten()
                .and_then(|v| retry_after_secs(v, SystemTime::now()));
            let content_type = success.then(|| header("Content-Type")).flatten();
            let content_type = content_type.map(str::to_owned);
            // A body that is too large, cut off or not finished by the deadline is not kept
            // (the status is what counts), but its first bytes go to the history.
            let (read, whole) = read_body(&mut response, deadline).await;
            let excerpt = (whole || !read.is_empty()).then(|| excerpt(&read));
            if !success {
                return DeliveryOutcome::Refused {
                    status,
                    retry_after,
                    excerpt,
                };
            }
            DeliveryOutcome::Delivered {
                result: StoredResult {
                    status,
                    content_type,
                    body: if whole { read } else { Vec::new() },
                },
                excerpt,
            }
        })
    }
}

/// Reads `response`'s body until it ends, [`RESULT_BODY_LIMIT`] is passed, the connection
/// fails or `deadline` comes: answers the bytes read (at most the limit) and whether they
/// are the whole body. Reading stops at the limit: the rest is never read into memory, and
/// the connection, dropped with its answer unfinished, is closed rather than pooled.
async fn read_body<S>(
    response: &mut awc::ClientResponse<S>,
    deadline: tokio::time::Instant,
) -> (Vec<u8>, bool)
where
    S: futures_util::Stream<Item = Result<Bytes, awc::error::PayloadError>> + Unpin,
{
    use futures_util::StreamExt as _;
    let mut read = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, response.next()).await {
            Ok(None) => return (read, true),
            Ok(Some(Ok(chunk))) => {
                let room = RESULT_BODY_LIMIT - read.len();
                if chunk.len() > room {
                    read.extend_from_slice(&chunk[..room]);
                    return (read, false);
                }
                read.extend_from_slice(&chunk);
            }
            Ok(Some(Err(_))) | Err(_) => return (read, false),
        }
    }
}

/// A `Retry-After` value read as RFC 9110 says: delay-seconds (a number too large for 64
/// bits is the largest one), or an HTTP-date (seconds from `now`, rounded up; 0 once past).
/// Anything else is no `Retry-After` at all. The judge bounds what this answers.
pub fn retry_after_secs(value: &str, now: SystemTime) -> Option<u64> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(value.parse().unwrap_or(u64::MAX));
    }
    let date: SystemTime = value
        .parse::<actix_web::http::header::HttpDate>()
        .ok()?
        .into();
    Some(
        date.duration_since(now)
            .map_or(0, |d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
    )
}

/// Bytes of a target's answer kept in an attempt's history.
pub const EXCERPT_BYTES: usize = 512;

/// The first [`EXCERPT_BYTES`] of an answer as text: invalid UTF-8 and NUL replaced (U+FFFD).
/// A Postgres text value cannot hold NUL, and an outcome write the store refuses would
/// hold its event forever.
pub fn excerpt(body: &[u8]) -> String {
    let cut = &body[..body.len().min(EXCERPT_BYTES)];
    crate::store::storable(&String::from_utf8_lossy(cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_bounded_text_without_nul() {
        assert_eq!(excerpt(b"o\0k\xff"), "o\u{fffd}k\u{fffd}");
        let long = excerpt(&[b'a'; 2 * EXCERPT_BYTES]);
        assert_eq!(long.len(), EXCERPT_BYTES);
    }

    #[test]
    fn retry_after_is_delay_seconds_or_an_http_date() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after_secs("120", now), Some(120));
        assert_eq!(retry_after_secs(" 0 ", now), Some(0));
        assert_eq!(
            retry_after_secs("18446744073709551616000", now),
            Some(u64::MAX)
        );
        let later = actix_web::http::header::HttpDate::from(now + Duration::from_secs(90));
        assert_eq!(retry_after_secs(&later.to_string(), now), Some(90));
        let earlier = actix_web::http::header::HttpDate::from(now - Duration::from_secs(90));
        assert_eq!(retry_after_secs(&earlier.to_string(), now), Some(0));
        for junk in ["", "soon", "-5", "1.5", "Tue, 99 Foo 2026"] {
            assert_eq!(retry_after_secs(junk, now), None, "{junk:?}");
        }
    }
}
