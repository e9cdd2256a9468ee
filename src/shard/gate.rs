//! The queue's protection of the application, per provider and per node: a token bucket
//! (`target.max_rate` deliveries a second), a cap on deliveries at once
//! (`target.max_in_flight`), and a pause while the target asked for one (its own
//! `Retry-After` on 429/503). Shared by every shard and the scheduler of a node.
//!
//! A plain mutex: held for a few instructions, never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        if let Some(rate) = self.rate {
            let earned = now.duration_since(self.refilled).as_secs_f64() * rate;
            // A second's worth at most: a quiet minute does not buy a burst.
            self.tokens = (self.tokens + earned).min(rate.max(1.0));
        }
        self.refilled = now;
    }

    fn available(&mut self, now: Instant) -> usize {
        if self.held || self.paused_until.is_some_and(|t| now < t) {
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
        by_rate.min(by_room).min(MAX_TAKE)
    }
}

/// When a provider whose gate has no room may have some again, as far as the gate knows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NextRoom {
    /// When one of its deliveries ends (its `max_in_flight`), or the gate does not know it.
    Freed,
    /// After this long: its rate's next token, or the end of the pause its target asked for.
    After(Duration),
    /// When an operator resumes it (the resume wakes the scheduler).
    Resumed,
}

/// The gates of one node's queue-mode providers.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    buckets: Arc<Mutex<HashMap<Arc<str>, Bucket>>>,
}

impl Gate {
    /// Limits for `provider` (queue mode).
    pub fn configure(
        &self,
        provider: &Arc<str>,
        max_rate: Option<f64>,
        max_in_flight: Option<usize>,
    ) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.insert(
            Arc::clone(provider),
            Bucket {
                rate: max_rate,
                tokens: max_rate.map_or(0.0, |r| r.max(1.0)),
                refilled: Instant::now(),
                max_in_flight,
                in_flight: 0,
                paused_until: None,
                held: false,
            },
        );
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
            .is_some_and(|b| b.held || b.paused_until.is_some_and(|t| Instant::now() < t))
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

    /// Holds (or lets go of) every delivery of `provider`: an operator's pause. A provider
    /// not configured here is unknown to this node and stays so.
    pub fn hold(&self, provider: &str, held: bool) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            bucket.held = held;
        }
    }

    /// Whether an operator paused `provider`.
    pub fn held(&self, provider: &str) -> bool {
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets.get(provider).is_some_and(|b| b.held)
    }

    /// Starts no delivery of `provider` for `pause` (the target asked for it; the caller
    /// bounds it by `queue.max_target_pause`).
    pub fn pause(&self, provider: &str, pause: Duration) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(provider) {
            let until = crate::deadline::from_now(pause);
            bucket.paused_until = Some(bucket.paused_until.map_or(until, |t| t.max(until)));
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

    /// Ends the pause `provider`'s target asked for (an operator resumed the provider).
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
mod tests {
    use super::*;

    fn gate(rate: Option<f64>, in_flight: Option<usize>) -> Gate {
        let gate = Gate::default();
        gate.configure(&Arc::from("p"), rate, in_flight);
        gate
    }

    #[test]
    fn in_flight_is_capped_and_released() {
        let g = gate(None, Some(2));
        assert!(g.try_acquire("p") && g.try_acquire("p"));
        assert!(!g.try_acquire("p"));
        assert_eq!(g.available("p"), 0);
        g.release("p");
        assert_eq!(g.available("p"), 1);
    }

    #[test]
    fn the_rate_allows_a_seconds_burst_then_refills() {
        let g = gate(Some(3.0), None);
        assert_eq!(g.available("p"), 3);
        for _ in 0..3 {
            assert!(g.try_acquire("p"));
        }
        assert!(!g.try_acquire("p"), "the bucket is empty");
    }

    #[test]
    fn a_gate_without_room_says_when_it_has_some() {
        let g = gate(Some(2.0), Some(5));
        assert_eq!(g.reserve("p", 10), 2);
        match g.next_room("p") {
            NextRoom::After(d) => assert!(d > Duration::ZERO && d <= Duration::from_millis(500)),
            other => panic!("the next token, not {other:?}"),
        }
        let capped = gate(None, Some(1));
        assert_eq!(capped.reserve("p", 10), 1);
        assert_eq!(capped.next_room("p"), NextRoom::Freed);
        capped.hold("p", true);
        assert_eq!(capped.next_room("p"), NextRoom::Resumed);
        let paused = gate(None, None);
        paused.pause("p", Duration::from_secs(30));
        assert!(matches!(paused.next_room("p"), NextRoom::After(d) if d > Duration::from_secs(29)));
    }

    #[test]
    fn a_reservation_holds_its_room_until_given_back() {
        let g = gate(Some(3.0), Some(2));
        assert_eq!(g.reserve("p", 10), 2);
        assert!(!g.try_acquire("p"), "the reserved slots are spoken for");
        g.unreserve("p", 1);
        assert_eq!(g.available("p"), 1);
        assert!(g.try_acquire("p"));
        assert_eq!(g.available("p"), 0);
        g.release("p");
        g.release("p");
        // Two tokens spent (one reserved and kept, one acquired), one given back.
        assert_eq!(g.available("p"), 1);
        assert_eq!(g.reserve("other", 7), 7, "an unknown provider is unlimited");
    }

    #[test]
    fn a_hold_names_the_operators_pause_first_and_a_targets_pause_ends_on_demand() {
        let g = gate(None, None);
        assert_eq!(g.hold_of("p"), None);
        g.pause("p", Duration::from_secs(60));
        assert!(
            matches!(g.hold_of("p"), Some(Hold::Target(left)) if left <= Duration::from_secs(60))
        );
        g.hold("p", true);
        assert_eq!(g.hold_of("p"), Some(Hold::Operator));
        g.hold("p", false);
        g.end_target_pause("p");
        assert_eq!(g.hold_of("p"), None);
        assert_eq!(g.target_pause_left("p"), None);
        assert!(!g.stopped("p"));
    }

    #[test]
    fn a_pause_stops_every_start_and_unknown_providers_are_unlimited() {
        let g = gate(None, None);
        assert!(!g.stopped("p"));
        g.pause("p", Duration::from_secs(60));
        assert!(g.stopped("p"));
        assert_eq!(g.available("p"), 0);
        assert!(!g.try_acquire("p"));
        assert!(g.try_acquire("other"));
    }
}
