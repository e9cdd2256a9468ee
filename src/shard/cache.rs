//! The done cache: finished results in memory, so `duplicate_done` is answered without the
//! store — and, since HTTP handlers read it directly, without a trip through a shard.
//!
//! One concurrent map (`DashMap`) for the node. Only shards write it, each into its own
//! slice of the key space with its own bound ([`DoneWriter`]); anyone reads it
//! ([`DoneCache`]). Eviction is first-in-first-out per shard: a sender's redeliveries come
//! soon after the original, so insertion order is nearly as good as recency here, and
//! readers never take a write lock to record a hit (an LRU would).
//!
//! Bounded twice per shard: by entries and by bytes (answers may be up to 64 KiB each), so
//! memory stays flat whatever the target answers. An evicted result is still replayed
//! whole, from the row.
//!
//! Safe with several nodes on one database because `done` is terminal: a cached result can
//! never become wrong. A miss is not an answer: the shard then asks the store.

use std::collections::VecDeque;
use std::sync::Arc;

use dashmap::DashMap;
use prometheus_client::metrics::gauge::Gauge;

use crate::claim::{fingerprints_differ, other_kind, StoredResult};
use crate::key::EventId;

/// One cached done event.
#[derive(Debug, Clone)]
pub struct CachedDone {
    /// The row's attempts when it was done.
    pub attempts: i32,
    /// The payload fingerprint, to detect a mismatching redelivery.
    pub fingerprint: Option<String>,
    /// The result replayed to duplicates.
    pub result: Arc<StoredResult>,
}

/// What the cache knows about a delivery.
#[derive(Debug, Clone)]
pub enum Hit {
    /// Done, with the same payload: replay `result`.
    Done {
        /// The row's attempts.
        attempts: i32,
        /// The cached result.
        result: Arc<StoredResult>,
    },
    /// Done, but first seen with another payload.
    Mismatch {
        /// The row's attempts.
        attempts: i32,
        /// The stored fingerprint.
        stored: Option<String>,
    },
}

/// Bytes an entry costs beyond its variable parts: the map slot, the `Arc`s, the order
/// queue's copy of the id. An estimate; it keeps tiny answers from looking free.
const ENTRY_OVERHEAD: usize = 160;

/// What one cached entry costs, in bytes (estimated).
fn entry_bytes(id: &EventId, done: &CachedDone) -> usize {
    ENTRY_OVERHEAD
        + 2 * (id.provider.len() + id.key.len())
        + done.fingerprint.as_ref().map_or(0, String::len)
        + done.result.content_type.as_ref().map_or(0, String::len)
        + done.result.body.len()
}

/// The node's done results; cheap to clone, safe to read from any thread.
#[derive(Clone, Default)]
pub struct DoneCache {
    map: Arc<DashMap<EventId, CachedDone>>,
    /// Bytes held over all shards (the `hookgate_cache_bytes` gauge).
    bytes: Gauge,
}

impl DoneCache {
    /// An empty cache whose size in bytes is kept in `bytes`.
    pub fn with_bytes_gauge(bytes: Gauge) -> Self {
        Self {
            map: Arc::default(),
            bytes,
        }
    }

    /// Bytes held now, over all shards (estimated).
    pub fn bytes(&self) -> i64 {
        self.bytes.get()
    }

    /// What the cache says about `id` arriving with payload fingerprint `incoming`.
    pub fn lookup(&self, id: &EventId, incoming: Option<&str>) -> Option<Hit> {
        let entry = self.map.get(id)?;
        if other_kind(entry.fingerprint.as_deref(), incoming).is_some() {
            // Fingerprinted under another key (a rotation since): the store's path
            // compares them, fingerprinting the payload again under the row's kind.
            return None;
        }
        Some(
            if fingerprints_differ(entry.fingerprint.as_deref(), incoming) {
                Hit::Mismatch {
                    attempts: entry.attempts,
                    stored: entry.fingerprint.clone(),
                }
            } else {
                Hit::Done {
                    attempts: entry.attempts,
                    result: Arc::clone(&entry.result),
                }
            },
        )
    }

    /// Entries held now, over all shards.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// A writer for one shard holding at most `capacity` entries and `max_bytes` bytes.
    pub fn writer(&self, capacity: usize, max_bytes: usize) -> DoneWriter {
        DoneWriter {
            cache: self.clone(),
            order: VecDeque::new(),
            capacity,
            max_bytes,
            bytes: 0,
        }
    }
}

/// One shard's side of the cache: inserts, and evicts its own oldest entries.
pub struct DoneWriter {
    cache: DoneCache,
    /// This shard's keys with their cost, oldest first; owned by the shard alone, so no
    /// lock.
    order: VecDeque<(EventId, usize)>,
    capacity: usize,
    max_bytes: usize,
    /// Bytes this shard's entries hold.
    bytes: usize,
}

