//! The senders of the queue-mode chaos run: each event is POSTed until a node takes it
//! (2xx) or the deadline, the way a real sender retries (after `Retry-After` on 409/503,
//! after a refused connection), alternating between the two nodes as a load balancer
//! would; a share of events is redelivered once more after acceptance. Records which
//! keys were accepted and every answer by status and `Hookgate-Path`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hookgate_kit::sender::post_event;

/// Events a sender redelivers once after its first 2xx, in percent (as a sender does whose
/// acknowledgement got lost).
const REDELIVER_PERCENT: u32 = 10;

/// What the senders saw, shared by all of them.
#[derive(Default)]
pub struct Sent {
    /// Keys a node answered 2xx: durable, owed a delivery.
    pub accepted: HashSet<String>,
    /// Answers by `status path`, and transport errors.
    pub answers: BTreeMap<String, usize>,
    /// Events never accepted before the deadline.
    pub gave_up: usize,
}

/// The senders' shared parts.
#[derive(Clone)]
pub struct Senders {
    client: awc::Client,
    /// `…/webhooks/{provider}` of node A and of node B.
    urls: [String; 2],
    pub sent: Rc<RefCell<Sent>>,
}

impl Senders {
    pub fn new(urls: [String; 2]) -> Self {
        let client = awc::Client::builder()
            .connector(awc::Connector::new().limit(512))
            .timeout(Duration::from_secs(30))
            .finish();
        Self {
            client,
            urls,
            sent: Rc::default(),
        }
    }

    /// Event `n`: delivered until accepted or `deadline`, then maybe redelivered.
    pub async fn event(&self, n: u64, deadline: Instant) {
        let key = format!("chaos-{n}");
        let body = format!(r#"{{"id":"{key}","type":"chaos.event","n":{n}}}"#);
        let first = (n % 2) as usize;
        if !self.deliver(&key, &body, first, deadline).await {
            self.sent.borrow_mut().gave_up += 1;
            return;
        }
        self.sent.borrow_mut().accepted.insert(key.clone());
        if fastrand::u32(0..100) < REDELIVER_PERCENT {
            actix_rt::time::sleep(Duration::from_millis(fastrand::u64(200..8_000))).await;
            self.deliver(&key, &body, 1 - first, deadline).await;
        }
    }

    /// POSTs until a 2xx (answers true) or the deadline.
    async fn deliver(&self, key: &str, body: &str, mut node: usize, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            let sent = post_event(&self.client, &self.urls[node], key, body).await;
            node = 1 - node;
            let reply = match sent {
                Ok(reply) => reply,
                Err(e) => {
                    let kind = match e {
                        awc::error::SendRequestError::Connect(_) => "connect error",
                        awc::error::SendRequestError::Timeout => "timeout",
                        _ => "send error",
                    };
                    self.note(kind.to_owned());
                    actix_rt::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
            };
            let (status, path, retry_after) = (reply.status, reply.path, reply.retry_after);
            self.note(format!("{status} {path}"));
            match status {
                200..=299 => return true,
                409 | 429 | 503 => {
                    let secs = retry_after.unwrap_or(1).clamp(1, 5);
                    actix_rt::time::sleep(Duration::from_secs(secs)).await;
                }
                _ => return false,
            }
        }
        false
    }

    fn note(&self, what: String) {
        *self.sent.borrow_mut().answers.entry(what).or_default() += 1;
    }
}
