//! One attempt of one event — the one home of the steps after a won claim: deliver →
//! judge → record (fenced), then the answer (`reply.rs`). The shard runs every sender's
//! attempt, every queue attempt and every admin replay through here; the command line's
//! `dead replay` does too. Nothing else builds a delivery request or writes a verdict. What
//! is not here is the shard's own bookkeeping (its workers, in-flight set and done cache:
//! `claimed.rs`).
//!
//! A sync attempt's lease outlasts its delivery (a config rule), and its outcome write is
//! retried within the lease — except a replay's, and a sync row's attempt on a queue-mode
//! provider whose target may outlast the lease: those renew as queue attempts do. A queue
//! attempt renews its lease every third of it while the
//! delivery runs and while its outcome is written; if it cannot confirm the lease before
//! the lease ends, it hangs up on the target and records nothing (the retake will), so no
//! two attempts of a key are ever open at the target at once. Its outcome write is retried
//! until it lands: nobody waits on it, and it is fenced.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{o, warn, Logger};

use super::event::Event;
use super::record::write_verdict_retrying;
use super::spans::{was_sent, AttemptSpans, Attempted, Timeline};
use crate::claim::{Mode, Path};
use crate::deadline::{after, from_now};
use crate::outcome::{judge, DeliveryOutcome, Redeliverer, Verdict};
use crate::retry::RetryPolicy;
use crate::store::{Fenced, History, Store, StoreError};
use crate::worker::DeliveryRequest;

/// Pause between tries of a renewal that failed, after the first try again at once.
const RENEW_RETRY: Duration = Duration::from_millis(100);

/// How long before the lease ends a queue attempt that could not confirm it hangs up: a
/// tenth of the lease, at most a second — ample to close a connection, small next to the
/// lease's thirds between renewals.
fn hang_up_margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_secs(1))
}

/// Whether [`Attempt::keep_lease`] gives up when the lease cannot be confirmed in time.
#[derive(Debug, Clone, Copy)]
enum Give {
    /// While the delivery runs: give up (and so hang up) before the lease ends.
    Up,
    /// While the outcome is written: keep trying.
    Never,
}

/// A won claim, on its way to the target and its recorded outcome.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The event.
    pub event: Arc<Event>,
    /// The fencing token: the row's `attempts` after the claim.
    pub attempts: i32,
    /// This attempt's number among the tries that count against `retry.max_attempts`:
    /// `attempts`, less (in queue mode) the throttled and never-started tries.
    pub tries: i32,
    /// `first_run`, `retry_after_failure`, `lease_retake` or `replay`.
    pub path: Path,
    /// When the lease ends at the earliest by this node's clock: counted from just before
    /// the claim was sent, so it never overstates the time left.
    pub lease_ends: Instant,
    /// Queue mode, replays, and a sync row's attempt whose target may outlast the lease: the
    /// lease, renewed every third of itself while the delivery runs, so a short lease (fast
    /// crash recovery) can go with a long target timeout. `None` for a sender's sync
    /// attempt, whose lease must outlast the target timeout.
    pub renew: Option<Duration>,
    /// Queue mode: how much longer the event may wait for its delivery (its provider's
    /// horizon less its age); a throttle past it makes it a dead letter.
    pub horizon_left: Duration,
    /// Queue mode: the row's kept body did not open (why, naming the key it needs): the
    /// attempt delivers nothing and makes the row an `unreadable` dead letter.
    pub unreadable: Option<String>,
    /// Its spans (tracing on, a sampled trace).
    spans: Option<AttemptSpans>,
}

/// What the target said, kept for the attempt's history.
struct Seen {
    status: Option<u16>,
    excerpt: Option<String>,
}

impl Seen {
    fn of(outcome: &DeliveryOutcome) -> Self {
        match outcome {
            DeliveryOutcome::Delivered { result, excerpt } => Seen {
                status: Some(result.status),
                excerpt: excerpt.clone(),
            },
            DeliveryOutcome::Refused {
                status, excerpt, ..
            } => Seen {
                status: Some(*status),
                excerpt: excerpt.clone(),
            },
            _ => Seen {
                status: None,
                excerpt: None,
            },
        }
    }
}