impl DoneWriter {
    /// Remembers a done result; evicts this shard's oldest entries while it holds more
    /// than its entries or bytes allow. Capacity 0, or an entry larger than the byte
    /// bound, caches nothing.
    pub fn insert(&mut self, id: EventId, done: CachedDone) {
        let cost = entry_bytes(&id, &done);
        if self.capacity == 0 || cost > self.max_bytes {
            return;
        }
        if self.cache.map.insert(id.clone(), done).is_some() {
            // A key already cached: `done` is terminal, so the entry is the same result.
            return;
        }
        self.order.push_back((id, cost));
        self.grow(cost);
        while self.order.len() > self.capacity || self.bytes > self.max_bytes {
            let Some((oldest, cost)) = self.order.pop_front() else {
                break;
            };
            self.cache.map.remove(&oldest);
            self.shrink(cost);
        }
    }

    fn grow(&mut self, cost: usize) {
        self.bytes += cost;
        self.cache
            .bytes
            .inc_by(i64::try_from(cost).unwrap_or(i64::MAX));
    }

    fn shrink(&mut self, cost: usize) {
        self.bytes -= cost;
        self.cache
            .bytes
            .dec_by(i64::try_from(cost).unwrap_or(i64::MAX));
    }

    /// The cache this writer fills.
    pub fn cache(&self) -> &DoneCache {
        &self.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(fingerprint: Option<&str>) -> CachedDone {
        CachedDone {
            attempts: 1,
            fingerprint: fingerprint.map(str::to_owned),
            result: Arc::new(StoredResult {
                status: 200,
                content_type: None,
                body: Vec::new(),
            }),
        }
    }

    #[test]
    fn each_shard_keeps_at_most_its_capacity_and_evicts_its_oldest() {
        let cache = DoneCache::default();
        let mut a = cache.writer(3, usize::MAX);
        let mut b = cache.writer(2, usize::MAX);
        for i in 0..100 {
            a.insert(EventId::new("a", i.to_string()), done(None));
            b.insert(EventId::new("b", i.to_string()), done(None));
        }
        assert_eq!(cache.len(), 5);
        assert!(cache.lookup(&EventId::new("a", "99"), None).is_some());
        assert!(cache.lookup(&EventId::new("a", "96"), None).is_none());
        assert!(cache.lookup(&EventId::new("b", "98"), None).is_some());
    }

    fn large(body: usize) -> CachedDone {
        CachedDone {
            attempts: 1,
            fingerprint: None,
            result: Arc::new(StoredResult {
                status: 200,
                content_type: None,
                body: vec![0; body],
            }),
        }
    }

    #[test]
    fn large_answers_are_evicted_by_bytes_and_the_total_stays_under_the_bound() {
        let cache = DoneCache::default();
        let mut w = cache.writer(1_000_000, 1024 * 1024);
        for i in 0..1000 {
            w.insert(EventId::new("p", i.to_string()), large(64 * 1024));
            assert!(cache.bytes() <= 1024 * 1024, "{}", cache.bytes());
        }
        assert_eq!(
            cache.len(),
            15,
            "16 bodies of 64 KiB plus overhead exceed 1 MiB"
        );
        assert!(cache.lookup(&EventId::new("p", "999"), None).is_some());
        assert!(cache.lookup(&EventId::new("p", "0"), None).is_none());
        // An entry larger than the whole bound is not cached at all.
        w.insert(EventId::new("p", "huge"), large(2 * 1024 * 1024));
        assert!(cache.lookup(&EventId::new("p", "huge"), None).is_none());
    }

    #[test]
    fn a_different_fingerprint_is_a_mismatch_and_none_matches_anything() {
        let cache = DoneCache::default();
        cache
            .writer(10, usize::MAX)
            .insert(EventId::new("p", "k"), done(Some("f1")));
        let id = EventId::new("p", "k");
        assert!(matches!(
            cache.lookup(&id, Some("f1")),
            Some(Hit::Done { .. })
        ));
        assert!(matches!(cache.lookup(&id, None), Some(Hit::Done { .. })));
        assert!(matches!(
            cache.lookup(&id, Some("f2")),
            Some(Hit::Mismatch { .. })
        ));
    }

    #[test]
    fn capacity_zero_caches_nothing_and_reinserting_does_not_grow() {
        let cache = DoneCache::default();
        cache
            .writer(0, usize::MAX)
            .insert(EventId::new("p", "k"), done(None));
        assert!(cache.is_empty());
        let mut w = cache.writer(5, usize::MAX);
        for _ in 0..10 {
            w.insert(EventId::new("p", "same"), done(None));
        }
        assert_eq!(cache.len(), 1);
    }
}
