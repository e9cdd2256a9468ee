//! What one delivery's outcome means for the row and the sender: done, retry later, dead
//! letter, released (never started), or unknown (the worker crashed). Owns the words for
//! it — [`DeliveryOutcome`], [`DeadReason`], [`Verdict`] — and the pure rule ([`judge`]).
//! Imports only the core: the attempt runner writes the row and answers.

use std::time::Duration;

use crate::claim::StoredResult;
use crate::retry::RetryPolicy;

/// What the target did with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// A 2xx answer; the event is done.
    Delivered {
        /// What a duplicate is answered with (its body empty when the answer was too large
        /// to keep, or not finished in time).
        result: StoredResult,
        /// The first bytes of the answer, for the attempt's history (`None`: none arrived).
        excerpt: Option<String>,
    },
    /// A non-2xx answer.
    Refused {
        /// The target's status.
        status: u16,
        /// The target's `Retry-After`, in seconds, if it sent one (as sent: the judge holds
        /// it within the retry policy's bounds).
        retry_after: Option<u64>,
        /// The first bytes of its answer, for the attempt's history.
        excerpt: Option<String>,
    },
    /// No answer: timeout, connection refused, broken connection.
    Unreachable(String),
    /// The delivery was not started: the lease no longer covered the target's timeout,
    /// or the node was shutting down. The target never saw it.
    NotStarted(String),
    /// The delivery code panicked; the worker was restarted. The attempt's outcome is
    /// unknown, so its row keeps its lease and is retaken after it expires.
    Crashed(String),
    /// Not sent: the row's kept body did not open (the reason names the key it needs).
    /// The event is a dead letter `unreadable`, its stored body left as it was.
    Unreadable(String),
    /// Not sent: the main route's filter did not accept the event's first delivery. The
    /// event is done on the main route, with [`StoredResult::filtered`]; `routed` when
    /// other routes took it (their rows were written with its claim).
    Filtered {
        /// Other routes have the event.
        routed: bool,
    },
}

/// Why an event became a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// `retry.max_attempts` attempts failed.
    AttemptsExhausted,
    /// The target refused the event with a non-retryable 4xx.
    NonRetryable,
    /// An operator's replay failed; no sender will redeliver it, so it is dead again.
    ReplayFailed,
    /// A sync-mode event nobody delivered for longer than its sender retries.
    SenderGaveUp,
    /// A queue event the target kept asking to be sent later (429/503 with
    /// `Retry-After`) past its provider's horizon.
    ThrottledTooLong,
    /// A queue event whose provider was removed from the config: nobody can deliver it.
    ProviderRemoved,
    /// A queue event whose kept body did not open when it was taken (its key is not
    /// configured on the node that took it, encryption is off, the body was moved, or it
    /// is plaintext where a sealed value is required): nothing was delivered; an operator
    /// replays it once the key is back.
    Unreadable,
}

impl DeadReason {
    /// The text stored in `dead_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::AttemptsExhausted => "attempts_exhausted",
            DeadReason::NonRetryable => "non_retryable",
            DeadReason::ReplayFailed => "replay_failed",
            DeadReason::SenderGaveUp => "sender_gave_up",
            DeadReason::ThrottledTooLong => "throttled_too_long",
            DeadReason::ProviderRemoved => "provider_removed",
            DeadReason::Unreadable => "unreadable",
        }
    }
}

/// The decision for one finished attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Mark the row done with this result and answer it.
    Done(StoredResult),
    /// Mark the row failed; the sender retries after `retry_after` seconds.
    Retry {
        /// What went wrong.
        error: String,
        /// Seconds for `Retry-After`.
        retry_after: u64,
    },
    /// Make the row a dead letter; the sender is told to stop.
    Dead {
        /// What went wrong.
        error: String,
        /// Why no retry will help.
        reason: DeadReason,
    },
    /// Queue mode: the target asked to be left alone for `retry_after` seconds (429 or 503
    /// with `Retry-After`): mark the row failed, due then, whatever the attempt count — the
    /// provider's deliveries slow down instead of burning attempts.
    Throttled {
        /// What the target answered.
        error: String,
        /// Seconds the target asked for.
        retry_after: u64,
    },
    /// The attempt never reached the target (its lease no longer covered the target's
    /// timeout, or the node was shutting down): mark the row failed, whatever the attempt
    /// count; the sender retries soon.
    Release {
        /// Why it did not start.
        error: String,
    },
    /// The worker crashed, or the runner hung up on the target when it could not confirm
    /// its lease: nobody knows whether the target acted. The row keeps its lease and is
    /// retaken after it expires.
    Unknown {
        /// What happened.
        error: String,
    },
}

