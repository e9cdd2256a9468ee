//! The spans of one attempt (tracing on, a sampled trace): the attempt's own, a child of
//! the request that carried or accepted its event, and under it the claim (or take), the
//! delivery — whose id is the parent in the `traceparent` the target receives — and the
//! outcome write. Ids are drawn when the claim is won; the spans are recorded when the
//! attempt ends, timed by the monotonic clock and placed by the event's one wall-clock
//! reading, so a child never starts before its parent.

use std::sync::OnceLock;
use std::time::Instant;

use slog::{o, Logger};

use super::event::{Event, Traced};
use crate::claim::Path;
use crate::outcome::{DeliveryOutcome, Verdict};
use crate::store::{Fenced, StoreError};
use crate::trace::{new_span_id, Kind, Span, SpanId, TraceContext};

/// The ids and instants of an attempt's spans.
#[derive(Debug, Clone)]
pub(super) struct AttemptSpans {
    /// The attempt's own span.
    attempt: TraceContext,
    /// The delivery's span, the target's request's parent.
    delivery: SpanId,
    /// Just before the claim (or the take) was sent.
    sent: Instant,
    /// When the claim was won.
    claimed: Instant,
    /// The logger with the attempt's span ids, made once.
    log: OnceLock<Logger>,
}

/// What the spans say of the attempt besides its event.
pub(super) struct Attempted<'a> {
    pub(super) event: &'a Event,
    pub(super) path: Path,
    pub(super) attempts: i32,
    pub(super) tries: i32,
}

/// When an attempt's steps ended, for its spans.
pub(super) struct Timeline {
    /// A request reached (or was on its way to) the target: not a filtered event's, nor
    /// one never started.
    sent: bool,
    started: Instant,
    answered: Instant,
    ended: Instant,
}

impl Timeline {
    /// The steps so far, the attempt ending now.
    pub(super) fn ending_now(sent: bool, started: Instant, answered: Instant) -> Self {
        Self {
            sent,
            started,
            answered,
            ended: Instant::now(),
        }
    }
}

impl AttemptSpans {
    /// The spans of an attempt of `event` whose claim was sent at `sent` and won now; none
    /// unless its trace is sampled.
    pub(super) fn of(event: &Event, sent: Instant) -> Option<Self> {
        let traced = event.trace.as_ref().filter(|t| t.parent.sampled)?;
        Some(Self {
            attempt: traced.parent.child(),
            delivery: new_span_id(),
            sent,
            claimed: Instant::now(),
            log: OnceLock::new(),
        })
    }

    /// `log` with the attempt's span ids.
    pub(super) fn log(&self, log: &Logger) -> Logger {
        let ids = &self.attempt;
        self.log
            .get_or_init(|| {
                log.new(o!(
                    "trace_id" => hex::encode(ids.trace_id),
                    "span_id" => hex::encode(ids.span_id)))
            })
            .clone()
    }

    /// The delivery span's context: what the target's `traceparent` names.
    pub(super) fn delivery_context(&self) -> TraceContext {
        TraceContext {
            span_id: self.delivery,
            ..self.attempt.clone()
        }
    }

