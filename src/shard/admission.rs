//! A shard's admission: which of its workers are idle, the requests waiting (bounded, each
//! until its deadline) for one to free up, the taken queue rows waiting for one, and the
//! room for queue rows it publishes to the scheduler, written again on every change of
//! idle workers or waiting rows so the scheduler never reads a stale figure.
//!
//! A plain type: no actor, no I/O, no clock of its own (deadlines are given). The shard
//! decides what to do with what it hands back (claim, start, refuse, release).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Admission for one shard of `workers` workers: `W` is a waiting request, `P` a taken row
/// waiting for a worker.
#[derive(Debug)]
pub(super) struct Admission<W, P> {
    index: usize,
    workers: usize,
    /// Workers that can start a delivery now. A worker is taken from here *before* its
    /// claim is made and given back when the attempt has been recorded, so a won claim
    /// never waits for a worker while its lease runs.
    idle: Vec<usize>,
    /// Requests waiting for a worker, oldest first, with their deadlines. Every request
    /// waits the same `admission_wait`, so their deadlines come in queue order.
    waiting: VecDeque<(Instant, W)>,
    max_waiting: usize,
    /// Queue rows the scheduler took for this shard while none of its workers was free,
    /// oldest first. Bounded by what the scheduler takes: at most the room published.
    pending: VecDeque<P>,
    /// Queue rows each shard of the node can take now, one slot per shard (this one writes
    /// `room[index]`).
    room: Arc<[AtomicUsize]>,
    /// Whether the one timer that expires waits is set.
    timer_set: bool,
}

impl<W, P> Admission<W, P> {
    /// Shard `index`'s admission, every worker idle, at most `max_waiting` requests waiting.
    pub(super) fn new(
        index: usize,
        workers: usize,
        max_waiting: usize,
        room: Arc<[AtomicUsize]>,
    ) -> Self {
        let admission = Self {
            index,
            workers,
            idle: (0..workers).rev().collect(),
            waiting: VecDeque::new(),
            max_waiting,
            pending: VecDeque::new(),
            room,
            timer_set: false,
        };
        admission.publish_room();
        admission
    }

    /// Reserves an idle worker, if there is one.
    pub(super) fn take_idle(&mut self) -> Option<usize> {
        let worker = self.idle.pop();
        self.publish_room();
        worker
    }

    /// A worker nothing was waiting for goes back to the idle set.
    pub(super) fn park(&mut self, worker: usize) {
        self.idle.push(worker);
        self.publish_room();
    }

    /// Lets `request` wait for a worker until `until`; gives it back when the wait is full.
    /// `Ok(true)` when the shard must set its expiry timer (none is set).
    pub(super) fn wait(&mut self, request: W, until: Instant) -> Result<bool, W> {
        if self.waiting.len() >= self.max_waiting {
            return Err(request);
        }
        self.waiting.push_back((until, request));
        Ok(!std::mem::replace(&mut self.timer_set, true))
    }

    /// The oldest waiting request.
    pub(super) fn next_waiting(&mut self) -> Option<W> {
        self.waiting.pop_front().map(|(_, request)| request)
    }

    /// How many requests wait.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The timer fired at `now`: the requests whose wait ran out, oldest first, and when
    /// the timer must fire next (none: no request waits, and no timer is set).
    pub(super) fn expire(&mut self, now: Instant) -> (Vec<W>, Option<Instant>) {
        let mut expired = Vec::new();
        while self.waiting.front().is_some_and(|(until, _)| *until <= now) {
            if let Some((_, request)) = self.waiting.pop_front() {
                expired.push(request);
            }
        }
        let next = self.waiting.front().map(|(until, _)| *until);
        self.timer_set = next.is_some();
        (expired, next)
    }

    /// A taken row waits for a worker of this shard.
    pub(super) fn hold(&mut self, row: P) {
        self.pending.push_back(row);
        self.publish_room();
    }

    /// The oldest taken row waiting for a worker.
    pub(super) fn next_pending(&mut self) -> Option<P> {
        let row = self.pending.pop_front();
        self.publish_room();
        row
    }

    /// Idle workers, plus a worker's worth of rows that may wait per worker (the next batch
    /// is taken while the last one runs), less the rows waiting.
    pub(super) fn room(&self) -> usize {
        (self.idle.len() + self.workers).saturating_sub(self.pending.len())
    }

    fn publish_room(&self) {
        self.room[self.index].store(self.room(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn admission(
        workers: usize,
        max_waiting: usize,
    ) -> (Admission<u32, &'static str>, Arc<[AtomicUsize]>) {
        let room: Arc<[AtomicUsize]> = (0..2).map(|_| AtomicUsize::new(0)).collect();
        (
            Admission::new(1, workers, max_waiting, Arc::clone(&room)),
            room,
        )
    }

    fn published(room: &[AtomicUsize]) -> usize {
        room[1].load(Ordering::Relaxed)
    }

    #[test]
    fn the_published_room_follows_every_change_of_idle_workers_and_waiting_rows() {
        let (mut a, room) = admission(2, 4);
        assert_eq!(published(&room), 4, "two idle workers and two rows' worth");
        assert_eq!(
            room[0].load(Ordering::Relaxed),
            0,
            "another shard's slot untouched"
        );
        let first = a.take_idle().unwrap();
        assert_eq!(published(&room), 3);
        let second = a.take_idle().unwrap();
        assert_eq!((first, second), (0, 1), "the lowest worker first");
        assert_eq!(a.take_idle(), None);
        assert_eq!(published(&room), 2);
        a.hold("row a");
        a.hold("row b");
        assert_eq!(published(&room), 0);
        a.hold("row c");
        assert_eq!(published(&room), 0, "never below zero");
        assert_eq!(a.next_pending(), Some("row a"));
        assert_eq!(published(&room), 0);
        assert_eq!(a.next_pending(), Some("row b"));
        assert_eq!(published(&room), 1);
        a.park(first);
        assert_eq!(published(&room), 2);
        assert_eq!(a.room(), published(&room));
    }

    #[test]
    fn waits_are_bounded_and_only_the_first_sets_the_timer() {
        let (mut a, _) = admission(1, 2);
        let now = Instant::now();
        assert_eq!(a.wait(1, now), Ok(true));
        assert_eq!(a.wait(2, now), Ok(false));
        assert_eq!(a.wait(3, now), Err(3), "the wait is full");
        assert_eq!(a.waiting(), 2);
        assert_eq!(a.next_waiting(), Some(1));
        assert_eq!(a.next_waiting(), Some(2));
        assert_eq!(a.next_waiting(), None);
    }

    #[test]
    fn expiry_takes_the_waits_that_ran_out_and_says_when_to_look_again() {
        let (mut a, _) = admission(1, 8);
        let now = Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(a.wait(1, now), Ok(true));
        assert_eq!(a.wait(2, now + second), Ok(false));
        assert_eq!(a.wait(3, now + 2 * second), Ok(false));
        assert_eq!(a.expire(now + second), (vec![1, 2], Some(now + 2 * second)));
        assert_eq!(
            a.wait(4, now + 3 * second),
            Ok(false),
            "the timer is still set"
        );
        assert_eq!(a.expire(now + 3 * second), (vec![3, 4], None));
        assert_eq!(
            a.wait(5, now + 4 * second),
            Ok(true),
            "no timer set any more"
        );
    }
}
