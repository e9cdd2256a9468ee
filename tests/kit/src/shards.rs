//! Per-key state for the target, split over many locks by the key's hash.
//!
//! A target that keeps one `HashMap` entry per key stalls every delivery whenever the map
//! doubles: the rehash moves every entry while the target's one worker thread waits on it.
//! At a million keys that was over half a second (measured: 590 ms at 917 504 keys for the
//! load target's two maps, 1.3 s at 1.8 million), long enough to show as the run's maximum
//! latency and as a "pause" of the system under test. Split [`SHARDS`] ways, a shard
//! doubles at a 256th of the size, so the longest rehash of a two-million-key run is a
//! few milliseconds.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};

/// How many ways the keys are split.
pub const SHARDS: usize = 256;

/// `T` per shard; a key always lands in the same one.
pub struct Shards<T> {
    shards: Box<[Mutex<T>]>,
    hasher: RandomState,
}

impl<T: Default> Default for Shards<T> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
        }
    }
}

impl<T> Shards<T> {
    /// The shard `key` belongs to, locked.
    pub fn lock(&self, key: &str) -> MutexGuard<'_, T> {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[i].lock().expect("a target's shard")
    }

    /// Each shard in turn, locked while `f` reads it.
    /// Runs `f` on every shard in turn, to change it.
    pub fn each_mut(&self, mut f: impl FnMut(&mut T)) {
        for shard in self.shards.iter() {
            f(&mut shard.lock().expect("a target's shard"));
        }
    }

    pub fn each(&self, mut f: impl FnMut(&T)) {
        for shard in self.shards.iter() {
            f(&shard.lock().expect("a target's shard"));
        }
    }
}
