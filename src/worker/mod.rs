//! The worker actor: runs one delivery at a time for its shard, and is the crash boundary.
//!
//! A panic in delivery code is caught here (an actix `Supervisor` does not restart an actor
//! that panics: its thread would die and its address with it). The worker answers
//! [`DeliveryOutcome::Crashed`] and stops itself; its supervisor then starts a fresh
//! instance behind the same address, and messages queued behind the crash reach it. The
//! worker never touches the store: the shard records every outcome.

pub mod delivery;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::FutureExt;

use crate::metrics::Metrics;
use crate::outcome::DeliveryOutcome;

pub use delivery::{Delivery, DeliveryRequest, HttpDelivery};

/// One supervised delivery worker.
pub struct Worker {
    delivery: Arc<dyn Delivery>,
    metrics: Arc<Metrics>,
    log: slog::Logger,
}

impl Worker {
    /// A worker delivering through `delivery`, counting its panics in `metrics`.
    pub fn new(delivery: Arc<dyn Delivery>, metrics: Arc<Metrics>, log: slog::Logger) -> Self {
        Self {
            delivery,
            metrics,
            log,
        }
    }
}

impl Actor for Worker {
    type Context = Context<Self>;
}

impl Supervised for Worker {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        slog::warn!(self.log, "worker.restarted");
    }
}

/// Deliver one event; answered when the target answered (or the delivery crashed).
#[derive(Message)]
#[rtype(result = "DeliveryOutcome")]
pub struct Deliver {
    /// What to deliver.
    pub request: DeliveryRequest,
    /// The last moment the delivery may start: and still end (at its timeout) inside its
    /// lease, or — for a renewed (queue) attempt — with a third of its lease left for
    /// renewals. Later, the worker answers [`DeliveryOutcome::NotStarted`] without calling
    /// the target: a delivery that could outlive its lease could run beside a retake.
    pub start_by: std::time::Instant,
    /// Queue mode: when its sender is dropped (or sends), the worker hangs up on the
    /// target at once — the attempt runner could not confirm the lease, and a retake may
    /// start once it ends. `None`: the delivery runs to its end (or its timeout).
    pub hang_up: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Handler<Deliver> for Worker {
    /// Atomic: the worker's next message waits until this delivery ends, so a worker runs
    /// one delivery at a time and a crash takes down no other delivery with it.
    type Result = AtomicResponse<Self, DeliveryOutcome>;

    fn handle(&mut self, msg: Deliver, _ctx: &mut Context<Self>) -> Self::Result {
        let log = traced_log(&self.log, &msg.request);
        if std::time::Instant::now() > msg.start_by {
            slog::warn!(log, "worker.not_started";
                "idempotency_key" => &msg.request.idempotency_key,
                "attempts" => msg.request.attempt);
            let late = "not started: the lease no longer covers the target timeout";
            return AtomicResponse::new(Box::pin(fut::ready(DeliveryOutcome::NotStarted(
                late.into(),
            ))));
        }
        let delivery = Arc::clone(&self.delivery);
        let crash_log = log.clone();
        let attempt = AssertUnwindSafe(async move {
            let key = msg.request.idempotency_key.clone();
            let delivery = delivery.deliver(msg.request);
            let Some(hang_up) = msg.hang_up else {
                return delivery.await;
            };
            tokio::select! {
                biased;
                _ = hang_up => {
                    // Dropping the delivery closes its connection to the target.
                    slog::warn!(log, "worker.hung_up"; "idempotency_key" => &key);
                    DeliveryOutcome::Unreachable("hung up: the lease was not confirmed".into())
                }
                outcome = delivery => outcome,
            }
        });
        AtomicResponse::new(Box::pin(attempt.catch_unwind().into_actor(self).map(
            move |result, act, ctx| match result {
                Ok(outcome) => outcome,
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    slog::error!(crash_log, "worker.crashed"; "error" => &message);
                    act.metrics.actor_panic("worker");
                    ctx.stop();
                    DeliveryOutcome::Crashed(message)
                }
            },
        )))
    }
}

