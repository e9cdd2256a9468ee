//! W3C trace context (`traceparent`, `tracestate`): the ids a span is known by, read from a
//! request and written onto a delivery, and the sampling decision. Pure: no clock, no I/O.
//!
//! Only version `00` is written; a later version is read by its first four fields, as the
//! recommendation asks. A header that does not parse (or carries an all-zero id) is
//! ignored: the request starts a new trace.

use std::sync::Arc;

/// A trace id: 16 bytes, never all zero.
pub type TraceId = [u8; 16];
/// A span id: 8 bytes, never all zero.
pub type SpanId = [u8; 8];

/// The longest `tracestate` carried on (the recommendation's 32 members of 256 bytes is
/// more than anything sends; a longer one is dropped, never cut).
const MAX_TRACESTATE: usize = 512;

/// Where a span sits: its trace, its own id, whether the trace is sampled, and the
/// vendors' `tracestate` carried along unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace.
    pub trace_id: TraceId,
    /// The span this context names (a child's parent).
    pub span_id: SpanId,
    /// The `sampled` flag: spans of this trace are recorded.
    pub sampled: bool,
    /// `tracestate`, as received.
    pub state: Option<Arc<str>>,
}

impl TraceContext {
    /// Reads a `traceparent` value (and the request's `tracestate`, if any); `None` when
    /// it is not a valid W3C trace context.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let mut parts = traceparent.trim().split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || version.eq_ignore_ascii_case("ff") || !is_lower_hex(version) {
            return None;
        }
        // Version 00 has exactly four fields; a later one may have more.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        let trace_id: TraceId = decode(trace)?;
        let span_id: SpanId = decode(span)?;
        let [flags]: [u8; 1] = decode(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let state = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE && s.is_ascii())
            .map(Arc::from);
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
            state,
        })
    }

    /// The `traceparent` value naming this context (version 00).
    pub fn traceparent(&self) -> String {
        let mut text = [0u8; 55];
        text[..3].copy_from_slice(b"00-");
        // Lengths are exact: 32 and 16 hex digits.
        let _ = hex::encode_to_slice(self.trace_id, &mut text[3..35]);
        text[35] = b'-';
        let _ = hex::encode_to_slice(self.span_id, &mut text[36..52]);
        text[52..].copy_from_slice(if self.sampled { b"-01" } else { b"-00" });
        text.iter().map(|&b| char::from(b)).collect()
    }

    /// A context in the same trace for a new span (a child of this one).
    pub fn child(&self) -> Self {
        Self {
            span_id: new_span_id(),
            ..self.clone()
        }
    }

    /// A new trace, its root span sampled or not.
    pub fn root(sampled: bool) -> Self {
        Self {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            sampled,
            state: None,
        }
    }
}

/// The sampling rule for a trace that starts here, by its id: a trace is sampled when the
/// id's last 8 bytes, read as a number, fall below `ratio` of their range. Every node
/// (and any SDK using the same rule) decides the same for one trace id. An id a sender
/// chose is never decided this way (it could pick one that always passes): see
/// [`Sampler::draws`].
#[derive(Debug, Clone, Copy)]
pub struct Sampler {
    /// Ids whose last 8 bytes, shifted right by one, are below this are sampled.
    bound: u64,
    always: bool,
}

impl Sampler {
    /// Samples `ratio` (0.0–1.0) of the traces started here.
    pub fn new(ratio: f64) -> Self {
        let ratio = ratio.clamp(0.0, 1.0);
        Self {
            bound: (ratio * (1u64 << 63) as f64) as u64,
            always: ratio >= 1.0,
        }
    }

    /// Whether a trace with this id, started here, is sampled.
    pub fn samples(&self, trace_id: &TraceId) -> bool {
        if self.always {
            return true;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        (u64::from_be_bytes(low) >> 1) < self.bound
    }

    /// A draw of hookgate's own at the ratio: true for `ratio` of the calls, whatever any
    /// id says — the decision for a trace whose id the sender chose.
    pub fn draws(&self) -> bool {
        self.always || (fastrand::u64(..) >> 1) < self.bound
    }
}

/// A random trace id, never all zero.
pub fn new_trace_id() -> TraceId {
    loop {
        let id = fastrand::u128(..).to_be_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A random span id, never all zero.
pub fn new_span_id() -> SpanId {
    loop {
        let id = fastrand::u64(..).to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Exactly `N` bytes of lower-case hex.
fn decode<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_and_written_back_the_same() {
        let ctx = TraceContext::parse(VALID, Some("rojo=00f067aa0ba902b7")).unwrap();
        assert!(ctx.sampled);
        assert_eq!(ctx.traceparent(), VALID);
        assert_eq!(ctx.state.as_deref(), Some("rojo=00f067aa0ba902b7"));
        let child = ctx.child();
        assert_eq!(child.trace_id, ctx.trace_id);
        assert_ne!(child.span_id, ctx.span_id);
        let unsampled = TraceContext::parse(&VALID.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.sampled);
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba9g2b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad, None), None, "{bad:?}");
        }
        // A later version is read by its first four fields.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(TraceContext::parse(later, None).is_some());
    }

    #[test]
    fn a_tracestate_too_long_is_dropped_whole() {
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE);
        assert_eq!(TraceContext::parse(VALID, Some(&long)).unwrap().state, None);
    }

    #[test]
    fn the_sampler_keeps_its_ratio_and_decides_by_the_id() {
        assert!(Sampler::new(1.0).samples(&[0xff; 16]));
        assert!(!Sampler::new(0.0).samples(&[0; 16]));
        let half = Sampler::new(0.5);
        let mut low = [0u8; 16];
        low[8] = 0x7f;
        let mut high = [0u8; 16];
        high[8] = 0x80;
        assert!(half.samples(&low));
        assert!(!half.samples(&high));
        let tenth = Sampler::new(0.1);
        let kept = (0..20_000)
            .filter(|_| tenth.samples(&new_trace_id()))
            .count();
        assert!((1_500..2_500).contains(&kept), "{kept} of 20 000 at 0.1");
    }

    #[test]
    fn the_samplers_own_draw_keeps_its_ratio_and_no_id_decides_it() {
        assert!(Sampler::new(1.0).draws());
        assert!(!Sampler::new(0.0).draws());
        let tenth = Sampler::new(0.1);
        let drawn = (0..20_000).filter(|_| tenth.draws()).count();
        assert!((1_500..2_500).contains(&drawn), "{drawn} of 20 000 at 0.1");
        // An id whose last 8 bytes are zero passes `samples` at any ratio above 0; the
        // draw, at one in a billion, passes nothing.
        let tiny = Sampler::new(1e-9);
        let mut chosen = [0u8; 16];
        chosen[..8].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef]);
        assert!(tiny.samples(&chosen));
        assert_eq!((0..20_000).filter(|_| tiny.draws()).count(), 0);
    }
}
