//! Backoff between attempts to reach a database that stopped answering.
//!
//! While the backoff runs, operations fail at once with `StoreError::Unavailable` instead of
//! each request waiting on a connect timeout; the first operation after it tries for real.
//! A success ends the backoff. Owns timing only; it never opens a connection itself.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::StoreError;

/// First wait after a failure: short, so a blip costs little.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait: a returning database is noticed within this long.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The reconnect backoff of one store.
#[derive(Debug, Default)]
pub(crate) struct Reconnect {
    /// `(retry no sooner than, the current backoff)`; `None` while healthy. A plain mutex:
    /// it is held for a few instructions and never across an `.await`.
    state: Mutex<Option<(Instant, Duration)>>,
}

impl Reconnect {
    /// Fails fast while a backoff is running.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *state {
            Some((retry_at, _)) if Instant::now() < retry_at => Err(StoreError::Unavailable(
                format!(
                    "reconnecting in {} ms",
                    (retry_at - Instant::now()).as_millis()
                )
                .into(),
            )),
            _ => Ok(()),
        }
    }

    /// Records the result of a real attempt.
    pub(crate) fn observe<T>(&self, result: &Result<T, StoreError>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Err(e) if e.is_outage() => {
                let backoff = state.map_or(FIRST_BACKOFF, |(_, b)| (b * 2).min(MAX_BACKOFF));
                *state = Some((crate::deadline::from_now(backoff), backoff));
            }
            // A busy pool never reached the database: it says nothing about it.
            Err(StoreError::Busy(_)) => {}
            _ => *state = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_opens_a_backoff_and_a_success_closes_it() {
        let r = Reconnect::default();
        assert!(r.check().is_ok());
        r.observe::<()>(&Err(StoreError::Unavailable("down".into())));
        assert!(r.check().is_err());
        r.observe(&Ok(()));
        assert!(r.check().is_ok());
    }

    #[test]
    fn query_errors_do_not_open_a_backoff() {
        let r = Reconnect::default();
        r.observe::<()>(&Err(StoreError::Query("syntax".into())));
        assert!(r.check().is_ok());
    }

    #[test]
    fn a_missed_deadline_opens_a_backoff_and_a_busy_pool_does_not() {
        let r = Reconnect::default();
        r.observe::<()>(&Err(StoreError::Busy("pool".into())));
        assert!(r.check().is_ok());
        r.observe::<()>(&Err(StoreError::TimedOut("frozen".into())));
        assert!(r.check().is_err());
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let r = Reconnect::default();
        for _ in 0..20 {
            r.observe::<()>(&Err(StoreError::Unavailable("down".into())));
        }
        let backoff = r.state.lock().expect("lock").map(|(_, b)| b);
        assert_eq!(backoff, Some(MAX_BACKOFF));
    }
}
