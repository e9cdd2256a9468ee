//! One received delivery on its way through a shard, and where its provider delivers.

use std::sync::Arc;

use actix_web::http::header::HeaderMap;
use actix_web::web::Bytes;

use crate::canonical::Fingerprinter;
use crate::claim::Mode;
use crate::key::EventId;
use crate::provider::{Route, Target};
use crate::trace::{TraceContext, Tracer, WallClock};

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
    /// The main route's filter did not accept this delivery: a claim that writes the
    /// event's row writes it [`Path::Filtered`](crate::claim::Path::Filtered), recorded
    /// done with nothing delivered. A redelivery's flag decides nothing: the row does.
    pub filtered: bool,
    /// The event's other routes that accept it: their rows are written in the commit that
    /// writes this event's row (its first claim, or its queue row), and delivered from
    /// there; a redelivery writes none.
    pub others: Vec<Arc<Route>>,
    /// Its provider's fingerprints, to fingerprint the body again under a stored row's
    /// kind (a row fingerprinted before a key rotation, or before encryption was on);
    /// `None` for an event read back from its row.
    pub fingerprinter: Option<Arc<Fingerprinter>>,
    /// The trace its attempts join (tracing on); `None` costs nothing.
    pub trace: Option<Arc<Traced>>,
}

/// How an event's attempts join its trace.
#[derive(Debug)]
pub struct Traced {
    /// The node's tracer.
    pub tracer: Arc<Tracer>,
    /// The span its attempts are children of: the request carrying it (sync mode), or the
    /// request that accepted it, read back from its row's kept `traceparent` (queue mode).
    pub parent: TraceContext,
    /// The trace starts at the attempt (`parent` names no span: an operator's replay, a
    /// row kept without a trace context).
    pub root: bool,
    /// The wall clock the event's spans are placed on here: one reading for the request
    /// and its attempt, so a child never starts before its parent.
    pub clock: WallClock,
}

impl Traced {
    /// `parent`, for `tracer`.
    pub fn new(tracer: &Arc<Tracer>, parent: TraceContext) -> Arc<Self> {
        Arc::new(Self {
            tracer: Arc::clone(tracer),
            parent,
            root: false,
            clock: WallClock::now(),
        })
    }

    /// A new trace, sampled by the ratio, whose root is the attempt.
    pub fn root(tracer: &Arc<Tracer>) -> Arc<Self> {
        Arc::new(Self {
            tracer: Arc::clone(tracer),
            parent: tracer.root(),
            root: true,
            clock: WallClock::now(),
        })
    }

    /// The trace context kept in a row's headers (a JSON object holding `traceparent`, and
    /// `tracestate` if any); a new trace, sampled by the ratio, when there is none.
    pub fn from_kept(tracer: &Arc<Tracer>, headers: Option<&str>) -> Arc<Self> {
        let kept = headers
            .and_then(|h| serde_json::from_str::<serde_json::Value>(h).ok())
            .and_then(|h| {
                let parent = h.get("traceparent")?.as_str()?;
                TraceContext::parse(parent, h.get("tracestate").and_then(|s| s.as_str()))
            });
        match kept {
            Some(parent) => Self::new(tracer, parent),
            None => Self::root(tracer),
        }
    }
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
            fingerprinter: None,
            trace: None,
        }
    }
}
