//! A shard's bounded cache of done results, so `duplicate_done` is answered from memory.
//!
//! Safe with several nodes on one database because `done` is terminal: a cached result
//! can never become wrong. A miss is not an answer: the shard then asks the store.

use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;

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

/// Least-recently-used, bounded by entries; capacity 0 disables it.
pub struct DoneCache {
    entries: Option<LruCache<EventId, CachedDone>>,
}

impl DoneCache {
    /// A cache holding at most `capacity` results.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: NonZeroUsize::new(capacity).map(LruCache::new),
        }
    }

    /// The cached result for `id`, marking it recently used.
    pub fn get(&mut self, id: &EventId) -> Option<&CachedDone> {
        self.entries.as_mut()?.get(id)
    }

    /// Remembers a done result, evicting the least recently used one when full.
    pub fn insert(&mut self, id: EventId, done: CachedDone) {
        if let Some(entries) = self.entries.as_mut() {
            entries.put(id, done);
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, LruCache::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(n: i32) -> CachedDone {
        CachedDone {
            attempts: n,
            fingerprint: None,
            result: Arc::new(StoredResult {
                status: 200,
                content_type: None,
                body: Vec::new(),
            }),
        }
    }

    #[test]
    fn the_cache_never_grows_past_its_capacity() {
        let mut cache = DoneCache::new(3);
        for i in 0..100 {
            cache.insert(EventId::new("p", i.to_string()), done(1));
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&EventId::new("p", "99")).is_some());
        assert!(cache.get(&EventId::new("p", "0")).is_none());
    }

    #[test]
    fn capacity_zero_caches_nothing() {
        let mut cache = DoneCache::new(0);
        cache.insert(EventId::new("p", "k"), done(1));
        assert!(cache.is_empty());
        assert!(cache.get(&EventId::new("p", "k")).is_none());
    }
}
