//! Instants a duration after another, without overflow: a setting or a target's answer
//! (a `Retry-After` of 2^64 seconds) can never panic the process through `Instant + Duration`.
//! Pure: imports nothing of hookgate.

use std::time::{Duration, Instant};

/// Farther than anything hookgate waits for: a sum past the clock's range ends here.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `start + d`, or as far ahead as the clock allows when that overflows.
///
/// ```
/// use std::time::{Duration, Instant};
/// use hookgate::deadline::after;
///
/// let now = Instant::now();
/// assert_eq!(after(now, Duration::from_secs(5)), now + Duration::from_secs(5));
/// assert!(after(now, Duration::MAX) > now);
/// ```
pub fn after(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .or_else(|| start.checked_add(FAR))
        .unwrap_or(start)
}

/// `d` from now (see [`after`]).
pub fn from_now(d: Duration) -> Instant {
    after(Instant::now(), d)
}
