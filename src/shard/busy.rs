//! What a draining shard waits for: claims sent to the store and not answered yet, and
//! attempts between a won claim (or a taken queue row) and their recorded outcome. Each is
//! counted by a [`Busy`] guard that gives its count back when it is dropped, so no path (an
//! early return, a panic, a future the actor drops) can leave the counts unbalanced, and
//! the [`Drained`](super::Drained) callers are answered by the last guard to go.
//!
//! Owns no actor state and does no I/O: the shard holds one [`BusyCounts`] and moves a guard
//! into each future it spawns.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// The shard's counts, its draining flag and the callers waiting for both counts to reach
/// zero once it drains.
#[derive(Debug, Default)]
pub(super) struct BusyCounts(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    claiming: usize,
    running: usize,
    draining: bool,
    waiters: Vec<oneshot::Sender<()>>,
}

impl State {
    /// Answers the waiters if the shard drains and nothing is claiming or running.
    fn answer_if_idle(&mut self) {
        if self.draining && self.claiming == 0 && self.running == 0 {
            for waiter in self.waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

/// What one guard counts.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Claiming,
    Running,
}

/// One claim or one attempt in flight: counted until dropped.
#[derive(Debug)]
#[must_use = "the count is given back as soon as the guard is dropped"]
pub(super) struct Busy {
    state: Arc<Mutex<State>>,
    kind: Kind,
}

impl BusyCounts {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.0)
    }

    fn guard(&self, kind: Kind) -> Busy {
        let mut state = self.lock();
        match kind {
            Kind::Claiming => state.claiming += 1,
            Kind::Running => state.running += 1,
        }
        Busy {
            state: Arc::clone(&self.0),
            kind,
        }
    }

    /// Counts a claim (or an enqueue, or a replay's reopen) sent to the store.
    pub(super) fn claiming(&self) -> Busy {
        self.guard(Kind::Claiming)
    }

    /// Counts an attempt from its won claim to its recorded outcome (or a release).
    pub(super) fn running(&self) -> Busy {
        self.guard(Kind::Running)
    }

    /// Whether [`BusyCounts::drain`] was called: nothing more is claimed.
    pub(super) fn draining(&self) -> bool {
        self.lock().draining
    }

    /// From now on the shard drains; answers the waiters at once if nothing is in flight.
    pub(super) fn drain(&self) {
        let mut state = self.lock();
        state.draining = true;
        state.answer_if_idle();
    }

    /// Answered once the shard drains and nothing is claiming or running (at once if that is
    /// so already).
    pub(super) fn when_drained(&self) -> oneshot::Receiver<()> {
        let (waiter, drained) = oneshot::channel();
        let mut state = self.lock();
        state.waiters.push(waiter);
        state.answer_if_idle();
        drained
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        match self.kind {
            Kind::Claiming => state.claiming -= 1,
            Kind::Running => state.running -= 1,
        }
        state.answer_if_idle();
    }
}

/// The state, even after a panic elsewhere while it was held: its counts are whole after
/// every statement that changes them, so a poisoned lock holds nothing half-written.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot::error::TryRecvError;

    #[test]
    fn drained_waits_for_the_last_guard_of_either_kind() {
        let counts = BusyCounts::default();
        let claim = counts.claiming();
        let attempt = counts.running();
        let mut drained = counts.when_drained();
        counts.drain();
        assert!(counts.draining());
        assert_eq!(drained.try_recv(), Err(TryRecvError::Empty));
        drop(claim);
        assert_eq!(drained.try_recv(), Err(TryRecvError::Empty));
        drop(attempt);
        assert_eq!(drained.try_recv(), Ok(()));
    }

    #[test]
    fn nothing_is_answered_before_the_shard_drains() {
        let counts = BusyCounts::default();
        let mut drained = counts.when_drained();
        drop(counts.claiming());
        assert_eq!(drained.try_recv(), Err(TryRecvError::Empty));
        assert!(!counts.draining());
        counts.drain();
        assert_eq!(drained.try_recv(), Ok(()));
    }

    #[test]
    fn an_idle_drained_shard_answers_at_once() {
        let counts = BusyCounts::default();
        counts.drain();
        assert_eq!(counts.when_drained().try_recv(), Ok(()));
    }

    #[test]
    fn a_guard_dropped_by_a_panic_gives_its_count_back() {
        let counts = BusyCounts::default();
        counts.drain();
        let claim = counts.claiming();
        let mut drained = counts.when_drained();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = claim;
            panic!("an attempt's code panicked");
        }));
        assert!(panicked.is_err());
        assert_eq!(drained.try_recv(), Ok(()));
    }

    #[test]
    fn a_guard_moved_into_a_future_that_is_dropped_unpolled_gives_its_count_back() {
        let counts = BusyCounts::default();
        counts.drain();
        let attempt = counts.running();
        let never_run = async move {
            let _held = attempt;
        };
        let mut drained = counts.when_drained();
        assert_eq!(drained.try_recv(), Err(TryRecvError::Empty));
        drop(never_run);
        assert_eq!(drained.try_recv(), Ok(()));
    }
}
