//! The dispatcher: starts the shards and their workers, and routes every event to the one
//! shard that owns its key.
//!
//! Routing is a hash of `(provider, key)` keyed once per process, so the same key always
//! meets the same shard on this node. The dispatcher never queues: a full shard mailbox is answered 503
//! at once (`overloaded`), so memory stays bounded under any load.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use actix::prelude::*;
use futures_util::future::join_all;
use tokio::sync::oneshot;

use super::actor::{Shard, ShardSettings, Shared};
use super::answer::{cached_answer, log_refusal, Answer, RetryReason};
use super::cache::DoneCache;
use super::event::{Event, Traced};
use super::gate::Gate;
use super::in_flight::{KeyHold, NodeKeys};
use super::messages::{Drain, Drained, Enqueue, Ingest, Replay, Start};
use super::signals::QueueSignals;
use crate::claim::Mode;
use crate::key::EventId;
use crate::metrics::Metrics;
use crate::provider::Target;
use crate::store::Store;
use crate::worker::{Delivery, Worker};

/// The hasher keys of this process, drawn at random once: the same key meets the same
/// shard for the life of the process, but a sender cannot choose keys that all land on one
/// shard (with fixed keys it could, and starve that shard's workers).
static ROUTING: OnceLock<RandomState> = OnceLock::new();

/// The shard index for `id` among `shards` (`shards` ≥ 1).
pub fn shard_for(id: &EventId, shards: usize) -> usize {
    let hash = ROUTING.get_or_init(RandomState::new).hash_one(id);
    (hash % shards.max(1) as u64) as usize
}

/// The running shards of one node.
#[derive(Clone)]
pub struct Dispatcher {
    shards: Arc<[Addr<Shard>]>,
    done: DoneCache,
    gate: Gate,
    room: Arc<[AtomicUsize]>,
    signals: Arc<QueueSignals>,
    in_flight: NodeKeys,
    metrics: Arc<Metrics>,
    log: slog::Logger,
    arbiters: Arc<[ArbiterHandle]>,
    /// Set by [`drain`](Self::drain): the scheduler offers nothing more.
    draining: Arc<AtomicBool>,
}

impl Dispatcher {
    /// Spawns `shards` shard actors, each supervising `workers_per_shard` workers, spread
    /// over one arbiter thread per CPU (a shard and its workers share a thread).
    pub fn spawn(
        shards: usize,
        workers_per_shard: usize,
        settings: ShardSettings,
        store: Arc<dyn Store>,
        delivery: Arc<dyn Delivery>,
        metrics: Arc<Metrics>,
        log: &slog::Logger,
    ) -> Self {
        let threads = shards.min(crate::config::cpus()).max(1);
        let arbiters: Vec<ArbiterHandle> = (0..threads).map(|_| Arbiter::new().handle()).collect();
        let node = Arc::new(Shared {
            store,
            settings: Arc::new(settings),
            metrics: Arc::clone(&metrics),
            done: DoneCache::with_bytes_gauge(metrics.cache_bytes_gauge()),
            gate: Gate::new(shards * workers_per_shard),
            room: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
            signals: Arc::default(),
            in_flight: NodeKeys::default(),
        });
        let addrs = (0..shards)
            .map(|index| {
                let arbiter = &arbiters[index % threads];
                let log = log.new(slog::o!("shard" => index));
                let workers = (0..workers_per_shard)
                    .map(|_| {
                        let delivery = Arc::clone(&delivery);
                        let (metrics, log) = (Arc::clone(&metrics), log.clone());
                        Supervisor::start_in_arbiter(arbiter, move |_| {
                            Worker::new(delivery, metrics, log)
                        })
                    })
                    .collect();
                let node = Arc::clone(&node);
                Shard::start_in_arbiter(arbiter, move |_| Shard::new(index, workers, &node, log))
            })
            .collect();
        Self {
            shards: addrs,
            done: node.done.clone(),
            gate: node.gate.clone(),
            room: Arc::clone(&node.room),
            signals: Arc::clone(&node.signals),
            in_flight: node.in_flight.clone(),
            metrics,
            log: log.clone(),
            arbiters: arbiters.into(),
            draining: Arc::default(),
        }
    }

    /// The done cache's answer for `id` arriving with payload `fingerprint`, answered on
    /// the caller's (HTTP) thread: no mailbox, no store. Call it before building the
    /// [`Event`], so a duplicate costs no more than this lookup.
    /// With `traced` (tracing on), its line carries the request's span ids.
    pub fn cached(
        &self,
        id: &EventId,
        fingerprint: Option<&str>,
        mode: Mode,
        traced: Option<&Traced>,
    ) -> Option<Answer> {
        let hit = cached_answer(&self.done, id, fingerprint, &self.log);
        self.metrics.cache(hit.is_some());
        let answer = hit?;
        self.metrics.attempt(&id.provider, answer.path);
        let with_ids;
        let log = match traced {
            None => &self.log,
            Some(traced) => {
                with_ids = self.log.new(slog::o!(
                    "trace_id" => hex::encode(traced.parent.trace_id),
                    "span_id" => hex::encode(traced.parent.span_id)));
                &with_ids
            }
        };
        slog::info!(log, "webhook.claim";
            "provider" => &*id.provider, "event_key" => &*id.key,
            "path" => answer.path.as_str(), "attempts" => answer.attempts,
            "mode" => mode.as_str(), "shard" => shard_for(id, self.shards.len()));
        Some(answer)
    }

    /// Hands `event` to its shard and waits for the answer (sync mode).
    pub async fn dispatch(&self, event: Event) -> Answer {
        self.send(event, |event, reply| Ingest { event, reply })
            .await
    }

