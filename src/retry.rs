//! The retry policy: how long a sender should wait after a failed attempt, and when an
//! event has had enough attempts. Pure arithmetic on plain numbers: [`RetryPolicy::delay`]
//! and [`RetryPolicy::jittered`] take the randomness as a parameter and are exact; only
//! [`RetryPolicy::retry_after_secs`] draws it. Imports nothing of hookgate (config builds
//! the policy from `[retry]`).

use std::time::Duration;

/// Exponential backoff with jitter and an attempt cap.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    base: Duration,
    factor: f64,
    cap: Duration,
    jitter: f64,
    max_attempts: u32,
}

impl RetryPolicy {
    /// `base · factor^(attempt-1)`, capped at `cap`, moved by up to ±`jitter` of itself; an
    /// event has `max_attempts` attempts.
    pub fn new(base: Duration, factor: f64, cap: Duration, jitter: f64, max_attempts: u32) -> Self {
        Self {
            base,
            factor,
            cap,
            jitter,
            max_attempts,
        }
    }

    /// Delay after attempt `attempt` (1-based) failed, before jitter:
    /// `min(cap, base * factor^(attempt-1))`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use hookgate::retry::RetryPolicy;
    ///
    /// let secs = Duration::from_secs;
    /// let policy = RetryPolicy::new(secs(45), 2.0, secs(6 * 3600), 0.2, 8);
    /// assert_eq!(policy.delay(1), Duration::from_secs(45));
    /// assert_eq!(policy.delay(3), Duration::from_secs(180));
    /// assert_eq!(policy.delay(20), Duration::from_secs(6 * 3600));
    /// ```
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        let secs = self.base.as_secs_f64() * self.factor.powi(exponent);
        if !secs.is_finite() || secs >= self.cap.as_secs_f64() {
            self.cap
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// [`delay`](Self::delay) moved by up to ±`jitter` of itself; `unit` is a random number
    /// in `0.0..1.0` (0.5 means no change).
    pub fn jittered(&self, attempt: u32, unit: f64) -> Duration {
        let delay = self.delay(attempt).as_secs_f64();
        let offset = delay * self.jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
        Duration::from_secs_f64((delay + offset).max(0.0))
    }

    /// The jittered delay for `attempt`, in whole seconds for `Retry-After` (at least 1).
    pub fn retry_after_secs(&self, attempt: u32) -> u64 {
        self.jittered(attempt, fastrand::f64())
            .as_secs_f64()
            .ceil()
            .max(1.0) as u64
    }

    /// A target's `Retry-After` of `secs` seconds held within `[1 s, cap]`: a target can
    /// neither make hookgate hammer it (0) nor park an event for a year.
    ///
    /// ```
    /// use std::time::Duration;
    /// use hookgate::retry::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new(Duration::from_secs(45), 2.0, Duration::from_secs(3600), 0.2, 8);
    /// assert_eq!(policy.bounded_retry_after(0), 1);
    /// assert_eq!(policy.bounded_retry_after(30), 30);
    /// assert_eq!(policy.bounded_retry_after(u64::MAX), 3600);
    /// ```
    pub fn bounded_retry_after(&self, secs: u64) -> u64 {
        secs.clamp(1, self.cap.as_secs().max(1))
    }

    /// Whether an event whose attempt number `attempt` just failed has used them all.
    pub fn exhausted(&self, attempt: u32) -> bool {
        attempt >= self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::new(
            Duration::from_secs(45),
            2.0,
            Duration::from_secs(6 * 3600),
            0.2,
            8,
        )
    }

    #[test]
    fn delays_double_from_the_base() {
        let p = policy();
        assert_eq!(p.delay(1), Duration::from_secs(45));
        assert_eq!(p.delay(2), Duration::from_secs(90));
        assert_eq!(p.delay(3), Duration::from_secs(180));
        assert_eq!(p.delay(0), Duration::from_secs(45));
    }

    #[test]
    fn delays_stop_at_the_cap_even_for_huge_attempts() {
        let p = policy();
        assert_eq!(p.delay(10), Duration::from_secs(6 * 3600));
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(6 * 3600));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let p = policy();
        assert_eq!(p.jittered(1, 0.5), Duration::from_secs(45));
        assert_eq!(p.jittered(1, 0.0), Duration::from_secs(36));
        assert_eq!(p.jittered(1, 1.0), Duration::from_secs(54));
        for _ in 0..1000 {
            let secs = p.retry_after_secs(1);
            assert!((36..=54).contains(&secs), "{secs}");
        }
    }

    #[test]
    fn the_cap_on_attempts_is_inclusive() {
        let p = policy();
        assert!(!p.exhausted(7));
        assert!(p.exhausted(8));
    }
}
