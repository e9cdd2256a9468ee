//! Faults put into a real store: [`FaultyStore`] delegates every operation to the store it
//! wraps, counts the pings, panics when asked to complete a key containing `panic` — a
//! bug in the code a shard runs, where no worker catches it — and, while the test holds
//! them ([`Faults::hold_writes`]), keeps outcome writes and lease renewals from
//! reaching the store, as a database that stalls would; and fails the next replays it is
//! told to ([`Faults::fail_replays`]) as a store that did not answer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hookgate::store::{Store, StoreError, StoreFuture};

use super::wrapped::{CallOf, Hooks, Op, Read, Wrapped};

/// A real store with [`Faults`] between its callers and it.
pub type FaultyStore = Wrapped<Faults>;

/// The faults one test puts in, and what they counted.
pub struct Faults {
    /// `ping` calls so far.
    pub pings: AtomicUsize,
    /// Whether `complete` and `renew` calls wait before they reach the store.
    hold: tokio::sync::watch::Sender<bool>,
    /// `complete` calls waiting on the hold now.
    held: AtomicUsize,
    /// `replay` calls still to fail with `StoreError::Unavailable`, reaching nothing.
    replays_to_fail: AtomicUsize,
    /// `replay` calls failed so far.
    pub replays_failed: AtomicUsize,
}

/// Outcome writes and renewals are held while this lives; dropping it lets them through.
pub struct WritesHeld<'a>(&'a Faults);

impl Drop for WritesHeld<'_> {
    fn drop(&mut self) {
        self.0.hold.send_replace(false);
    }
}

impl Wrapped<Faults> {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        let faults = Faults {
            pings: AtomicUsize::new(0),
            hold: tokio::sync::watch::channel(false).0,
            held: AtomicUsize::new(0),
            replays_to_fail: AtomicUsize::new(0),
            replays_failed: AtomicUsize::new(0),
        };
        Wrapped::wrap(inner, faults)
    }
}

impl Faults {
    /// Fails the next `n` `replay` calls as a store that did not answer (nothing reopened).
    pub fn fail_replays(&self, n: usize) {
        self.replays_to_fail.store(n, Ordering::SeqCst);
    }

    /// Holds every `complete` (an outcome write) and `renew` call before it reaches the
    /// store until the answer is dropped.
    pub fn hold_writes(&self) -> WritesHeld<'_> {
        self.hold.send_replace(true);
        WritesHeld(self)
    }

    /// Waits while writes are held; `complete` calls waiting are counted.
    async fn pass_hold(&self, counted: bool) {
        let mut hold = self.hold.subscribe();
        if !*hold.borrow_and_update() {
            return;
        }
        if counted {
            self.held.fetch_add(1, Ordering::SeqCst);
        }
        let _ = hold.wait_for(|held| !held).await;
        if counted {
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// How many `complete` calls are waiting on the hold now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

impl Hooks for Faults {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: CallOf<'a>,
        run: impl FnOnce() -> StoreFuture<'a, T> + Send + 'a,
        _read: Read<T>,
    ) -> StoreFuture<'a, T> {
        match call.op {
            Op::Ping => {
                self.pings.fetch_add(1, Ordering::SeqCst);
                run()
            }
            Op::Complete => {
                let id = call.id.expect("an outcome write names its key");
                assert!(!id.key.contains("panic"), "injected store panic for {id}");
                Box::pin(async move {
                    self.pass_hold(true).await;
                    run().await
                })
            }
            Op::Renew => Box::pin(async move {
                self.pass_hold(false).await;
                run().await
            }),
            Op::Replay => {
                let fail = self
                    .replays_to_fail
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                if fail {
                    self.replays_failed.fetch_add(1, Ordering::SeqCst);
                    return Box::pin(async {
                        Err(StoreError::Unavailable("injected outage".into()))
                    });
                }
                run()
            }
            _ => run(),
        }
    }
}
