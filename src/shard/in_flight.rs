//! A shard's in-flight set: the keys this node is working on now, each entry told apart
//! from a later one for the same key by a token, so a late answer can only ever touch the
//! entry of the request that asked.
//!
//! Owned by one shard actor and touched only by its handlers: no lock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::answer::Answer;
use super::event::Event;
use crate::key::EventId;

/// A key this shard is working on now.
pub(super) struct Entry {
    /// Tells this entry from a later one for the same key.
    pub(super) token: u64,
    /// `None` until the claim is won (waiting for a worker, or the claim on its way).
    pub(super) attempts: Option<i32>,
    /// When the entry was made; an entry older than the lease is not trusted.
    pub(super) since: Instant,
    /// The request that made it.
    pub(super) event: Arc<Event>,
    /// Requests for the same key that arrived before the claim was answered; they get the
    /// answer the claim's row implies instead of a blind 409.
    pub(super) waiters: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
}

/// The in-flight set of one shard.
#[derive(Default)]
pub(super) struct InFlightSet {
    entries: HashMap<EventId, Entry>,
    next_token: u64,
}

impl InFlightSet {
    /// Enters `event` (replacing any stale entry for its key) with `attempts`; answers the
    /// token that tells this entry from later ones.
    pub(super) fn begin(&mut self, event: &Arc<Event>, attempts: Option<i32>) -> u64 {
        self.next_token += 1;
        let token = self.next_token;
        self.entries.insert(
            event.id.clone(),
            Entry {
                token,
                attempts,
                since: Instant::now(),
                event: Arc::clone(event),
                waiters: Vec::new(),
            },
        );
        token
    }

    /// The entry for `id`, whoever made it.
    pub(super) fn get(&self, id: &EventId) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// The entry for `id`, whoever made it, to add a waiter.
    pub(super) fn get_mut(&mut self, id: &EventId) -> Option<&mut Entry> {
        self.entries.get_mut(id)
    }

    /// Records that the claim made under `token` was won with `attempts` for `event` (as
    /// the row holds it: a taken or reopened row brings its payload's fingerprint, so a
    /// redelivery with another payload is refused), and hands over the requests that
    /// waited on it. Changes nothing (and answers no waiters) when the entry for the key is
    /// no longer the one `token` made.
    pub(super) fn won(
        &mut self,
        event: &Arc<Event>,
        token: u64,
        attempts: i32,
    ) -> Vec<(Arc<Event>, oneshot::Sender<Answer>)> {
        match self.entries.get_mut(&event.id) {
            Some(entry) if entry.token == token => {
                entry.attempts = Some(attempts);
                entry.event = Arc::clone(event);
                std::mem::take(&mut entry.waiters)
            }
            _ => Vec::new(),
        }
    }

    /// Drops the entry for `id` if it is still the one `token` made, and hands over the
    /// requests that waited on it.
    pub(super) fn forget(
        &mut self,
        id: &EventId,
        token: u64,
    ) -> Vec<(Arc<Event>, oneshot::Sender<Answer>)> {
        if self.entries.get(id).is_some_and(|e| e.token == token) {
            self.entries
                .remove(id)
                .map(|e| e.waiters)
                .unwrap_or_default()
        } else {
            Vec::new()
        }
    }

    /// Whether a key is in the set.
    pub(super) fn contains(&self, id: &EventId) -> bool {
        self.entries.contains_key(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Target;

    fn event(key: &str) -> Arc<Event> {
        Arc::new(Event {
            id: EventId::new("p", key),
            body: Default::default(),
            content_type: None,
            fingerprint: None,
            target: Arc::new(Target {
                url: "http://127.0.0.1:9/".into(),
                timeout: std::time::Duration::from_secs(1),
                keep_headers: Vec::new(),
                signing_key: None,
                tls: None,
                horizon: std::time::Duration::from_secs(3600),
                keep_payload: false,
            }),
            headers: Default::default(),
            mode: crate::config::Mode::Sync,
        })
    }

    #[test]
    fn a_late_win_never_lands_on_a_newer_entry_for_the_same_key() {
        let mut set = InFlightSet::default();
        let old = set.begin(&event("k"), None);
        let new = set.begin(&event("k"), None);
        assert!(set.won(&event("k"), old, 7).is_empty());
        assert_eq!(set.get(&EventId::new("p", "k")).unwrap().attempts, None);
        assert!(set.forget(&EventId::new("p", "k"), old).is_empty());
        assert!(
            set.contains(&EventId::new("p", "k")),
            "the old token forgot nothing"
        );
        set.won(&event("k"), new, 8);
        assert_eq!(set.get(&EventId::new("p", "k")).unwrap().attempts, Some(8));
        set.forget(&EventId::new("p", "k"), new);
        assert!(!set.contains(&EventId::new("p", "k")));
    }
}
