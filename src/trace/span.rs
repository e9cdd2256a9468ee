//! Spans as hookgate records them, and the node's [`Tracer`]: the handle every request and
//! attempt records through. A finished span is handed to the exporter's bounded queue with
//! `try_send`; a full queue drops it and counts it, never blocking a request and never
//! growing memory. With tracing off a node has no tracer, and nothing here runs.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot, Notify};

use super::context::{Sampler, SpanId, TraceContext, TraceId};

/// What a span is to the trace (OTLP's span kinds hookgate uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A step inside hookgate (an attempt, a claim, an outcome write).
    Internal,
    /// A request hookgate answered (a sender's POST).
    Server,
    /// A request hookgate made (the delivery to the target).
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text written in the code (a path, an outcome, a method): nothing allocated.
    Static(&'static str),
    /// Text of the event's (its key, its scope: shared, not copied).
    Str(Arc<str>),
    /// Other text.
    Owned(String),
    /// A whole number.
    Int(i64),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Self {
        Value::Static(s)
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Owned(s)
    }
}

impl From<&Arc<str>> for Value {
    fn from(s: &Arc<str>) -> Self {
        Value::Str(Arc::clone(s))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

/// One finished span, as exported.
#[derive(Debug, Clone)]
pub struct SpanRecord {
    /// Its trace.
    pub trace_id: TraceId,
    /// Its id.
    pub span_id: SpanId,
    /// Its parent's id (`None`: a root).
    pub parent: Option<SpanId>,
    /// Its name.
    pub name: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// Start, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_ns: u64,
    /// Its attributes (OpenTelemetry's names where one exists, `hookgate.*` otherwise).
    pub attributes: Vec<(&'static str, Value)>,
    /// An error's message: the span's status is then `ERROR`.
    pub error: Option<String>,
    /// The `tracestate` its context carried.
    pub state: Option<Arc<str>>,
    /// A span it is linked to, not a child of: an untrusted sender's
    /// (`tracing.trust_incoming = false`).
    pub link: Option<TraceContext>,
}

/// What a request's span keeps of the sender's trace context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// Nothing: no valid `traceparent`, or one not sampled (passed on as it came, nothing
    /// recorded here).
    None,
    /// The sender's span: the request span's parent (a trusted sender's sampled context).
    Parent(SpanId),
    /// The sender's context, linked from the request span, which starts a trace of
    /// hookgate's own (the sender is not trusted).
    Link(TraceContext),
}

/// This process's monotonic clock read against the wall clock once: instants (now or in
/// the past) placed on the wall clock consistently, so a child never starts before its
/// parent because the two were converted a few nanoseconds apart.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    instant: Instant,
    wall_ns: u64,
}

impl WallClock {
    /// Reads both clocks now.
    pub fn now() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            instant: Instant::now(),
            wall_ns: u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Nanoseconds since the Unix epoch at `at`.
    pub fn ns(&self, at: Instant) -> u64 {
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        match at.checked_duration_since(self.instant) {
            Some(later) => self.wall_ns.saturating_add(ns(later)),
            None => self
                .wall_ns
                .saturating_sub(ns(self.instant.duration_since(at))),
        }
    }
}

/// The node's tracer: how traces start here, and the exporter's queue.
#[derive(Debug)]
pub struct Tracer {
    sampler: Sampler,
    /// A sender's `traceparent` is continued (`tracing.trust_incoming`); otherwise linked.
    trust_incoming: bool,
    queue: mpsc::Sender<SpanRecord>,
    /// Wakes the exporter once a batch's worth is queued (it is not woken per span: it
    /// drains the queue when told, or every `flush_interval`).
    full: Arc<Notify>,
    batch_size: usize,
    /// Asks the exporter to send every span queued now; answered once sent.
    flushes: mpsc::UnboundedSender<oneshot::Sender<()>>,
    dropped: Counter,
}

impl Tracer {
    /// A tracer sampling `ratio` of the traces started here, continuing a sender's context
    /// if `trust_incoming` (linking it otherwise), its spans sent to `queue` (and flushes
    /// asked on `flushes`), counting those a full queue dropped on `dropped`.
    pub fn new(
        ratio: f64,
        trust_incoming: bool,
        queue: mpsc::Sender<SpanRecord>,
        (full, batch_size): (Arc<Notify>, usize),
        flushes: mpsc::UnboundedSender<oneshot::Sender<()>>,
        dropped: Counter,
    ) -> Self {
        Self {
            sampler: Sampler::new(ratio),
            trust_incoming,
            queue,
            full,
            batch_size,
            flushes,
            dropped,
        }
    }

