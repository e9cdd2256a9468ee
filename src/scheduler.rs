//! The queue scheduler of one node: takes due queue rows (new ones no worker could start at
//! once, `failed` ones whose backoff has passed, `in_progress` ones whose lease expired),
//! as many as the shards have room for and the provider's gate allows, in one statement
//! per provider, and hands each to the shard that owns its key.
//!
//! It serves the queue rows of every configured provider, whatever mode the provider is in
//! now: a row keeps the mode it was accepted in. Bounded: a shard's room is its idle
//! workers plus one waiting row per worker (the next batch is taken while the last runs, so
//! workers do not idle between passes); a waiting row starts when one of that shard's
//! workers frees up, or is released if its lease runs short first. After a pass that
//! filled all the room it waits for a worker to go idle; otherwise it sleeps
//! until an event is queued that no worker could start, or `queue.poll_interval` passes
//! (backoffs and other nodes' rows). It backs off while the store is unavailable, and takes
//! nothing once the node drains. [`Scheduler::run_once`] is one pass (tests call it by
//! hand, after [`Scheduler::by_hand`] has stopped the node's own).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{warn, Logger};
use tokio::sync::Mutex;

use crate::metrics::Metrics;
use crate::provider::Target;
use crate::shard::gate::NextRoom;
use crate::shard::{release_taken, Dispatcher, Start};
use crate::store::{Store, StoreError};

/// How often the queue depth metrics are refreshed at most.
const DEPTH_EVERY: Duration = Duration::from_secs(5);

/// Longest pause after the store failed: a returning database is noticed within it.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The scheduler of one node.
pub struct Scheduler {
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    /// Every configured provider, by name, with its target.
    providers: Vec<(Arc<str>, Arc<Target>)>,
    metrics: Arc<Metrics>,
    log: Logger,
    poll: Duration,
    /// The lease a taken row holds.
    lease: Duration,
    /// Held by [`Scheduler::run_forever`] through each of its passes.
    own_pass: Mutex<()>,
    /// Set by [`Scheduler::by_hand`]: the node runs no more passes of its own.
    by_hand: AtomicBool,
}

impl Scheduler {
    /// A scheduler offering `providers`' due rows to `dispatcher`'s shards.
    pub fn new(
        store: Arc<dyn Store>,
        dispatcher: Dispatcher,
        providers: Vec<(Arc<str>, Arc<Target>)>,
        metrics: Arc<Metrics>,
        log: Logger,
        poll: Duration,
        lease: Duration,
    ) -> Self {
        Self {
            store,
            dispatcher,
            providers,
            metrics,
            log,
            poll,
            lease,
            own_pass: Mutex::new(()),
            by_hand: Default::default(),
        }
    }

    /// Stops the node's own passes for good, once the one running (if any) has ended: every
    /// pass from now on is its caller's ([`Scheduler::run_once`]). Tests drive the scheduler
    /// this way, so that no pass of the node's — woken by a worker that frees up or an
    /// arrival — takes a row or a provider's room beside theirs.
    pub async fn by_hand(&self) {
        self.by_hand.store(true, Ordering::Relaxed);
        drop(self.own_pass.lock().await);
    }