    /// Records the attempt with its claim, its delivery (the target's status) and its
    /// outcome write (what the fenced write did).
    pub(super) fn record(
        &self,
        traced: &Traced,
        what: &Attempted<'_>,
        t: &Timeline,
        status: Option<u16>,
        verdict: &Verdict,
        written: Option<&Result<Fenced, StoreError>>,
    ) {
        let tracer = &traced.tracer;
        let at = |i: Instant| traced.clock.ns(i);
        let own = Some(self.attempt.span_id);
        let child = |name, kind, id| {
            let context = TraceContext {
                span_id: id,
                ..self.attempt.clone()
            };
            move |at| Span::start(name, kind, &context, own, at)
        };
        let claim = child("claim", Kind::Internal, new_span_id())(at(self.sent));
        claim.end(tracer, at(self.claimed));

        let error = verdict_error(verdict);
        if t.sent {
            let mut delivery = child("deliver", Kind::Client, self.delivery)(at(t.started));
            delivery.set("http.request.method", "POST");
            if let Some(host) = host_of(&what.event.target.url) {
                delivery.set("server.address", host.to_owned());
            }
            if let Some(status) = status {
                delivery.set("http.response.status_code", i64::from(status));
            }
            if let Some(error) = &error {
                delivery.fail(error.clone());
            }
            delivery.end(tracer, at(t.answered));
        }

        if let Some(written) = written {
            let mut record = child("record", Kind::Internal, new_span_id())(at(t.answered));
            record.set(
                "hookgate.written",
                match written {
                    Ok(Fenced::Applied) => "applied",
                    Ok(Fenced::Stale) => "stale",
                    Err(_) => "failed",
                },
            );
            if let Err(e) = written {
                record.fail(e.to_string());
            }
            record.end(tracer, at(t.ended));
        }

        let mut attempt = Span::start(
            "attempt",
            Kind::Internal,
            &self.attempt,
            (!traced.root).then_some(traced.parent.span_id),
            at(self.sent),
        );
        let scope = &what.event.id.provider;
        match scope.split_once('.') {
            Some((provider, _)) => attempt.set("hookgate.provider", provider.to_owned()),
            None => attempt.set("hookgate.provider", scope),
        }
        attempt.set("hookgate.scope", scope);
        attempt.set("hookgate.event_key", &what.event.id.key);
        attempt.set("hookgate.attempt", i64::from(what.attempts));
        attempt.set("hookgate.try", i64::from(what.tries));
        attempt.set("hookgate.path", what.path.as_str());
        attempt.set("hookgate.mode", what.event.mode.as_str());
        let outcome = match what.path {
            Path::Filtered => "filtered",
            _ => verdict.label(),
        };
        attempt.set("hookgate.outcome", outcome);
        if let Some(status) = status {
            attempt.set("http.response.status_code", i64::from(status));
        }
        if let Verdict::Retry { retry_after, .. } | Verdict::Throttled { retry_after, .. } = verdict
        {
            attempt.set(
                "hookgate.retry_delay_s",
                i64::try_from(*retry_after).unwrap_or(i64::MAX),
            );
        }
        if let Some(error) = error {
            attempt.fail(error);
        }
        attempt.end(tracer, at(t.ended));
    }
}

/// Whether a request went to the target (a filtered event's, an unreadable one's and one
/// never started did not: their attempt has no delivery span).
pub(super) fn was_sent(outcome: &DeliveryOutcome) -> bool {
    !matches!(
        outcome,
        DeliveryOutcome::Filtered { .. }
            | DeliveryOutcome::Unreadable(_)
            | DeliveryOutcome::NotStarted(_)
    )
}

/// The error a verdict carries (none for a delivered or filtered event).
fn verdict_error(verdict: &Verdict) -> Option<String> {
    match verdict {
        Verdict::Done(_) => None,
        Verdict::Retry { error, .. }
        | Verdict::Dead { error, .. }
        | Verdict::Throttled { error, .. }
        | Verdict::Release { error }
        | Verdict::Unknown { error } => Some(error.clone()),
    }
}

/// The host of a target URL (never its user, path or query, which may hold a token).
fn host_of(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host.strip_prefix('[') {
        Some(v6) => &v6[..v6.find(']')?],
        None => host.split(':').next()?,
    };
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn a_target_urls_host_is_all_a_span_shows_of_it() {
        for (url, host) in [
            (
                "http://127.0.0.1:9000/effects?token=secret",
                Some("127.0.0.1"),
            ),
            (
                "https://user:pw@app.example.com/hooks",
                Some("app.example.com"),
            ),
            ("https://[::1]:8443/x", Some("::1")),
            ("https://app.example.com", Some("app.example.com")),
            ("not a url", None),
        ] {
            assert_eq!(host_of(url), host, "{url}");
        }
    }
}
