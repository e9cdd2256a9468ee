//! A scope's way back from a pause, as a circuit breaker's half-open state: one delivery
//! at once first (the probe), then one more for each delivery that succeeds — so a window
//! whose deliveries all succeed doubles every round trip (1, 2, 4, 8 …, TCP's slow start)
//! — up to the scope's ceiling, where the ramp ends; a failure halves the window, and a
//! failure at one pauses the scope again. Pure arithmetic on counts: the gate holds a ramp
//! per scope and knows when pauses end; this file knows no clock.

use std::time::Duration;

use crate::outcome::{DeadReason, Verdict};

/// A scope's window while it ramps up after a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ramp {
    /// Deliveries the scope may have open at once now.
    window: usize,
    /// Where the ramp ends (at least 1): the scope's `max_in_flight`, or the node's workers
    /// — past either the window would hold back nothing.
    ceiling: usize,
}

impl Ramp {
    /// A ramp at its start: one delivery at once.
    pub(super) fn start(ceiling: usize) -> Self {
        Self {
            window: 1,
            ceiling: ceiling.max(1),
        }
    }

    /// Deliveries the scope may have open at once now.
    pub(super) fn window(self) -> usize {
        self.window
    }

    /// Deliveries that may start beside the `in_flight` open now.
    pub(super) fn room(self, in_flight: usize) -> usize {
        self.window.saturating_sub(in_flight)
    }

    /// A delivery succeeded: one more may be open at once. `None` once the window reaches
    /// the ceiling: the ramp is over. The probe's success always ends a ceiling of one.
    pub(super) fn succeeded(self) -> Option<Self> {
        let window = self.window + 1;
        (window < self.ceiling).then_some(Self { window, ..self })
    }

    /// A delivery failed: half as many may be open at once. `None` when the window was one
    /// (the probe failed, or failures halved the window back to one): the scope pauses
    /// again, and its next ramp starts from one.
    pub(super) fn failed(self) -> Option<Self> {
        (self.window > 1).then_some(Self {
            window: self.window / 2,
            ..self
        })
    }
}

/// What a finished delivery says of its target, for the ramp after a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The target answered it for good — a 2xx, or a 4xx it will answer every time: it is
    /// up and answering, and the window widens.
    Answered,
    /// The target did not cope — a 5xx, 408, 429, a timeout, no connection, a `Retry-After`:
    /// the window narrows; a failed probe pauses the scope again for this long (the event's
    /// own wait, bounded).
    Failed(Duration),
    /// Nothing about the target: the delivery never reached it, or its outcome is unknown
    /// (a crash, a lost lease).
    Nothing,
}

impl Report {
    /// What `verdict` says of the target. A failure's wait is the event's own (its backoff,
    /// or the `Retry-After` it was given), or `first_backoff` for one that has none (an
    /// event that became a dead letter by failing once more), at most `most`
    /// (`queue.max_target_pause`: one event's wait must not stop a scope for hours).
    pub fn of(verdict: &Verdict, first_backoff: Duration, most: Duration) -> Self {
        match Self::unbounded(verdict, first_backoff) {
            Report::Failed(wait) => Report::Failed(wait.min(most)),
            report => report,
        }
    }

    fn unbounded(verdict: &Verdict, first_backoff: Duration) -> Self {
        match verdict {
            Verdict::Done(_) => Report::Answered,
            Verdict::Dead {
                reason: DeadReason::NonRetryable,
                ..
            } => Report::Answered,
            Verdict::Retry { retry_after, .. } | Verdict::Throttled { retry_after, .. } => {
                Report::Failed(Duration::from_secs(*retry_after))
            }
            Verdict::Dead {
                reason: DeadReason::AttemptsExhausted | DeadReason::ThrottledTooLong,
                ..
            } => Report::Failed(first_backoff),
            Verdict::Dead { .. } | Verdict::Release { .. } | Verdict::Unknown { .. } => {
                Report::Nothing
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::StoredResult;

    /// The windows a ramp goes through while every delivery succeeds.
    fn windows(ceiling: usize) -> Vec<usize> {
        let mut ramp = Some(Ramp::start(ceiling));
        let mut seen = Vec::new();
        while let Some(r) = ramp {
            seen.push(r.window());
            ramp = r.succeeded();
        }
        seen
    }

    #[test]
    fn a_ramp_widens_by_one_per_success_and_ends_at_its_ceiling() {
        assert_eq!(windows(5), [1, 2, 3, 4]);
        assert_eq!(windows(1), [1], "the probe's success ends a ceiling of one");
        assert_eq!(windows(0), [1], "a ceiling is at least one");
        // A window whose deliveries all succeed doubles each round trip.
        let mut ramp = Ramp::start(64);
        let mut rounds = vec![ramp.window()];
        for _ in 0..4 {
            for _ in 0..ramp.window() {
                ramp = ramp.succeeded().expect("below the ceiling");
            }
            rounds.push(ramp.window());
        }
        assert_eq!(rounds, [1, 2, 4, 8, 16]);
    }

    #[test]
    fn a_failure_halves_the_window_and_a_failure_at_one_pauses_again() {
        let mut ramp = Ramp::start(100);
        for _ in 0..8 {
            ramp = ramp.succeeded().unwrap();
        }
        assert_eq!(ramp.window(), 9);
        let ramp = ramp.failed().unwrap();
        assert_eq!(ramp.window(), 4);
        assert_eq!(ramp.room(3), 1);
        assert_eq!(ramp.room(6), 0, "more open than the window: none starts");
        let ramp = ramp.failed().unwrap().failed().unwrap();
        assert_eq!(ramp.window(), 1);
        assert_eq!(
            ramp.failed(),
            None,
            "at one, a failure pauses the scope again"
        );
        assert_eq!(Ramp::start(8).failed(), None, "a failed probe pauses again");
    }

    #[test]
    fn a_verdict_reports_an_answer_a_failure_with_its_wait_or_nothing() {
        let (first, most) = (Duration::from_secs(45), Duration::from_secs(60));
        let done = Verdict::Done(StoredResult::filtered(false));
        assert_eq!(Report::of(&done, first, most), Report::Answered);
        let refused = Verdict::Dead {
            error: "400".into(),
            reason: DeadReason::NonRetryable,
        };
        assert_eq!(Report::of(&refused, first, most), Report::Answered);
        let retry = Verdict::Retry {
            error: "500".into(),
            retry_after: 50,
        };
        assert_eq!(
            Report::of(&retry, first, most),
            Report::Failed(Duration::from_secs(50))
        );
        let far = Verdict::Retry {
            error: "500".into(),
            retry_after: 6 * 3600,
        };
        assert_eq!(
            Report::of(&far, first, most),
            Report::Failed(most),
            "bounded"
        );
        let throttled = Verdict::Throttled {
            error: "503".into(),
            retry_after: 2,
        };
        assert_eq!(
            Report::of(&throttled, first, most),
            Report::Failed(Duration::from_secs(2))
        );
        let exhausted = Verdict::Dead {
            error: "500".into(),
            reason: DeadReason::AttemptsExhausted,
        };
        assert_eq!(Report::of(&exhausted, first, most), Report::Failed(first));
        let crashed = Verdict::Unknown {
            error: "panic".into(),
        };
        assert_eq!(Report::of(&crashed, first, most), Report::Nothing);
        let released = Verdict::Release {
            error: "shutdown".into(),
        };
        assert_eq!(Report::of(&released, first, most), Report::Nothing);
    }
}
