//! The counts `/admin/api/stats` answers from (rows per provider and status), kept per
//! node for `admin.stats_max_age`: counting reads the whole table (a million rows take a
//! few hundred milliseconds), and every open console asks every five seconds. One caller
//! counts when the kept counts are older than that, the callers that come meanwhile wait
//! for its answer instead of counting too (single flight), and every answer says how old
//! its counts are.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// A value read at most once per `max_age`.
pub struct StatsCache<T> {
    max_age: Duration,
    /// The last value and when it was read. A tokio mutex, held across the read on
    /// purpose: it is the single flight.
    last: Mutex<Option<(Instant, Arc<T>)>>,
}

impl<T> StatsCache<T> {
    /// An empty cache whose values are used for `max_age` (zero: read on every call, one
    /// call at a time).
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            last: Mutex::new(None),
        }
    }

    /// How long a value is used.
    pub fn max_age(&self) -> Duration {
        self.max_age
    }

    /// The value and its age: the kept one while younger than `max_age`, else a new one from
    /// `read` (kept only when it succeeds).
    pub async fn get<E, Fut>(&self, read: impl FnOnce() -> Fut) -> Result<(Arc<T>, Duration), E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, value)) = last.as_ref() {
            let age = at.elapsed();
            if age < self.max_age {
                return Ok((Arc::clone(value), age));
            }
        }
        let at = Instant::now();
        let value = Arc::new(read().await?);
        *last = Some((at, Arc::clone(&value)));
        Ok((value, at.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn concurrent_callers_share_one_read_and_a_kept_value_says_its_age() {
        let cache = StatsCache::new(Duration::from_secs(3600));
        let reads = AtomicU32::new(0);
        let read = || async {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            Ok::<u32, ()>(n)
        };
        let answers = futures_util::future::join_all((0..8).map(|_| cache.get(read))).await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            1,
            "one read for eight callers"
        );
        assert!(answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|(v, _)| **v == 0)));
        let (_, age) = cache.get(read).await.unwrap();
        assert!(age < Duration::from_secs(3600));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_value_past_its_age_or_a_failed_read_is_read_again() {
        let cache = StatsCache::new(Duration::ZERO);
        let reads = AtomicU32::new(0);
        let read = || async { Ok::<u32, ()>(reads.fetch_add(1, Ordering::SeqCst)) };
        assert_eq!(*cache.get(read).await.unwrap().0, 0);
        assert_eq!(
            *cache.get(read).await.unwrap().0,
            1,
            "max_age zero: read each time"
        );
        let kept = StatsCache::new(Duration::from_secs(3600));
        assert!(kept.get(|| async { Err::<u32, _>("down") }).await.is_err());
        assert_eq!(*kept.get(read).await.unwrap().0, 2, "a failure is not kept");
    }
}
