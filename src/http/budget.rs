//! The node-wide budget of request-body bytes in flight: every body is buffered whole
//! before its signature is checked, so without a bound the open connections times
//! `server.max_body_bytes` is the memory an unauthenticated crowd can make the node hold.
//! Past the budget a request is answered 503 `overloaded`, nothing claimed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of request bodies held now, and the most that may be.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    used: AtomicUsize,
}

/// Bytes taken from a [`BodyBudget`]; given back when dropped (when the request that read
/// the body has been answered).
#[derive(Debug)]
pub struct Reserved {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl BodyBudget {
    /// A budget of `limit` bytes (`server.max_body_bytes_in_flight`).
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation, grown as the body arrives.
    pub fn reserve(self: &Arc<Self>) -> Reserved {
        Reserved {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }

    /// Takes `n` bytes if they fit under the limit.
    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }
}

impl Reserved {
    /// Grows the reservation to `total` bytes; `false` (nothing taken) past the budget.
    pub fn grow_to(&mut self, total: usize) -> bool {
        if total <= self.bytes {
            return true;
        }
        let more = total - self.bytes;
        if self.budget.take(more) {
            self.bytes = total;
            true
        } else {
            false
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_limit_and_give_back_when_dropped() {
        let budget = BodyBudget::new(100);
        let mut a = budget.reserve();
        assert!(a.grow_to(60));
        let mut b = budget.reserve();
        assert!(!b.grow_to(41), "past the limit");
        assert!(b.grow_to(40));
        assert_eq!(budget.used(), 100);
        assert!(a.grow_to(60), "growing to what is held takes nothing");
        drop(a);
        assert_eq!(budget.used(), 40);
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
