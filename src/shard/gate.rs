//! The queue's protection of the application, per provider and per node: a token bucket
//! (`target.max_rate` deliveries a second), a cap on deliveries at once
//! (`target.max_in_flight`), a pause while the target asked for one (its own
//! `Retry-After` on 429/503) or an operator holds it, and the ramp after a pause (one
//! delivery first, more as deliveries succeed: `ramp.rs`). Shared by every shard and the
//! scheduler of a node.
//!
//! A plain mutex: held for a few instructions, never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ramp::{Ramp, Report};

/// Most rows one provider's scheduler pass may take, whatever its limits say.
pub const MAX_TAKE: usize = 256;

#[derive(Debug)]
struct Bucket {
    rate: Option<f64>,
    tokens: f64,
    refilled: Instant,
    max_in_flight: Option<usize>,
    in_flight: usize,
    paused_until: Option<Instant>,
    /// An operator paused the provider (for every node, through the store).
    held: bool,
    /// Set by every pause, in force once it ends, gone once the window reaches `ceiling`.
    ramp: Option<Ramp>,
    /// Where a ramp ends: `max_in_flight`, at most the node's workers.
    ceiling: usize,
}

impl Bucket {
    fn new(rate: Option<f64>, max_in_flight: Option<usize>, workers: usize, now: Instant) -> Self {
        Self {
            rate,
            tokens: rate.map_or(0.0, |r| r.max(1.0)),
            refilled: now,
            max_in_flight,
            in_flight: 0,
            paused_until: None,
            held: false,
            ramp: None,
            ceiling: max_in_flight.map_or(workers, |max| max.min(workers)),
        }
    }

    /// Whether nothing may start at `now`: an operator's pause, or the target's.
    fn stopped(&self, now: Instant) -> bool {
        self.held || self.paused_until.is_some_and(|t| now < t)
    }

    /// Starts nothing until `until` (a later pause already running stays), then ramps.
    fn pause_until(&mut self, until: Instant) {
        self.paused_until = Some(self.paused_until.map_or(until, |t| t.max(until)));
        self.ramp = Some(Ramp::start(self.ceiling));
    }

    /// A delivery of the scope ended, saying `report` of its target. While the scope is
    /// stopped it says nothing of the ramp that follows (it started before the pause).
    fn report(&mut self, report: Report, now: Instant) {
        let Some(ramp) = self.ramp.filter(|_| !self.stopped(now)) else {
            return;
        };
        match report {
            Report::Answered => self.ramp = ramp.succeeded(),
            Report::Failed(wait) => match ramp.failed() {
                Some(narrower) => self.ramp = Some(narrower),
                None => self.pause_until(crate::deadline::after(now, wait)),
            },
            Report::Nothing => {}
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(rate) = self.rate {
            let earned = now.duration_since(self.refilled).as_secs_f64() * rate;
            // A second's worth at most: a quiet minute does not buy a burst.
            self.tokens = (self.tokens + earned).min(rate.max(1.0));
        }
        self.refilled = now;
    }

    fn available(&mut self, now: Instant) -> usize {
        if self.stopped(now) {
            return 0;
        }
        self.refill(now);
        let by_rate = match self.rate {
            Some(_) => self.tokens.floor() as usize,
            None => MAX_TAKE,
        };
        let by_room = match self.max_in_flight {
            Some(max) => max.saturating_sub(self.in_flight),
            None => MAX_TAKE,
        };
        let by_ramp = self.ramp.map_or(MAX_TAKE, |ramp| ramp.room(self.in_flight));
        by_rate.min(by_room).min(by_ramp).min(MAX_TAKE)
    }
}

/// When a provider whose gate has no room may have some again, as far as the gate knows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NextRoom {
    /// When one of its deliveries ends (its `max_in_flight`, or its ramp's window), or the
    /// gate does not know it.
    Freed,
    /// After this long: its rate's next token, or the end of the pause its target asked for.
    After(Duration),
    /// When an operator resumes it (the resume wakes the scheduler).
    Resumed,
}

/// The gates of one node's queue-mode providers.
#[derive(Debug, Clone)]
pub struct Gate {
    buckets: Arc<Mutex<HashMap<Arc<str>, Bucket>>>,
    /// The node's delivery workers: where a ramp ends for a scope without `max_in_flight`.
    workers: usize,
}

impl Gate {
    /// The gates of a node with `workers` delivery workers (every shard's).
    pub fn new(workers: usize) -> Self {
        Self {
            buckets: Arc::default(),
            workers,
        }
    }