/// `log` with the ids of the delivery's span when it is traced (its `traceparent` names
/// them), so the worker's lines join the attempt's trace.
fn traced_log(log: &slog::Logger, request: &DeliveryRequest) -> slog::Logger {
    match request.trace.as_ref().map(|(parent, _)| parent.as_str()) {
        // `00-<32 hex trace id>-<16 hex span id>-<flags>`, as hookgate writes it.
        Some(p) if p.len() == 55 && p.is_ascii() => log.new(slog::o!(
            "trace_id" => p[3..35].to_owned(), "span_id" => p[36..52].to_owned())),
        _ => log.clone(),
    }
}

/// The text of a panic payload (`&str` or `String`), or a placeholder.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-text payload".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use futures_util::future::LocalBoxFuture;

    /// Counts calls; never reaches a network.
    struct Counting(Arc<AtomicUsize>);

    impl Delivery for Counting {
        fn deliver(&self, _: DeliveryRequest) -> LocalBoxFuture<'static, DeliveryOutcome> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { DeliveryOutcome::Unreachable("counted".into()) })
        }
    }

    fn request() -> DeliveryRequest {
        DeliveryRequest {
            url: "http://127.0.0.1:9/".into(),
            timeout: Duration::from_secs(1),
            body: Default::default(),
            content_type: None,
            idempotency_key: "p:k".into(),
            attempt: 1,
            signing_key: None,
            tls: None,
            trace: None,
        }
    }

    /// Never answers; counts how many of its deliveries were dropped (hung up).
    struct Endless(Arc<AtomicUsize>);

    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Delivery for Endless {
        fn deliver(&self, _: DeliveryRequest) -> LocalBoxFuture<'static, DeliveryOutcome> {
            let dropped = Dropped(Arc::clone(&self.0));
            Box::pin(async move {
                let _dropped = dropped;
                futures_util::future::pending::<()>().await;
                DeliveryOutcome::Unreachable("unreachable".into())
            })
        }
    }

    #[actix_rt::test]
    async fn a_worker_hangs_up_on_the_target_when_its_runner_lets_go() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let delivery: Arc<dyn Delivery> = Arc::new(Endless(Arc::clone(&dropped)));
        let log = slog::Logger::root(slog::Discard, slog::o!());
        let worker = Worker::new(delivery, Arc::new(Metrics::new()), log).start();
        let (hang_up, hung_up) = tokio::sync::oneshot::channel::<()>();
        let outcome = worker.send(Deliver {
            request: request(),
            start_by: Instant::now() + Duration::from_secs(60),
            hang_up: Some(hung_up),
        });
        let outcome = async move {
            // The delivery is running when the runner lets go.
            tokio::task::yield_now().await;
            drop(hang_up);
            outcome.await.unwrap()
        };
        assert!(matches!(outcome.await, DeliveryOutcome::Unreachable(_)));
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "the delivery was dropped"
        );
    }

    #[actix_rt::test]
    async fn a_worker_refuses_an_attempt_whose_lease_no_longer_covers_the_timeout() {
        let calls = Arc::new(AtomicUsize::new(0));
        let delivery: Arc<dyn Delivery> = Arc::new(Counting(Arc::clone(&calls)));
        let log = slog::Logger::root(slog::Discard, slog::o!());
        let worker = Worker::new(delivery, Arc::new(Metrics::new()), log).start();
        let late = Instant::now() - Duration::from_millis(1);
        let outcome = worker
            .send(Deliver {
                request: request(),
                start_by: late,
                hang_up: None,
            })
            .await
            .unwrap();
        assert!(
            matches!(outcome, DeliveryOutcome::NotStarted(_)),
            "{outcome:?}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "the target was never called"
        );

        let in_time = Instant::now() + Duration::from_secs(60);
        let outcome = worker
            .send(Deliver {
                request: request(),
                start_by: in_time,
                hang_up: None,
            })
            .await
            .unwrap();
        assert!(matches!(outcome, DeliveryOutcome::Unreachable(_)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
