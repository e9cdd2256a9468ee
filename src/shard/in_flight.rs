//! A shard's in-flight set: the keys this node is working on now, each entry told apart
//! from a later one for the same key by a token, so a late answer can only ever touch the
//! entry of the request that asked.
//!
//! Owned by one shard actor and touched only by its handlers: no lock. Each set also
//! counts its keys in the node's [`NodeKeys`], which the queue scheduler reads: a pass
//! takes no row whose key is in flight here when the pass starts (see [`NodeKeys`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
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
    /// When the entry was made; a sync entry older than the lease is not trusted, unless
    /// its attempt renews its lease (`renews`).
    pub(super) since: Instant,
    /// Whether the entry's attempt renews its lease while it runs and writes its outcome
    /// however long the store takes: a replay (from its reopen on, in either mode), or a
    /// sync row's attempt on a queue-mode provider whose target may outlast the lease.
    pub(super) renews: bool,
    /// The request that made it.
    pub(super) event: Arc<Event>,
    /// Requests for the same key that arrived before the claim was answered; they get the
    /// answer the claim's row implies instead of a blind 409.
    pub(super) waiters: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
}

/// The keys in flight on this node, across its shards, each with how many hold it: the
/// shard's in-flight entry (each key is in one shard's set), and a row the scheduler took
/// until its shard has entered it ([`KeyHold`]).
///
/// The queue scheduler skips them when it takes due rows. A key in flight here whose lease
/// ran out (its renewals or its outcome write held up by a stalled database) is still this
/// node's to finish: a take would bump the row's attempt number and so fence out the write
/// of an answer the target already gave, and the event would be sent again.
#[derive(Clone, Default)]
pub struct NodeKeys(Arc<DashMap<EventId, usize>>);

impl NodeKeys {
    /// The keys of `provider` in flight on this node now.
    pub fn of(&self, provider: &str) -> Vec<Arc<str>> {
        self.0
            .iter()
            .filter(|held| &*held.key().provider == provider)
            .map(|held| Arc::clone(&held.key().key))
            .collect()
    }

    /// Holds `id` in the set until the answer is dropped.
    pub fn hold(&self, id: &EventId) -> KeyHold {
        self.add(id);
        KeyHold {
            keys: self.clone(),
            id: id.clone(),
        }
    }

    fn add(&self, id: &EventId) {
        *self.0.entry(id.clone()).or_insert(0) += 1;
    }

    fn remove(&self, id: &EventId) {
        self.0.remove_if_mut(id, |_, holders| {
            *holders = holders.saturating_sub(1);
            *holders == 0
        });
    }
}

/// One hold on a key of [`NodeKeys`], let go when dropped.
pub struct KeyHold {
    keys: NodeKeys,
    id: EventId,
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        self.keys.remove(&self.id);
    }
}

/// The in-flight set of one shard.
pub(super) struct InFlightSet {
    entries: HashMap<EventId, Entry>,
    next_token: u64,
    node: NodeKeys,
}

impl InFlightSet {
    /// An empty set counting its keys in `node`.
    pub(super) fn new(node: NodeKeys) -> Self {
        Self {
            entries: HashMap::new(),
            next_token: 0,
            node,
        }
    }

    /// Enters `event` (replacing any stale entry for its key) with `attempts`; answers the
    /// token that tells this entry from later ones.
    pub(super) fn begin(&mut self, event: &Arc<Event>, attempts: Option<i32>) -> u64 {
        self.next_token += 1;
        let token = self.next_token;
        let entry = Entry {
            token,
            attempts,
            since: Instant::now(),
            renews: false,
            event: Arc::clone(event),
            waiters: Vec::new(),
        };
        if self.entries.insert(event.id.clone(), entry).is_none() {
            self.node.add(&event.id);
        }
        token
    }

    /// Marks the entry for `id`, if it is still the one `token` made, as an attempt that
    /// renews its lease: trusted however old (see [`Entry::renews`]).
    pub(super) fn renews(&mut self, id: &EventId, token: u64) {
        if let Some(entry) = self.entries.get_mut(id).filter(|e| e.token == token) {
            entry.renews = true;
        }
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
            self.node.remove(id);
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
    use crate::provider::Target;

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
                filter: None,
            }),
            headers: Default::default(),
            mode: crate::claim::Mode::Sync,
            filtered: false,
            others: Vec::new(),
            fingerprinter: None,
            trace: None,
        })
    }

    #[test]
    fn a_late_win_never_lands_on_a_newer_entry_for_the_same_key() {
        let mut set = InFlightSet::new(NodeKeys::default());
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

    #[test]
    fn the_node_sees_a_key_from_its_first_entry_until_its_last_is_forgotten() {
        let node = NodeKeys::default();
        let mut set = InFlightSet::new(node.clone());
        let keys = |provider| {
            let mut keys: Vec<String> = node.of(provider).iter().map(|k| k.to_string()).collect();
            keys.sort();
            keys
        };
        let old = set.begin(&event("k"), None);
        let new = set.begin(&event("k"), None);
        let other = set.begin(&event("j"), None);
        assert_eq!(keys("p"), ["j", "k"]);
        assert!(keys("q").is_empty(), "another provider's keys");
        set.forget(&EventId::new("p", "k"), old);
        assert_eq!(keys("p"), ["j", "k"], "a stale token forgot the key");
        set.forget(&EventId::new("p", "k"), new);
        set.forget(&EventId::new("p", "j"), other);
        assert!(keys("p").is_empty());
    }

    #[test]
    fn a_schedulers_hold_keeps_a_key_until_both_it_and_the_entry_are_gone() {
        let node = NodeKeys::default();
        let mut set = InFlightSet::new(node.clone());
        let id = EventId::new("p", "k");
        let hold = node.hold(&id);
        assert_eq!(node.of("p").len(), 1, "held before the shard entered it");
        let token = set.begin(&event("k"), Some(1));
        drop(hold);
        assert_eq!(node.of("p").len(), 1, "the entry still holds it");
        let again = node.hold(&id);
        set.forget(&id, token);
        assert_eq!(node.of("p").len(), 1, "the second hold still holds it");
        drop(again);
        assert!(node.of("p").is_empty());
    }
}