impl Verdict {
    /// Its name in `hookgate_deliveries_total{outcome}` and an attempt's span.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Done(_) => "delivered",
            Verdict::Retry { .. } => "failed",
            Verdict::Dead { .. } => "dead",
            Verdict::Throttled { .. } => "throttled",
            Verdict::Release { .. } => "not_started",
            Verdict::Unknown { .. } => "crashed",
        }
    }
}

/// Target statuses worth retrying: timeouts, too early, rate limits and server errors.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 425 | 429) || (500..=599).contains(&status)
}

/// Who redelivers a failed attempt, which changes what a failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeliverer {
    /// The sender (sync mode): a failure is answered with our backoff.
    Sender,
    /// hookgate itself (queue mode): a target's `Retry-After` on 429/503 pauses, and does
    /// not count against the attempts — until the pause would reach past the event's
    /// horizon (`horizon_left` from now), which makes it a dead letter.
    Queue {
        /// How much longer the event may wait for its delivery.
        horizon_left: Duration,
    },
    /// Nobody (an operator's replay): a failure is dead again at once.
    Nobody,
}

/// Judges attempt number `attempt` from its outcome, given who would redeliver it.
pub fn judge(
    outcome: DeliveryOutcome,
    attempt: i32,
    policy: &RetryPolicy,
    redeliverer: Redeliverer,
) -> Verdict {
    let attempt = u32::try_from(attempt).unwrap_or(0);
    if let Redeliverer::Queue { horizon_left } = redeliverer {
        if let DeliveryOutcome::Refused {
            status: status @ (429 | 503),
            retry_after: Some(asked),
            ..
        } = outcome
        {
            let retry_after = policy.bounded_retry_after(asked);
            if Duration::from_secs(retry_after) >= horizon_left {
                return Verdict::Dead {
                    error: format!(
                        "target answered {status}, retry after {asked} s: past the event's horizon"
                    ),
                    reason: DeadReason::ThrottledTooLong,
                };
            }
            return Verdict::Throttled {
                error: format!("target answered {status}, retry after {retry_after} s"),
                retry_after,
            };
        }
    }
    let replay = redeliverer == Redeliverer::Nobody;
    let (error, target_retry_after) = match outcome {
        DeliveryOutcome::Delivered { result, .. } => return Verdict::Done(result),
        DeliveryOutcome::Filtered { routed } => {
            return Verdict::Done(StoredResult::filtered(routed))
        }
        DeliveryOutcome::Unreadable(error) => {
            return Verdict::Dead {
                error,
                reason: DeadReason::Unreadable,
            }
        }
        DeliveryOutcome::Crashed(error) => {
            return Verdict::Unknown {
                error: format!("worker crashed: {error}"),
            }
        }
        // A replay nobody redelivers: a dead letter again, to be replayed later.
        DeliveryOutcome::NotStarted(error) if replay => {
            return Verdict::Dead {
                error: format!("the replay did not start: {error}"),
                reason: DeadReason::ReplayFailed,
            }
        }
        DeliveryOutcome::NotStarted(error) => return Verdict::Release { error },
        DeliveryOutcome::Refused { status, .. } if !is_retryable_status(status) => {
            return Verdict::Dead {
                error: format!("target answered {status}"),
                reason: DeadReason::NonRetryable,
            }
        }
        DeliveryOutcome::Refused {
            status,
            retry_after,
            ..
        } => (format!("target answered {status}"), retry_after),
        DeliveryOutcome::Unreachable(error) => (format!("target unreachable: {error}"), None),
    };
    if replay {
        return Verdict::Dead {
            error,
            reason: DeadReason::ReplayFailed,
        };
    }
    if policy.exhausted(attempt) {
        return Verdict::Dead {
            error,
            reason: DeadReason::AttemptsExhausted,
        };
    }
    let retry_after = policy
        .retry_after_secs(attempt)
        .max(target_retry_after.map_or(0, |s| policy.bounded_retry_after(s)));
    Verdict::Retry { error, retry_after }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::new(
            Duration::from_secs(45),
            2.0,
            Duration::from_secs(6 * 3600),
            0.0,
            3,
        )
    }

    fn refused(status: u16, retry_after: Option<u64>) -> DeliveryOutcome {
        DeliveryOutcome::Refused {
            status,
            retry_after,
            excerpt: None,
        }
    }

    #[test]
    fn server_errors_rate_limits_and_timeouts_are_retried_with_the_backoff() {
        for status in [408, 425, 429, 500, 502, 503] {
            assert_eq!(
                judge(refused(status, None), 1, &policy(), Redeliverer::Sender),
                Verdict::Retry {
                    error: format!("target answered {status}"),
                    retry_after: 45
                }
            );
        }
        assert!(matches!(
            judge(
                DeliveryOutcome::Unreachable("refused".into()),
                2,
                &policy(),
                Redeliverer::Sender
            ),
            Verdict::Retry {
                retry_after: 90,
                ..
            }
        ));
    }

    #[test]
    fn other_client_errors_are_dead_at_once() {
        for status in [400, 401, 404, 410, 422] {
            assert!(matches!(
                judge(refused(status, None), 1, &policy(), Redeliverer::Sender),
                Verdict::Dead {
                    reason: DeadReason::NonRetryable,
                    ..
                }
            ));
        }
    }

    #[test]
    fn the_last_attempt_becomes_a_dead_letter() {
        assert!(matches!(
            judge(refused(500, None), 3, &policy(), Redeliverer::Sender),
            Verdict::Dead {
                reason: DeadReason::AttemptsExhausted,
                ..
            }
        ));
    }

    #[test]
    fn a_longer_target_retry_after_raises_ours() {
        assert!(matches!(
            judge(refused(429, Some(600)), 1, &policy(), Redeliverer::Sender),
            Verdict::Retry {
                retry_after: 600,
                ..
            }
        ));
        assert!(matches!(
            judge(refused(429, Some(5)), 1, &policy(), Redeliverer::Sender),
            Verdict::Retry {
                retry_after: 45,
                ..
            }
        ));
    }

    #[test]
    fn a_failed_replay_is_dead_again_whatever_the_attempt() {
        assert!(matches!(
            judge(refused(503, None), 1, &policy(), Redeliverer::Nobody),
            Verdict::Dead {
                reason: DeadReason::ReplayFailed,
                ..
            }
        ));
    }

    #[test]
    fn an_attempt_that_never_started_is_released_even_on_its_last_try() {
        assert_eq!(
            judge(
                DeliveryOutcome::NotStarted("late".into()),
                3,
                &policy(),
                Redeliverer::Sender
            ),
            Verdict::Release {
                error: "late".into()
            }
        );
    }

    #[test]
    fn a_replay_that_never_started_is_a_dead_letter_again() {
        assert_eq!(
            judge(
                DeliveryOutcome::NotStarted("released at shutdown".into()),
                2,
                &policy(),
                Redeliverer::Nobody
            ),
            Verdict::Dead {
                error: "the replay did not start: released at shutdown".into(),
                reason: DeadReason::ReplayFailed,
            }
        );
    }

    #[test]
    fn a_queue_target_asking_for_time_is_throttled_not_failed() {
        assert!(matches!(
            judge(
                refused(429, Some(30)),
                8,
                &policy(),
                Redeliverer::Queue {
                    horizon_left: Duration::MAX
                }
            ),
            Verdict::Throttled {
                retry_after: 30,
                ..
            }
        ));
        assert!(matches!(
            judge(refused(429, Some(30)), 1, &policy(), Redeliverer::Sender),
            Verdict::Retry { .. }
        ));
        assert!(matches!(
            judge(
                refused(500, None),
                1,
                &policy(),
                Redeliverer::Queue {
                    horizon_left: Duration::MAX
                }
            ),
            Verdict::Retry { .. }
        ));
    }

    #[test]
    fn a_targets_retry_after_is_held_within_one_second_and_the_cap() {
        let queue = Redeliverer::Queue {
            horizon_left: Duration::MAX,
        };
        for (asked, held) in [(0, 1), (u64::MAX, 6 * 3600), (31_536_000, 6 * 3600)] {
            assert!(matches!(
                judge(refused(503, Some(asked)), 1, &policy(), queue),
                Verdict::Throttled { retry_after, .. } if retry_after == held
            ));
        }
        assert!(matches!(
            judge(refused(429, Some(u64::MAX)), 1, &policy(), Redeliverer::Sender),
            Verdict::Retry { retry_after, .. } if retry_after == 6 * 3600
        ));
    }

    #[test]
    fn a_throttle_past_the_events_horizon_is_a_dead_letter() {
        let near = Redeliverer::Queue {
            horizon_left: Duration::from_secs(10),
        };
        assert!(matches!(
            judge(refused(429, Some(30)), 1, &policy(), near),
            Verdict::Dead {
                reason: DeadReason::ThrottledTooLong,
                ..
            }
        ));
        assert!(matches!(
            judge(refused(429, Some(5)), 1, &policy(), near),
            Verdict::Throttled { retry_after: 5, .. }
        ));
    }

    #[test]
    fn a_crash_is_unknown_and_success_is_done() {
        assert!(matches!(
            judge(
                DeliveryOutcome::Crashed("boom".into()),
                1,
                &policy(),
                Redeliverer::Sender
            ),
            Verdict::Unknown { .. }
        ));
        let result = StoredResult {
            status: 200,
            content_type: None,
            body: b"ok".to_vec(),
        };
        assert_eq!(
            judge(
                DeliveryOutcome::Delivered {
                    result: result.clone(),
                    excerpt: Some("ok".into()),
                },
                1,
                &policy(),
                Redeliverer::Sender
            ),
            Verdict::Done(result)
        );
    }
}