/// What running an attempt did.
#[derive(Debug)]
pub struct Recorded {
    /// The decision for the row.
    pub verdict: Verdict,
    /// What the fenced write did (`None`: nothing written, a crash keeps its lease).
    pub written: Option<Result<Fenced, StoreError>>,
    /// From the delivery's start to the recorded outcome.
    pub took: Duration,
    /// From the target's answer to the outcome written (`None`: nothing written). A crash
    /// in this window sends the event again, so it is kept short and measured.
    pub writing: Option<Duration>,
}

impl Attempt {
    /// A won claim, sent at `sent`, whose `lease` outlasts its delivery (sync mode).
    pub fn held(
        event: Arc<Event>,
        attempts: i32,
        path: Path,
        sent: Instant,
        lease: Duration,
    ) -> Self {
        let spans = AttemptSpans::of(&event, sent);
        Self {
            event,
            attempts,
            tries: attempts,
            path,
            lease_ends: crate::deadline::after(sent, lease),
            renew: None,
            horizon_left: Duration::MAX,
            unreadable: None,
            spans,
        }
    }

    /// `log` with this attempt's `trace_id` and `span_id` when its trace is sampled (the
    /// trace's own ids when it is not): every line of the attempt joins its trace.
    pub fn log(&self, log: &Logger) -> Logger {
        match (&self.spans, &self.event.trace) {
            (Some(spans), _) => spans.log(log),
            (None, Some(traced)) => log.new(o!(
                "trace_id" => hex::encode(traced.parent.trace_id),
                "span_id" => hex::encode(traced.parent.span_id))),
            (None, None) => log.clone(),
        }
    }

    /// This attempt with its `lease` renewed while it runs (queue mode), as try number
    /// `tries`, the event's horizon `horizon_left` away.
    pub fn renewed(self, lease: Duration, tries: i32, horizon_left: Duration) -> Self {
        Self {
            tries,
            renew: Some(lease),
            horizon_left,
            ..self
        }
    }

    /// What the target is sent: the original body and content type, the key as ASCII and
    /// the attempt number.
    pub fn request(&self) -> DeliveryRequest {
        let event = &self.event;
        DeliveryRequest {
            url: Arc::clone(&event.target.url),
            timeout: event.target.timeout,
            body: event.body.clone(),
            content_type: event.content_type.clone(),
            idempotency_key: event.id.header_value(),
            attempt: self.attempts,
            signing_key: event.target.signing_key.clone(),
            tls: event.target.tls.clone(),
            trace: self.traceparent(),
        }
    }

    /// The `traceparent` (and `tracestate`) the target is sent: its parent is this
    /// attempt's delivery span, or — a trace not sampled — the context the event carries,
    /// so the application keeps the trace and its decision.
    fn traceparent(&self) -> Option<(String, Option<Arc<str>>)> {
        let traced = self.event.trace.as_ref()?;
        let context = match &self.spans {
            Some(spans) => spans.delivery_context(),
            None => traced.parent.clone(),
        };
        Some((context.traceparent(), context.state))
    }

    /// The last moment the delivery may start: early enough to end (at its timeout) inside
    /// the lease — or, when the lease is renewed, with a third of the lease still left
    /// for renewals. A worker that gets it later refuses to start it.
    pub fn start_by(&self) -> Instant {
        let margin = match self.renew {
            Some(lease) => lease / 3,
            None => self.event.target.timeout,
        };
        self.lease_ends
            .checked_sub(margin)
            .unwrap_or_else(Instant::now)
    }

    /// Who redelivers this attempt if it fails.
    fn redeliverer(&self) -> Redeliverer {
        match (self.path, self.event.mode) {
            (Path::Replay, _) => Redeliverer::Nobody,
            (_, Mode::Queue) => Redeliverer::Queue {
                horizon_left: self.horizon_left,
            },
            (_, Mode::Sync) => Redeliverer::Sender,
        }
    }