    /// Has the exporter send every span queued now, waiting at most `within`; whether it
    /// did (a node's stop: its last attempts' spans are not lost with the process).
    /// What it could not send is counted dropped: it ends with the process.
    pub async fn flush(&self, within: std::time::Duration) -> bool {
        let (done, sent) = oneshot::channel();
        let flushed = self.flushes.send(done).is_ok()
            && matches!(tokio::time::timeout(within, sent).await, Ok(Ok(())));
        if !flushed {
            let queued = self.queue.max_capacity() - self.queue.capacity();
            self.dropped.inc_by(queued as u64);
        }
        flushed
    }

    /// A draw of hookgate's own at the ratio: whether a request refused before any claim,
    /// in a sender's sampled trace, is recorded. Never decided by the trace id: the sender
    /// chose it, and could choose one the ratio always passes.
    pub fn draws(&self) -> bool {
        self.sampler.draws()
    }

    /// The context of a request's span, and what it keeps of the sender's: trusted, a
    /// child of the sender's `traceparent` (its sampling decision kept); untrusted, the
    /// root of a new trace sampled by the ratio, linked to the sender's span; without one,
    /// the root of a new trace sampled by the ratio.
    pub fn request(
        &self,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> (TraceContext, Upstream) {
        match traceparent.and_then(|t| TraceContext::parse(t, tracestate)) {
            // Nothing continued from outside: not its id, its decision nor its tracestate.
            Some(sender) if !self.trust_incoming => (self.root(), Upstream::Link(sender)),
            Some(parent) if parent.sampled => {
                let span = parent.span_id;
                (parent.child(), Upstream::Parent(span))
            }
            // Not sampled: nothing is recorded here, so the sender's context is passed on
            // as it came (the application's spans stay the sender's span's children).
            Some(parent) => (parent, Upstream::None),
            None => (self.root(), Upstream::None),
        }
    }

    /// The root context of a new trace, sampled by the ratio.
    pub fn root(&self) -> TraceContext {
        let mut root = TraceContext::root(true);
        root.sampled = self.sampler.samples(&root.trace_id);
        root
    }

    /// Hands a finished span to the exporter; counts it dropped when the queue is full (or
    /// the exporter is gone).
    pub fn record(&self, span: SpanRecord) {
        if self.queue.try_send(span).is_err() {
            self.dropped.inc();
        } else if self.queue.max_capacity() - self.queue.capacity() >= self.batch_size {
            self.full.notify_one();
        }
    }

    /// Spans dropped so far (the queue was full).
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

/// A sampled span being timed: started now, recorded by [`Span::end`].
#[derive(Debug)]
pub struct Span {
    record: SpanRecord,
}

impl Span {
    /// A span named `name` at `context` (its own ids), child of `parent`, started at `at`
    /// (nanoseconds since the Unix epoch, see [`WallClock`]).
    pub fn start(
        name: &'static str,
        kind: Kind,
        context: &TraceContext,
        parent: Option<SpanId>,
        at: u64,
    ) -> Self {
        Self {
            record: SpanRecord {
                trace_id: context.trace_id,
                span_id: context.span_id,
                parent,
                name,
                kind,
                start_ns: at,
                end_ns: 0,
                attributes: Vec::new(),
                error: None,
                state: context.state.clone(),
                link: None,
            },
        }
    }

    /// Links the span to `to` (a span of another trace, not its parent).
    pub fn link(&mut self, to: TraceContext) {
        self.record.link = Some(to);
    }

    /// Sets an attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.record.attributes.push((key, value.into()));
    }

    /// Marks the span failed with `message`.
    pub fn fail(&mut self, message: impl Into<String>) {
        self.record.error = Some(message.into());
    }

    /// Ends the span at `at` (as [`Span::start`]) and hands it to `tracer`.
    pub fn end(mut self, tracer: &Tracer, at: u64) {
        self.record.end_ns = at.max(self.record.start_ns);
        tracer.record(self.record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_never_blocks() {
        let (tx, mut rx) = mpsc::channel(2);
        let (flushes, _) = mpsc::unbounded_channel();
        let tracer = Tracer::new(
            1.0,
            true,
            tx,
            (Arc::default(), 1),
            flushes,
            Counter::default(),
        );
        let (ctx, parent) = tracer.request(None, None);
        assert!(ctx.sampled && parent == Upstream::None);
        for _ in 0..5 {
            Span::start("attempt", Kind::Internal, &ctx, None, 1).end(&tracer, 2);
        }
        assert_eq!(tracer.dropped(), 3);
        assert_eq!(rx.recv().await.unwrap().name, "attempt");
    }

    #[test]
    fn a_senders_context_is_continued_with_its_decision() {
        let (tx, _rx) = mpsc::channel(1);
        let (flushes, _) = mpsc::unbounded_channel();
        let tracer = Tracer::new(
            0.0,
            true,
            tx,
            (Arc::default(), 1),
            flushes,
            Counter::default(),
        );
        let sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (ctx, parent) = tracer.request(Some(sent), Some("k=v"));
        assert!(
            ctx.sampled,
            "a sampled parent stays sampled whatever the ratio"
        );
        assert_eq!(
            hex::encode(ctx.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let span = hex::decode("00f067aa0ba902b7").unwrap();
        assert_eq!(parent, Upstream::Parent(span.try_into().unwrap()));
        assert_eq!(ctx.state.as_deref(), Some("k=v"));
        let unsampled = sent.replace("-01", "-00");
        let (passed, parent) = tracer.request(Some(&unsampled), None);
        assert_eq!((passed.traceparent(), parent), (unsampled, Upstream::None));
        let (root, _) = tracer.request(Some("garbage"), None);
        assert!(!root.sampled, "a new trace follows the ratio (0 here)");
    }

    #[test]
    fn an_untrusted_senders_context_is_linked_from_a_trace_of_hookgates_own() {
        let (flushes, _) = mpsc::unbounded_channel();
        let (tx, _rx) = mpsc::channel(1);
        let tracer = Tracer::new(
            0.0,
            false,
            tx,
            (Arc::default(), 1),
            flushes,
            Counter::default(),
        );
        let sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (ctx, upstream) = tracer.request(Some(sent), Some("k=v"));
        let Upstream::Link(sender) = upstream else {
            panic!("linked: {upstream:?}");
        };
        assert_eq!(sender.traceparent(), sent);
        assert_eq!(sender.state.as_deref(), Some("k=v"));
        assert_ne!(ctx.trace_id, sender.trace_id);
        assert!(
            !ctx.sampled,
            "hookgate's ratio (0 here) decides, not the sender's flag"
        );
        assert_eq!(ctx.state, None, "nothing continued from outside");
        let (flushes, _) = mpsc::unbounded_channel();
        let (tx, _rx) = mpsc::channel(1);
        let all = Tracer::new(
            1.0,
            false,
            tx,
            (Arc::default(), 1),
            flushes,
            Counter::default(),
        );
        let (ctx, upstream) = all.request(Some(&sent.replace("-01", "-00")), None);
        assert!(
            ctx.sampled,
            "an unsampled sender's request is still sampled here"
        );
        assert!(matches!(upstream, Upstream::Link(s) if !s.sampled));
    }

    #[test]
    fn past_instants_are_placed_on_the_wall_clock() {
        let now = Instant::now();
        let earlier = now
            .checked_sub(std::time::Duration::from_millis(500))
            .unwrap();
        let clock = WallClock::now();
        assert_eq!(clock.ns(now) - clock.ns(earlier), 500_000_000);
        let later = now + std::time::Duration::from_millis(1);
        assert_eq!(clock.ns(later) - clock.ns(now), 1_000_000);
    }
}
