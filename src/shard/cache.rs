//! The done cache: finished results in memory, so `duplicate_done` is answered without the
//! store — and, since HTTP handlers read it directly, without a trip through a shard.
//!
//! One concurrent map (`DashMap`) for the node. Only shards write it, each into its own
//! slice of the key space with its own bound ([`DoneWriter`]); anyone reads it
//! ([`DoneCache`]). Eviction is first-in-first-out per shard: a sender's redeliveries come
//! soon after the original, so insertion order is nearly as good as recency here, and
//! readers never take a write lock to record a hit (an LRU would).
//!
//! Safe with several nodes on one database because `done` is terminal: a cached result can
//! never become wrong. A miss is not an answer: the shard then asks the store.

use std::collections::VecDeque;
use std::sync::Arc;

use dashmap::DashMap;

use crate::claim::StoredResult;
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

/// The node's done results; cheap to clone, safe to read from any thread.
#[derive(Clone, Default)]
pub struct DoneCache {
    map: Arc<DashMap<EventId, CachedDone>>,
}

impl DoneCache {
    /// What the cache says about `id` arriving with payload fingerprint `incoming`.
    pub fn lookup(&self, id: &EventId, incoming: Option<&str>) -> Option<Hit> {
        let entry = self.map.get(id)?;
        let mismatch = matches!(
            (entry.fingerprint.as_deref(), incoming),
            (Some(stored), Some(incoming)) if stored != incoming
        );
        Some(if mismatch {
            Hit::Mismatch {
                attempts: entry.attempts,
                stored: entry.fingerprint.clone(),
            }
        } else {
            Hit::Done {
                attempts: entry.attempts,
                result: Arc::clone(&entry.result),
            }
        })
    }

    /// Entries held now, over all shards.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// A writer for one shard holding at most `capacity` of the entries.
    pub fn writer(&self, capacity: usize) -> DoneWriter {
        DoneWriter {
            cache: self.clone(),
            order: VecDeque::new(),
            capacity,
        }
    }
}

/// One shard's side of the cache: inserts, and evicts its own oldest entries.
pub struct DoneWriter {
    cache: DoneCache,
    /// This shard's keys, oldest first; owned by the shard alone, so no lock.
    order: VecDeque<EventId>,
    capacity: usize,
}

impl DoneWriter {
    /// Remembers a done result; evicts this shard's oldest entry when full. Capacity 0
    /// caches nothing.
    pub fn insert(&mut self, id: EventId, done: CachedDone) {
        if self.capacity == 0 {
            return;
        }
        if self.cache.map.insert(id.clone(), done).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.cache.map.remove(&oldest);
            }
        }
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
        let mut a = cache.writer(3);
        let mut b = cache.writer(2);
        for i in 0..100 {
            a.insert(EventId::new("a", i.to_string()), done(None));
            b.insert(EventId::new("b", i.to_string()), done(None));
        }
        assert_eq!(cache.len(), 5);
        assert!(cache.lookup(&EventId::new("a", "99"), None).is_some());
        assert!(cache.lookup(&EventId::new("a", "96"), None).is_none());
        assert!(cache.lookup(&EventId::new("b", "98"), None).is_some());
    }

    #[test]
    fn a_different_fingerprint_is_a_mismatch_and_none_matches_anything() {
        let cache = DoneCache::default();
        cache
            .writer(10)
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
        cache.writer(0).insert(EventId::new("p", "k"), done(None));
        assert!(cache.is_empty());
        let mut w = cache.writer(5);
        for _ in 0..10 {
            w.insert(EventId::new("p", "same"), done(None));
        }
        assert_eq!(cache.len(), 1);
    }
}