    /// Awaits `outcome` (the delivery, or the reason it did not start), judges it, and
    /// writes the verdict fenced by the attempt.
    ///
    /// Without renewals (a sender's sync attempt): the write is retried on transient store
    /// failures until the lease ends (past it another attempt may hold the row, and the
    /// sender is waiting). With renewals (queue mode, replays, see [`Attempt::renew`]):
    /// the lease is renewed meanwhile and the write retried until it lands; if the lease
    /// cannot be confirmed while the delivery runs, `outcome` is dropped — which must hang
    /// up on the target — before the lease ends, and nothing is written.
    pub async fn run(
        &self,
        outcome: impl Future<Output = DeliveryOutcome>,
        store: &dyn Store,
        retry: &RetryPolicy,
        log: &Logger,
    ) -> Recorded {
        let started = Instant::now();
        let Some(lease) = self.renew else {
            let outcome = outcome.await;
            let sent = was_sent(&outcome);
            let seen = Seen::of(&outcome);
            let status = seen.status;
            let verdict = judge(outcome, self.tries, retry, self.redeliverer());
            let answered = Instant::now();
            let deadline = Some(self.lease_ends);
            let history = self.history(&verdict, seen, started.elapsed());
            let written = write_verdict_retrying(
                store,
                &self.event,
                self.attempts,
                &verdict,
                history.as_ref(),
                deadline,
                log,
            )
            .await;
            let timeline = Timeline::ending_now(sent, started, answered);
            self.trace(&timeline, status, &verdict, written.as_ref());
            return Recorded {
                writing: written.as_ref().map(|_| answered.elapsed()),
                verdict,
                written,
                took: started.elapsed(),
            };
        };
        let lease_ends = Cell::new(self.lease_ends);
        let mut delivery = Box::pin(outcome);
        let outcome = {
            let keeper = self.keep_lease(store, lease, &lease_ends, Give::Up, log);
            let mut keeper = std::pin::pin!(keeper);
            tokio::select! {
                // An answer that is in wins over a hang-up due at the same moment.
                biased;
                done = &mut delivery => Some(done),
                why = &mut keeper => {
                    let id = &self.event.id;
                    warn!(log, "webhook.hung_up";
                        "provider" => &*id.provider, "event_key" => &*id.key,
                        "attempts" => self.attempts, "error" => &why);
                    None
                }
            }
        };
        let Some(outcome) = outcome else {
            drop(delivery);
            let verdict = Verdict::Unknown {
                error: "hung up on the target: the lease could not be confirmed".into(),
            };
            let timeline = Timeline::ending_now(true, started, Instant::now());
            self.trace(&timeline, None, &verdict, None);
            return Recorded {
                verdict,
                written: None,
                took: started.elapsed(),
                writing: None,
            };
        };
        let sent = was_sent(&outcome);
        let seen = Seen::of(&outcome);
        let status = seen.status;
        let verdict = judge(outcome, self.tries, retry, self.redeliverer());
        let answered = Instant::now();
        let history = self.history(&verdict, seen, started.elapsed());
        let written = {
            let write = write_verdict_retrying(
                store,
                &self.event,
                self.attempts,
                &verdict,
                history.as_ref(),
                None,
                log,
            );
            let mut write = std::pin::pin!(write);
            // Renewed all the while, whatever renewals fail meanwhile: a late renewal that
            // lands restores the lease (nothing is open at the target any more), so no
            // other node retakes the row while its outcome is on its way.
            let keeper = self.keep_lease(store, lease, &lease_ends, Give::Never, log);
            tokio::select! {
                written = &mut write => written,
                // Another attempt has the row (or this write landed): the write is fenced
                // and says which.
                _ = keeper => write.await,
            }
        };
        let timeline = Timeline::ending_now(sent, started, answered);
        self.trace(&timeline, status, &verdict, written.as_ref());
        Recorded {
            writing: written.as_ref().map(|_| answered.elapsed()),
            verdict,
            written,
            took: started.elapsed(),
        }
    }