    /// One pass: takes each provider's due rows, as many as can start now, and hands them
    /// to their shards; answers how many it took and whether it took as many as there was
    /// room for (then more may be due: the next pass runs when a worker frees up).
    pub async fn run_once(&self) -> Result<Pass, StoreError> {
        let mut pass = Pass::default();
        if self.dispatcher.draining() {
            return Ok(pass);
        }
        self.metrics.scheduler_poll();
        for (provider, target) in &self.providers {
            let gate = self.dispatcher.gate();
            // The provider's room is reserved before the take: an event arriving while the
            // statement runs finds it spoken for, and waits in the queue.
            let most = self.dispatcher.room();
            let room = gate.reserve(provider, most);
            if room == 0 {
                pass.held_back(most == 0, gate.next_room(provider));
                continue;
            }
            let limit = u32::try_from(room).unwrap_or(u32::MAX);
            let sent = Instant::now();
            // This node's own keys in flight are not taken, even with their leases run out;
            // the rows taken here count as in flight until their shards have entered them.
            let busy = self.dispatcher.in_flight(provider);
            let taken = match self
                .store
                .take_due(provider, limit, self.lease, &busy)
                .await
            {
                Ok(taken) => taken,
                Err(e) => {
                    gate.unreserve(provider, room);
                    return Err(e);
                }
            };
            gate.unreserve(provider, room - taken.len());
            if taken.len() >= room {
                // Held back by the workers, or by the provider's own gate (its rate, its
                // pause, its deliveries at once).
                pass.held_back(room >= most, gate.next_room(provider));
            }
            pass.taken += taken.len();
            // Paused while the statement ran (the target asked, or an operator): the rows
            // go back, due again at once, and start once the pause ends.
            let stopped = gate.stopped(provider);
            for taken in taken {
                let start = Start {
                    hold: self.dispatcher.hold(&taken.id),
                    taken,
                    target: Arc::clone(target),
                    sent,
                };
                let start = if stopped {
                    Err(Box::new(start))
                } else {
                    self.dispatcher.hand_over(start)
                };
                if let Err(start) = start {
                    gate.release(provider);
                    let why = if stopped {
                        "its provider was paused"
                    } else {
                        "the shard's mailbox was full"
                    };
                    release_taken(&*self.store, *start, why, &self.log).await;
                }
            }
        }
        Ok(pass)
    }

    /// Refreshes the queue depth metrics.
    pub async fn measure(&self) -> Result<(), StoreError> {
        for depth in self.store.queue_depth().await? {
            self.metrics
                .queue_depth(&depth.provider, depth.rows, depth.oldest_due.as_secs_f64());
        }
        Ok(())
    }

    /// Runs passes until the task is dropped: when a worker frees up after a pass that
    /// filled every idle one, when an event is queued that no worker could start, or after
    /// `queue.poll_interval` — backing off while the store fails.
    pub async fn run_forever(self: Arc<Self>) {
        if self.providers.is_empty() {
            return;
        }
        let mut backoff = self.poll;
        let mut measured: Option<Instant> = None;
        loop {
            let own_pass = self.own_pass.lock().await;
            if self.by_hand.load(Ordering::Relaxed) {
                return;
            }
            if measured.is_none_or(|t| t.elapsed() >= DEPTH_EVERY) {
                if let Err(e) = self.measure().await {
                    warn!(self.log, "queue.measure_failed"; "error" => %e);
                }
                measured = Some(Instant::now());
            }
            let pass = self.run_once().await;
            drop(own_pass);
            match pass {
                Ok(pass) => {
                    backoff = self.poll;
                    let poll = pass.wake.map_or(self.poll, |wake| wake.min(self.poll));
                    self.dispatcher.signals().wait(pass.full, poll).await;
                }
                Err(e) => {
                    warn!(self.log, "queue.poll_failed"; "error" => %e,
                        "retry_in_ms" => u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX));
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }
}

/// What one scheduler pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Rows taken and handed to shards.
    pub taken: usize,
    /// Whether a provider may have had more due rows than room that a freed worker gives
    /// (idle workers, or its `max_in_flight`): the next pass runs as soon as a worker frees
    /// up.
    pub full: bool,
    /// The soonest a provider held back by its rate (or its target's pause) has room
    /// again: the next pass runs then, not at every freed worker — which, with other
    /// providers busy, would run passes back to back for nothing.
    pub wake: Option<Duration>,
}

impl Pass {
    /// A provider had no more room this pass: the node's workers were all taken
    /// (`workers`), or its gate says when it has room again.
    fn held_back(&mut self, workers: bool, next: NextRoom) {
        match next {
            _ if workers => self.full = true,
            NextRoom::Freed => self.full = true,
            NextRoom::After(after) => {
                self.wake = Some(self.wake.map_or(after, |wake| wake.min(after)));
            }
            NextRoom::Resumed => {}
        }
    }
}
