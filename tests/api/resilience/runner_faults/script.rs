//! The scripted target of the runner-faults generator: what it answers and when, the span
//! it records for each delivery (a hang-up included), and the kill of a runner after a 2xx.

use std::time::{Duration, Instant};

use hookgate::claim::StoredResult;
use hookgate::outcome::DeliveryOutcome;
use hookgate::worker::DeliveryRequest;
use tokio::sync::Notify;

use crate::helpers::{ChaosStore, Journal};

use super::LEASE;

/// What the scripted target does with one delivery.
#[derive(Debug, Clone, Copy)]
pub(super) enum Reply {
    Ok,
    Status(u16),
    Throttle(u64),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Script {
    pub(super) delay: Duration,
    pub(super) reply: Reply,
}

impl Script {
    /// Under faults: mostly quick answers, sometimes slower than the lease; every kind of
    /// answer. While draining: quick, no throttling.
    pub(super) fn draw(rng: &mut fastrand::Rng, chaos: bool) -> Self {
        if !chaos {
            let reply = match rng.u32(0..100) {
                0..=69 => Reply::Ok,
                70..=89 => Reply::Status(500),
                _ => Reply::Status(400),
            };
            let delay = Duration::from_millis(rng.u64(0..50));
            return Self { delay, reply };
        }
        let delay = if rng.u32(0..100) < 40 {
            LEASE.mul_f64(0.5 + rng.f64() * 2.0)
        } else {
            Duration::from_millis(rng.u64(0..150))
        };
        let reply = match rng.u32(0..100) {
            0..=34 => Reply::Ok,
            35..=64 => Reply::Status(500),
            65..=84 => Reply::Throttle(1),
            _ => Reply::Status(400),
        };
        Self { delay, reply }
    }

    /// The outcome for attempt `attempt`; a 2xx names the attempt in its body, so a done
    /// row shows whose answer it holds.
    fn outcome(self, attempt: i32) -> (DeliveryOutcome, String, bool) {
        match self.reply {
            Reply::Ok => (
                DeliveryOutcome::Delivered {
                    result: StoredResult {
                        status: 200,
                        content_type: Some("application/json".into()),
                        body: answer_body(attempt).into_bytes(),
                    },
                    excerpt: Some(answer_body(attempt)),
                },
                "200".into(),
                true,
            ),
            Reply::Status(status) => (
                DeliveryOutcome::Refused {
                    status,
                    retry_after: None,
                    excerpt: None,
                },
                status.to_string(),
                false,
            ),
            Reply::Throttle(secs) => (
                DeliveryOutcome::Refused {
                    status: 429,
                    retry_after: Some(secs),
                    excerpt: None,
                },
                format!("429 Retry-After: {secs}"),
                false,
            ),
        }
    }
}

pub(super) fn answer_body(attempt: i32) -> String {
    format!(r#"{{"attempt":{attempt}}}"#)
}

/// Closes a delivery's span when its future is dropped before it answered: the runner hung
/// up on the target.
struct HangUp<'j>(&'j Journal, usize);

impl Drop for HangUp<'_> {
    fn drop(&mut self) {
        self.0.close_span(self.1, None);
    }
}

/// The scripted target: refuses to start past `start_by` (as a worker does), records the
/// delivery's span and answers as scripted; after a 2xx it kills the runner if asked to.
pub(super) async fn deliver(
    journal: &Journal,
    runner: usize,
    key: &str,
    request: DeliveryRequest,
    start_by: Option<Instant>,
    script: Script,
    kill: Option<(&ChaosStore, &Notify)>,
) -> DeliveryOutcome {
    if start_by.is_some_and(|by| Instant::now() > by) {
        return DeliveryOutcome::NotStarted("the lease no longer covers the timeout".into());
    }
    let span = journal.open_span(runner, key, request.attempt);
    let _hang_up = HangUp(journal, span);
    if script.delay > request.timeout {
        tokio::time::sleep(request.timeout).await;
        journal.close_span(span, Some(("timed out".into(), false)));
        return DeliveryOutcome::Unreachable("timed out".into());
    }
    tokio::time::sleep(script.delay).await;
    let (outcome, said, delivered) = script.outcome(request.attempt);
    journal.close_span(span, Some((said, delivered)));
    if let (true, Some((store, killed))) = (delivered, kill) {
        store.kill();
        killed.notify_one();
    }
    outcome
}