    /// Hands a queue-mode `event` to its shard: answered once its row is durable.
    pub async fn enqueue(&self, event: Event) -> Answer {
        self.send(event, |event, reply| Enqueue { event, reply })
            .await
    }

    /// Hands a queue row the scheduler took to the shard that owns its key; gives it back
    /// when the shard's mailbox is full or the shard is gone (the caller then releases it).
    pub fn hand_over(&self, start: Start) -> Result<(), Box<Start>> {
        let index = shard_for(&start.taken.id, self.shards.len());
        match self.shards[index].try_send(start) {
            Ok(()) => {
                self.metrics.mailbox(index, 1);
                Ok(())
            }
            Err(SendError::Full(start) | SendError::Closed(start)) => Err(Box::new(start)),
        }
    }

    /// What wakes the queue scheduler.
    pub fn signals(&self) -> &QueueSignals {
        &self.signals
    }

    /// The shards that are gone: their actor stopped without being asked to (a panic in
    /// code it ran). Their keys' claims and outcomes can no longer be served.
    pub fn crashed_shards(&self) -> Vec<usize> {
        (0..self.shards.len())
            .filter(|&i| !self.shards[i].connected())
            .collect()
    }

    /// Whether the node has begun its shutdown ([`drain`](Self::drain)).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Queue rows the shards can take now (see [`Shared::room`]): a scheduler pass takes
    /// no more.
    pub fn room(&self) -> usize {
        self.room.iter().map(|n| n.load(Ordering::Relaxed)).sum()
    }

    /// The keys of `provider` in flight on this node now: a scheduler pass takes none of
    /// them (see [`NodeKeys`]).
    pub fn in_flight(&self, provider: &str) -> Vec<Arc<str>> {
        self.in_flight.of(provider)
    }

    /// Counts `id` as in flight on this node until the answer is dropped: a row the
    /// scheduler took, until its shard has entered it.
    pub fn hold(&self, id: &EventId) -> KeyHold {
        self.in_flight.hold(id)
    }

    /// The queue-mode providers' limits.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Sends `event` to its shard as `message` and waits for the answer.
    async fn send<M>(
        &self,
        event: Event,
        message: impl FnOnce(Arc<Event>, oneshot::Sender<Answer>) -> M,
    ) -> Answer
    where
        M: Message<Result = ()> + Send + 'static,
        Shard: Handler<M>,
    {
        let index = shard_for(&event.id, self.shards.len());
        let id = event.id.clone();
        let (reply, answer) = oneshot::channel();
        let msg = message(Arc::new(event), reply);
        let refused = |reason, cause: &str| {
            let answer = Answer::refused(reason);
            log_refusal(&self.log, &id, &answer, cause);
            self.metrics.attempt(&id.provider, answer.path);
            answer
        };
        if self.shards[index].try_send(msg).is_ok() {
            self.metrics.mailbox(index, 1);
        } else {
            let cause = format!("shard {index}'s mailbox is full");
            return refused(RetryReason::Overloaded, &cause);
        }
        match answer.await {
            Ok(answer) => answer,
            Err(_) => {
                let cause = format!("shard {index} dropped the request");
                refused(RetryReason::ShardUnavailable, &cause)
            }
        }
    }

    /// Replays dead letter `id` once through its shard, delivering to `target`.
    pub async fn replay(&self, id: EventId, target: Arc<Target>) -> Answer {
        let shard = &self.shards[shard_for(&id, self.shards.len())];
        let (reply, answer) = oneshot::channel();
        let unavailable = || Answer::refused(RetryReason::Overloaded);
        if shard.try_send(Replay { id, target, reply }).is_err() {
            return unavailable();
        }
        answer.await.unwrap_or_else(|_| unavailable())
    }

    /// Shutdown, first step: every shard stops claiming (see [`Drain`]).
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        join_all(self.shards.iter().map(|s| s.send(Drain))).await;
    }

    /// Shutdown, second step: waits until every claim on its way has come back and every
    /// running delivery has ended and been recorded — a sync one within its lease, a
    /// queue one whenever the store takes its write (the caller bounds the wait).
    pub async fn drained(&self) {
        join_all(self.shards.iter().map(|s| s.send(Drained))).await;
    }

    /// Stops the shard threads (after [`drained`](Self::drained)).
    pub fn stop(&self) {
        for arbiter in self.arbiters.iter() {
            arbiter.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_key_always_meets_the_same_shard_and_keys_spread() {
        let id = EventId::new("stripe", "evt_1");
        assert_eq!(shard_for(&id, 8), shard_for(&id.clone(), 8));
        let mut used = [0usize; 8];
        for i in 0..8000 {
            used[shard_for(&EventId::new("stripe", format!("evt_{i}")), 8)] += 1;
        }
        assert!(used.iter().all(|&n| n > 800), "{used:?}");
    }

    #[test]
    fn routing_is_keyed_per_process_not_fixed() {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let fixed = |id: &EventId| {
            let mut hasher = DefaultHasher::new();
            id.hash(&mut hasher);
            (hasher.finish() % 8) as usize
        };
        let ids: Vec<EventId> = (0..64)
            .map(|i| EventId::new("stripe", format!("evt_{i}")))
            .collect();
        let same = ids
            .iter()
            .filter(|id| shard_for(id, 8) == fixed(id))
            .count();
        assert!(same < ids.len(), "routing follows the fixed-key hasher");
    }

    #[test]
    fn the_provider_scopes_the_key() {
        let spread: std::collections::HashSet<usize> = (0..64)
            .map(|i| shard_for(&EventId::new(format!("p{i}"), "same"), 8))
            .collect();
        assert!(spread.len() > 1);
    }
}
