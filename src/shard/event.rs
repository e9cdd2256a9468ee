//! One received delivery on its way through a shard, and where its provider delivers.

use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use actix_web::web::Bytes;

use crate::claim::Mode;
use crate::key::EventId;
use crate::provider::{Route, Target};

/// One received, verified, keyed delivery.
#[derive(Debug, Clone)]
pub struct Event {
    /// Provider and key.
    pub id: EventId,
    /// The raw body.
    pub body: Bytes,
    /// The sender's content type.
    pub content_type: Option<String>,
    /// Fingerprint of the payload, `None` when fingerprints are off.
    pub fingerprint: Option<String>,
    /// Where it goes.
    pub target: Arc<Target>,
    /// The request's headers, kept with the payload if the event fails.
    pub headers: HeaderMap,
    /// Sync (a sender waits) or queue (hookgate delivers and redelivers).
    pub mode: Mode,
    /// Its target's filter did not accept it: a won claim records it done as
    /// [`Path::Filtered`](crate::claim::Path::Filtered), and nothing is delivered.
    pub filtered: bool,
    /// The event's other routes that accept it: their rows are written in the commit that
    /// wins this event's claim (or writes its queue row), and delivered from there.
    pub others: Vec<Arc<Route>>,
}

impl Event {
    /// An event known only by its key (an operator's request before its row is read).
    pub fn bare(id: EventId, target: Arc<Target>) -> Self {
        Self {
            id,
            body: Bytes::new(),
            content_type: None,
            fingerprint: None,
            target,
            headers: HeaderMap::new(),
            mode: Mode::Sync,
            filtered: false,
            others: Vec::new(),
        }
    }
}
