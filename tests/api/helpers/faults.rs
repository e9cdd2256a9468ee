//! Faults put into a real store: [`FaultyStore`] delegates every operation to the store it
//! wraps, counts the pings, panics when asked to complete a key containing `panic` — a
//! bug in the code a shard runs, where no worker catches it — and, while the test holds
//! them ([`Faults::hold_writes`]), keeps outcome writes and lease renewals from
//! reaching the store, as a database that stalls would; fails the next replays it is
//! told to ([`Faults::fail_replays`]) as a store that did not answer; and changes what
//! retention passes answer ([`Faults::edit_retained`]), as a step the store could not do.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hookgate::store::{Retained, Store, StoreError, StoreFuture};

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
    /// What every retention pass's answer is turned into, after the store ran the pass.
    retained: Mutex<Option<EditRetained>>,
}

/// A change to what a retention pass answers: a step said failed, a lock held longer.
pub type EditRetained = fn(Retained) -> Result<Retained, StoreError>;

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
            retained: Mutex::new(None),
        };
        Wrapped::wrap(inner, faults)
    }
}

impl Faults {
    /// Fails the next `n` `replay` calls as a store that did not answer (nothing reopened).
    pub fn fail_replays(&self, n: usize) {
        self.replays_to_fail.store(n, Ordering::SeqCst);
    }

    /// Turns the answer of every retention pass from now on by `edit` (`None`: the
    /// store's own answers again). The pass itself runs on the store as ever.
    pub fn edit_retained(&self, edit: Option<EditRetained>) {
        *self.retained.lock().unwrap() = edit;
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

    fn retained(&self, answer: Result<Retained, StoreError>) -> Result<Retained, StoreError> {
        match *self.retained.lock().unwrap() {
            Some(edit) => answer.and_then(edit),
            None => answer,
        }
    }
}