    /// Limits for `provider` (queue mode).
    pub fn configure(
        &self,
        provider: &Arc<str>,
        max_rate: Option<f64>,
        max_in_flight: Option<usize>,
    ) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = Bucket::new(max_rate, max_in_flight, self.workers, Instant::now());
        buckets.insert(Arc::clone(provider), bucket);
    }

    /// Deliveries `provider` may start now (0 while paused); the scheduler reserves them
    /// instead ([`Gate::reserve`]).
    #[cfg(test)]
    fn available(&self, provider: &str) -> usize {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .get_mut(provider)
            .map_or(MAX_TAKE, |b| b.available(Instant::now()))
    }

    /// Takes a token and an in-flight slot for one delivery of `provider`, if it may start.
    pub fn try_acquire(&self, provider: &str) -> bool {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bucket) = buckets.get_mut(provider) else {
            return true;
        };
        if bucket.available(Instant::now()) == 0 {
            return false;
        }
        if bucket.rate.is_some() {
            bucket.tokens -= 1.0;
        }
        bucket.in_flight += 1;
        true
    }

    /// Takes the tokens and in-flight slots of up to `most` deliveries of `provider` at
    /// once (as many as may start now), before their rows are taken: a delivery starting
    /// meanwhile finds them spoken for. The caller gives back what it does not start
    /// ([`Gate::unreserve`]).
    pub fn reserve(&self, provider: &str, most: usize) -> usize {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bucket) = buckets.get_mut(provider) else {
            return most.min(MAX_TAKE);
        };
        let n = bucket.available(Instant::now()).min(most);
        if bucket.rate.is_some() {
            bucket.tokens -= n as f64;
        }
        bucket.in_flight += n;
        n
    }

    /// Gives back `n` reserved deliveries that did not start: their slots and tokens.
    pub fn unreserve(&self, provider: &str, n: usize) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            bucket.in_flight = bucket.in_flight.saturating_sub(n);
            if let Some(rate) = bucket.rate {
                bucket.tokens = (bucket.tokens + n as f64).min(rate.max(1.0));
            }
        }
    }

    /// Whether `provider` may start nothing now, whatever its room: an operator's pause,
    /// or one its target asked for.
    pub fn stopped(&self, provider: &str) -> bool {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .get(provider)
            .is_some_and(|b| b.stopped(Instant::now()))
    }

    /// When `provider`, with no room now, may have some again.
    pub fn next_room(&self, provider: &str) -> NextRoom {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bucket) = buckets.get_mut(provider) else {
            return NextRoom::Freed;
        };
        if bucket.held {
            return NextRoom::Resumed;
        }
        let now = Instant::now();
        if let Some(left) = bucket
            .paused_until
            .and_then(|t| t.checked_duration_since(now))
        {
            if !left.is_zero() {
                return NextRoom::After(left);
            }
        }
        bucket.refill(now);
        match bucket.rate {
            Some(rate) if bucket.tokens < 1.0 => {
                NextRoom::After(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
            }
            _ => NextRoom::Freed,
        }
    }

    /// Gives back the in-flight slot of a delivery that ended (or never started).
    pub fn release(&self, provider: &str) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            bucket.in_flight = bucket.in_flight.saturating_sub(1);
        }
    }

    /// A delivery of `provider` that held one of its slots ended: what it says of the
    /// target widens or narrows the ramp after a pause, and a failed probe pauses the
    /// provider again (the caller bounds the wait by `queue.max_target_pause`).
    pub fn report(&self, provider: &str, report: Report) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            bucket.report(report, Instant::now());
        }
    }

    /// The ramp's window of `provider` — deliveries it may have open at once since its
    /// last pause — while it ramps up (`None` when it does not).
    pub fn window(&self, provider: &str) -> Option<usize> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        Some(buckets.get(provider)?.ramp?.window())
    }

    /// Holds (or lets go of) every delivery of `provider`: an operator's pause, after which
    /// the provider ramps up as after its target's. A provider not configured here is
    /// unknown to this node and stays so.
    pub fn hold(&self, provider: &str, held: bool) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            if held {
                bucket.ramp = Some(Ramp::start(bucket.ceiling));
            }
            bucket.held = held;
        }
    }

    /// Whether an operator paused `provider`.
    pub fn held(&self, provider: &str) -> bool {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.get(provider).is_some_and(|b| b.held)
    }

    /// Starts no delivery of `provider` for `pause` (the target asked for it; the caller
    /// bounds it by `queue.max_target_pause`), then ramps up.
    pub fn pause(&self, provider: &str, pause: Duration) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            bucket.pause_until(crate::deadline::from_now(pause));
        }
    }

    /// What holds `provider`'s deliveries now, if anything: an operator's pause first.
    pub fn hold_of(&self, provider: &str) -> Option<Hold> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.get(provider)?;
        if bucket.held {
            return Some(Hold::Operator);
        }
        let left = bucket
            .paused_until?
            .checked_duration_since(Instant::now())?;
        (!left.is_zero()).then_some(Hold::Target(left))
    }

    /// How long the pause `provider`'s target asked for has left, if one runs.
    pub fn target_pause_left(&self, provider: &str) -> Option<Duration> {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let until = buckets.get(provider)?.paused_until?;
        until
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())
    }

    /// Ends the pause `provider`'s target asked for (an operator resumed the provider); its
    /// ramp goes on.
    pub fn end_target_pause(&self, provider: &str) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            bucket.paused_until = None;
        }
    }
}

/// What holds a provider's deliveries on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// An operator paused it (for every node, through the store).
    Operator,
    /// Its target asked for time (`Retry-After`); this much is left.
    Target(Duration),
}

impl Hold {
    /// Says what holds the provider, for an operator or a log line.
    pub fn describe(self) -> String {
        match self {
            Hold::Operator => "an operator paused the provider".into(),
            Hold::Target(left) => format!(
                "the target asked for time (Retry-After), {} s left",
                left.as_secs().max(1)
            ),
        }
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
