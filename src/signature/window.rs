//! The window around now in which a signed timestamp is accepted. Time is a parameter, so
//! every window is testable.

use std::time::SystemTime;

use super::error::SignatureError;

/// The acceptable window around now for a signed timestamp.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Now, in Unix seconds.
    pub now: i64,
    /// Allowed distance either side, in seconds.
    pub tolerance: u64,
}

impl Window {
    /// Parses a Unix-seconds timestamp and checks it lies within the window.
    pub fn check(&self, timestamp: &str, header: &str) -> Result<(), SignatureError> {
        let ts: i64 = timestamp
            .trim()
            .parse()
            .map_err(|_| SignatureError::Malformed(header.into()))?;
        if ts.abs_diff(self.now) > self.tolerance {
            Err(SignatureError::Stale(self.tolerance))
        } else {
            Ok(())
        }
    }
}

/// Seconds since the Unix epoch (negative before it).
pub(super) fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}