    /// Records the attempt's spans (a sampled trace).
    fn trace(
        &self,
        t: &Timeline,
        status: Option<u16>,
        verdict: &Verdict,
        written: Option<&Result<Fenced, StoreError>>,
    ) {
        if let (Some(spans), Some(traced)) = (&self.spans, &self.event.trace) {
            let what = Attempted {
                event: &self.event,
                path: self.path,
                attempts: self.attempts,
                tries: self.tries,
            };
            spans.record(traced, &what, t, status, verdict, written);
        }
    }

    /// The history row of an attempt given back unstarted with `verdict`.
    pub(super) fn released(&self, verdict: &Verdict) -> Option<History> {
        let seen = Seen {
            status: None,
            excerpt: None,
        };
        self.history(verdict, seen, Duration::ZERO)
    }

    /// The history row of this attempt, unless its story is a plain first run that ended
    /// done, or a first claim recorded `filtered` (the event's own row tells either whole:
    /// its `last_path`, attempt 1, its answer), or nothing is written (a crash).
    fn history(&self, verdict: &Verdict, seen: Seen, took: Duration) -> Option<History> {
        let first = self.attempts == 1;
        let outcome = match verdict {
            Verdict::Done(_) if self.path == Path::FirstRun => return None,
            Verdict::Done(_) if self.path == Path::Filtered && first => return None,
            Verdict::Done(_) if self.path == Path::Filtered => "filtered",
            Verdict::Done(_) => "done",
            Verdict::Retry { .. } => "failed",
            Verdict::Dead { .. } => "dead",
            Verdict::Throttled { .. } => "throttled",
            Verdict::Release { .. } => "released",
            Verdict::Unknown { .. } => return None,
        };
        Some(History {
            path: self.path,
            node: crate::node::name(),
            outcome,
            took,
            target_status: seen.status,
            error: None,
            answer: seen.excerpt,
        })
    }

    /// Renews the lease every third of it, fenced by the attempt, keeping `lease_ends`
    /// up to date; a failed renewal is tried again at once and then every
    /// [`RENEW_RETRY`]. Resolves — with the reason — when another attempt took the row,
    /// or (with [`Give::Up`]) when no renewal succeeded by the lease's end less
    /// [`hang_up_margin`].
    async fn keep_lease(
        &self,
        store: &dyn Store,
        lease: Duration,
        lease_ends: &Cell<Instant>,
        give: Give,
        log: &Logger,
    ) -> String {
        let id = &self.event.id;
        let margin = hang_up_margin(lease);
        let since = |t: Instant| after(t, lease / 3);
        let mut next = since(
            lease_ends
                .get()
                .checked_sub(lease)
                .unwrap_or_else(Instant::now),
        );
        let mut failures = 0u32;
        loop {
            let hang_up_at = match give {
                Give::Up => lease_ends
                    .get()
                    .checked_sub(margin)
                    .unwrap_or_else(Instant::now),
                Give::Never => from_now(Duration::MAX),
            };
            tokio::time::sleep_until(next.min(hang_up_at).into()).await;
            if Instant::now() >= hang_up_at {
                return "the lease could not be confirmed before it ended".into();
            }
            let asked = Instant::now();
            let renewed = store.renew(id, self.attempts, lease);
            match tokio::time::timeout_at(hang_up_at.into(), renewed).await {
                Ok(Ok(Fenced::Applied)) => {
                    lease_ends.set(after(asked, lease));
                    next = since(asked);
                    failures = 0;
                }
                Ok(Ok(Fenced::Stale)) => {
                    warn!(log, "webhook.renew_lost";
                        "provider" => &*id.provider, "event_key" => &*id.key,
                        "attempts" => self.attempts);
                    return "another attempt took the row over".into();
                }
                Ok(Err(e)) => {
                    warn!(log, "webhook.renew_failed";
                        "provider" => &*id.provider, "event_key" => &*id.key,
                        "attempts" => self.attempts, "error" => %e);
                    let pause = if failures == 0 {
                        Duration::ZERO
                    } else {
                        RENEW_RETRY
                    };
                    failures += 1;
                    next = from_now(pause);
                }
                Err(_) => return "the lease could not be confirmed before it ended".into(),
            }
        }
    }
}

/// Whole seconds, rounded up, at least 1 (for `Retry-After`).
pub(super) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs_f64().ceil().max(1.0) as u64
}
