//! The ring as this node last read it, and a filter of each sealed slot's keys: what lets a
//! claim name only the slots that can hold its key (`batch_sql::claim_on_slots`).
//!
//! A sealed slot's keys never grow. A turn seals the current slot under the ring's lock,
//! which waits for every insert into it, and after that nothing inserts into a slot that
//! is not current but the emptying's moves, which go to the keep slot. Rows may go (a
//! swept dead letter), which leaves a filter with a key it no longer needs: a probe that
//! finds nothing, never a key missed. So a filter of a sealed slot's keys, read once after
//! the seal, answers "not here" for good, for as long as the slot stays sealed in that
//! life. A claim skips the slots whose filter has no such key; its statement's guard
//! checks, in its own snapshot, that each of those slots is still sealed at the same
//! `sealed_at` (or `empty`). A slot emptied and opened again since has another
//! `sealed_at` or none, and the statement then answers nothing, as it does when the ring
//! has outgrown the slots it names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use deadpool_postgres::Client;
use fastbloom::BloomFilter;

use super::rows::{db_error, get};
use crate::key::EventId;
use crate::store::{SlotFilter as Built, StoreError};

/// Keys read per statement while a filter is built: each page a short read of the slot's
/// key index, under the statement deadline.
const PAGE: i64 = 10_000;

/// The filters' false-positive rate: a key the filter wrongly holds costs one probe of
/// that slot, as every key did without filters. About 9.6 bits per key.
const FALSE_POSITIVES: f64 = 0.01;

/// Pages the current slot's partition must have in its statistics (`pg_class.relpages`,
/// set by `ANALYZE` or `VACUUM`) before the completions' batch statement runs on a plan
/// cached for it ([`RingView::settled`]): a megabyte, about 10 000 done rows. The ring
/// opens each slot empty, and a plan Postgres caches while the partition holds a few rows
/// walks it whole once it has grown (an index read end to end, as the outer side of the
/// join): 5 249 buffers a call for 4 rows in the soak, until an autovacuum happened to
/// analyze the partition. Statistics of this size make every plan cached from then on find
/// the batch's rows by key, however the partition grows (tests/api/store/plans.rs).
pub(crate) const SETTLED_PAGES: i32 = 128;

/// The bit of [`RingView`]'s current slot that says its partition is settled.
const SETTLED: i32 = 1 << 8;

/// One seed for every filter, so a key is hashed once for all of them. A key chosen to be
/// wrongly held costs a probe, never an answer.
const SEED: u128 = 0x686f_6f6b_6761_7465_5f73_6c6f_7473;

/// An empty filter sized for `expected` keys.
fn filter(expected: usize) -> BloomFilter {
    BloomFilter::with_false_pos(FALSE_POSITIVES)
        .seed(&SEED)
        .expected_items(expected)
}

/// The ring's slots as last read (`hookgate_slots`): the current one and those that are not
/// `empty`, or unknown, with the filters of the sealed slots' keys. Only a hint: a
/// statement run on a slot that no longer holds its row changes nothing, and one that
/// probes slots the ring has outgrown, or skips a slot sealed again since its filter was
/// read, answers nothing; either caller then runs the whole statement and reads the ring
/// again.
#[derive(Debug)]
pub(crate) struct RingView {
    /// The current slot, with [`SETTLED`] when its partition's statistics say it has grown;
    /// -1 when not read.
    current: AtomicI32,
    /// The filled slots as read: the current one, the sealed ones newest first, the keep
    /// slot.
    read: RwLock<Option<Arc<[i16]>>>,
    /// The order a claim probes them in ([`RingView::filled`]).
    filled: RwLock<Option<Arc<[i16]>>>,
    /// The sealed slots as last read, with their `sealed_at`.
    sealed: RwLock<Arc<[(i16, SystemTime)]>>,
    /// The filters of sealed slots' keys, by slot, each for the life it was read in.
    filters: RwLock<Arc<HashMap<i16, Arc<SlotFilter>>>>,
    /// The sealed slots (and lives) whose keys were too many for the filters' room: not
    /// read again at every pass while they stay sealed in that life.
    refused: RwLock<Vec<(i16, SystemTime)>>,
    /// `store.slot_filter_keys`: the keys all filters may hold together (0: no filters).
    capacity: u64,
}

/// The keys of one sealed slot, read after its seal.
struct SlotFilter {
    sealed_at: SystemTime,
    keys: BloomFilter,
    count: u64,
}

impl std::fmt::Debug for SlotFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotFilter")
            .field("sealed_at", &self.sealed_at)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// What a claim statement's probes may skip, as its two parameters after the whole
/// statement's (`batch_sql::claim_on_slots`).
#[derive(Debug, Default)]
pub(crate) struct Skips {
    /// Per key, a bit (`1 << slot`) for each slot whose filter has not got the key.
    pub(crate) masks: Vec<i32>,
    /// Per slot + 1, the `sealed_at` of the life each filter was read in.
    pub(crate) sealed: Vec<Option<SystemTime>>,
}

/// The bytes of a filter's bits.
fn bytes(keys: &BloomFilter) -> u64 {
    u64::try_from(keys.num_bits() / 8).unwrap_or(u64::MAX)
}

/// The value a filter holds for a key.
fn member(id: &EventId) -> (&str, &str) {
    (&id.provider, &id.key)
}

impl RingView {
    /// A view not read yet, whose filters hold `capacity` keys at most.
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            current: AtomicI32::new(-1),
            read: RwLock::new(None),
            filled: RwLock::new(None),
            sealed: RwLock::new(Arc::new([])),
            filters: RwLock::new(Arc::default()),
            refused: RwLock::new(Vec::new()),
            capacity,
        }
    }

    /// The current slot last read, if any.
    pub(crate) fn current(&self) -> Option<i16> {
        let current = self.current.load(Ordering::Relaxed);
        (current >= 0)
            .then(|| i16::try_from(current & !SETTLED).ok())
            .flatten()
    }

    /// Whether the current slot's partition, as last read, has statistics of at least
    /// [`SETTLED_PAGES`]: then a plan Postgres caches for a statement that joins its input
    /// with the partition fits it from then on. Until it has, such a statement is planned
    /// at each run, for the partition as it is then ([`RingView::ripen`]).
    pub(crate) fn settled(&self) -> bool {
        let current = self.current.load(Ordering::Relaxed);
        current >= 0 && current & SETTLED != 0
    }

    /// Asks whether the current slot `slot`'s partition has grown to [`SETTLED_PAGES`], and
    /// if it has but its statistics have not, analyzes it (without waiting for a lock:
    /// autovacuum or another node analyzing it will do as well). Either settles the view.
    /// Run before each completion batch while the view is not settled: one read of the
    /// catalog, and once per turn an `ANALYZE` of a megabyte or so — whose new statistics
    /// also make Postgres plan again every statement cached for the partition while it
    /// was small. A failure leaves the view as it was.
    pub(crate) async fn ripen(&self, client: &Client, slot: i16) -> Result<(), StoreError> {
        let partition = format!("webhook_events_s{slot}");
        let sizes = async || -> Result<(i32, i64), StoreError> {
            let row = client
                .query_one(
                    "SELECT c.relpages AS stats,
                            (pg_relation_size(c.oid) / current_setting('block_size')::int8)
                                ::int8 AS pages
                     FROM pg_class c WHERE c.oid = to_regclass($1)",
                    &[&partition],
                )
                .await
                .map_err(db_error)?;
            Ok((get(&row, "stats")?, get(&row, "pages")?))
        };
        let (mut stats, pages) = sizes().await?;
        if stats < SETTLED_PAGES && pages >= i64::from(SETTLED_PAGES) {
            client
                .batch_execute(&format!("ANALYZE (SKIP_LOCKED) {partition}"))
                .await
                .map_err(db_error)?;
            stats = sizes().await?.0;
        }
        if stats >= SETTLED_PAGES {
            let _ = self.current.compare_exchange(
                i32::from(slot),
                i32::from(slot) | SETTLED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        Ok(())
    }

    /// The slots that were not empty when last read, if read, in the order a claim probes
    /// them, stopping at the key's row: the sealed slots this node has a filter of (newest
    /// first), then the current slot, the other sealed slots (newest first) and the keep
    /// slot. A filtered slot is probed only for the keys its filter holds, and then it
    /// nearly always holds the row: a redelivery of an old event costs one probe, of its
    /// own slot. A redelivery of a recent event (a sender's retries come within the hour)
    /// skips the filtered slots and is found in the current one, and a new key is proved
    /// absent from the current slot, the unfiltered ones and the keep slot.
    pub(crate) fn filled(&self) -> Option<Arc<[i16]>> {
        self.filled
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The slots `ids`' probes may skip: for each key, the slots whose filter has not got
    /// it; and the life each filter was read in, for the statement's guard.
    pub(crate) fn skips<'a>(&self, ids: impl IntoIterator<Item = &'a EventId>) -> Skips {
        let filters = Arc::clone(&self.filters.read().unwrap_or_else(|e| e.into_inner()));
        let mut sealed = Vec::new();
        for (&slot, filter) in filters.iter() {
            let at = usize::try_from(slot).unwrap_or_default();
            if sealed.len() <= at {
                sealed.resize(at + 1, None);
            }
            sealed[at] = Some(filter.sealed_at);
        }
        let hasher = filters.values().next().map(|f| &f.keys);
        let masks = ids
            .into_iter()
            .map(|id| {
                let Some(hasher) = hasher else { return 0 };
                let hash = hasher.source_hash(&member(id));
                filters
                    .iter()
                    .filter(|(_, filter)| !filter.keys.contains_hash(hash))
                    .fold(0, |mask, (&slot, _)| mask | 1_i32 << slot)
            })
            .collect();
        Skips { masks, sealed }
    }

    /// The bytes the filters held take.
    pub(crate) fn filter_bytes(&self) -> u64 {
        let filters = self.filters.read().unwrap_or_else(|e| e.into_inner());
        filters.values().map(|f| bytes(&f.keys)).sum()
    }

    /// Forgets the view: the next statement that needs it reads it first. The filters
    /// stay: each names the life it was read in, and the next read keeps only those whose
    /// slot is still sealed in it.
    pub(crate) fn forget(&self) {
        self.current.store(-1, Ordering::Relaxed);
        *self.read.write().unwrap_or_else(|e| e.into_inner()) = None;
        *self.filled.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Reads the ring again after a statement that committed: a failed read forgets the
    /// view (the next statement reads it first) rather than fail what the statement did.
    pub(crate) async fn refresh(&self, client: &Client) {
        if self.read(client).await.is_err() {
            self.forget();
        }
    }

    /// Reads the ring on `client` and answers its current slot; drops the filters of
    /// slots no longer sealed in the life they were read in, and whether the current slot
    /// is [settled](RingView::settled). Reads a seven-row table and the catalog's rows of
    /// their partitions; locks nothing a claim waits for.
    pub(crate) async fn read(&self, client: &Client) -> Result<Option<i16>, StoreError> {
        let rows = client
            .query(
                "SELECT slot, state, sealed_at,
                        (SELECT relpages FROM pg_class
                         WHERE oid = to_regclass('webhook_events_s' || slot)) AS stats
                 FROM hookgate_slots WHERE state <> 'empty'
                 ORDER BY state = 'current' DESC, state = 'keep', sealed_at DESC, slot",
                &[],
            )
            .await
            .map_err(db_error)?;
        let mut current = None;
        let mut settled = false;
        let mut filled = Vec::with_capacity(rows.len());
        let mut sealed = Vec::new();
        for row in &rows {
            let slot: i16 = get(row, "slot")?;
            match &*get::<String>(row, "state")? {
                "current" => {
                    current = Some(slot);
                    let stats: Option<i32> = get(row, "stats")?;
                    settled = stats.is_some_and(|pages| pages >= SETTLED_PAGES);
                }
                "sealed" => {
                    if let Some(at) = get::<Option<SystemTime>>(row, "sealed_at")? {
                        sealed.push((slot, at));
                    }
                }
                _ => {}
            }
            filled.push(slot);
        }
        self.keep_filters(|slot, at| sealed.contains(&(slot, at)));
        self.refused
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|life| sealed.contains(life));
        let current_bits = current.map_or(-1, |slot| {
            i32::from(slot) | if settled { SETTLED } else { 0 }
        });
        self.current.store(current_bits, Ordering::Relaxed);
        *self.read.write().unwrap_or_else(|e| e.into_inner()) = Some(filled.into());
        self.order();
        *self.sealed.write().unwrap_or_else(|e| e.into_inner()) = sealed.into();
        Ok(current)
    }

    /// Puts the filled slots as read in the order a claim probes them ([`RingView::filled`]).
    fn order(&self) {
        let read = self.read.read().unwrap_or_else(|e| e.into_inner()).clone();
        let filters = Arc::clone(&self.filters.read().unwrap_or_else(|e| e.into_inner()));
        let ordered = read.map(|read| {
            let (first, rest): (Vec<i16>, Vec<i16>) =
                read.iter().partition(|slot| filters.contains_key(slot));
            first.into_iter().chain(rest).collect::<Arc<[i16]>>()
        });
        *self.filled.write().unwrap_or_else(|e| e.into_inner()) = ordered;
    }

    /// Keeps the filters of the slots and lives `keep` says.
    fn keep_filters(&self, keep: impl Fn(i16, SystemTime) -> bool) {
        let mut filters = self.filters.write().unwrap_or_else(|e| e.into_inner());
        if filters.iter().all(|(&slot, f)| keep(slot, f.sealed_at)) {
            return;
        }
        let kept = filters
            .iter()
            .filter(|(&slot, f)| keep(slot, f.sealed_at))
            .map(|(&slot, f)| (slot, Arc::clone(f)))
            .collect();
        *filters = Arc::new(kept);
    }

    /// Reads a filter of each sealed slot's keys that has none yet, as the view last read
    /// the ring, unless the slot was sealed longer than `fresh` ago (it is emptied soon,
    /// and a reader of its partition would only get in the way of the truncation) or its
    /// keys would take the filters past their capacity (by the partition's row estimate,
    /// or counted while read): such a slot is not asked about again in the same life. Each page of keys is one short
    /// statement in the order of the slot's key index; the slot's own state is read again
    /// after the last one, and a filter is kept only if the slot is still sealed in the
    /// same life. Answers the filters read.
    pub(crate) async fn build(
        &self,
        client: &Client,
        fresh: Duration,
    ) -> Result<Vec<Built>, StoreError> {
        let sealed = Arc::clone(&self.sealed.read().unwrap_or_else(|e| e.into_inner()));
        let mut built = Vec::new();
        for &(slot, sealed_at) in sealed.iter() {
            let (held, present) = {
                let filters = self.filters.read().unwrap_or_else(|e| e.into_inner());
                let held: u64 = filters.values().map(|f| f.count).sum();
                (held, filters.contains_key(&slot))
            };
            let young = sealed_at.elapsed().map_or(true, |age| age < fresh);
            let refused = (self.refused.read().unwrap_or_else(|e| e.into_inner()))
                .contains(&(slot, sealed_at));
            if present || refused || !young || held >= self.capacity {
                continue;
            }
            let room = self.capacity - held;
            let Some(filter) = read_keys(client, slot, sealed_at, room).await? else {
                self.refused
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((slot, sealed_at));
                continue;
            };
            let still: Option<SystemTime> = client
                .query_opt(
                    "SELECT sealed_at FROM hookgate_slots WHERE slot = $1 AND state = 'sealed'",
                    &[&slot],
                )
                .await
                .map_err(db_error)?
                .map(|row| get(&row, "sealed_at"))
                .transpose()?;
            if still != Some(sealed_at) {
                continue;
            }
            built.push(Built {
                slot,
                keys: filter.count,
                bytes: bytes(&filter.keys),
            });
            let mut filters = self.filters.write().unwrap_or_else(|e| e.into_inner());
            let mut next = HashMap::clone(&filters);
            next.insert(slot, Arc::new(filter));
            *filters = Arc::new(next);
            drop(filters);
            self.order();
        }
        Ok(built)
    }
}

/// A filter of slot `slot`'s keys, sized by its partition's row estimate and read again
/// at its true size if the estimate was short by half or more; `None` if it holds more
/// than `room` keys.
async fn read_keys(
    client: &Client,
    slot: i16,
    sealed_at: SystemTime,
    room: u64,
) -> Result<Option<SlotFilter>, StoreError> {
    let estimate: f32 = get(
        &client
            .query_one(
                &format!(
                    "SELECT reltuples FROM pg_class WHERE oid = 'webhook_events_s{slot}'::regclass"
                ),
                &[],
            )
            .await
            .map_err(db_error)?,
        "reltuples",
    )?;
    // Never analyzed: -1.
    let mut expected = estimate.max(0.0) as u64;
    if expected > room {
        return Ok(None);
    }
    for _ in 0..2 {
        let Some(filter) = read_pages(client, slot, sealed_at, expected, room).await? else {
            return Ok(None);
        };
        if filter.count <= expected.saturating_mul(3) / 2 + PAGE as u64 {
            return Ok(Some(filter));
        }
        expected = filter.count;
    }
    Ok(None)
}

/// One reading of slot `slot`'s keys into a filter sized for `expected` keys; `None` past
/// `room` keys.
async fn read_pages(
    client: &Client,
    slot: i16,
    sealed_at: SystemTime,
    expected: u64,
    room: u64,
) -> Result<Option<SlotFilter>, StoreError> {
    let first = format!(
        "SELECT provider, event_key FROM webhook_events_s{slot}
         ORDER BY provider, event_key LIMIT $1"
    );
    let next = format!(
        "SELECT provider, event_key FROM webhook_events_s{slot}
         WHERE (provider, event_key) > ($2, $3)
         ORDER BY provider, event_key LIMIT $1"
    );
    let sized = usize::try_from(expected.max(PAGE as u64)).unwrap_or(usize::MAX);
    let mut keys = filter(sized);
    let mut count = 0_u64;
    let mut after: Option<(String, String)> = None;
    loop {
        let rows = match &after {
            None => client.query(&first, &[&PAGE]).await,
            Some((provider, key)) => client.query(&next, &[&PAGE, provider, key]).await,
        }
        .map_err(db_error)?;
        for row in &rows {
            let provider: String = get(row, "provider")?;
            let key: String = get(row, "event_key")?;
            keys.insert(&(provider.as_str(), key.as_str()));
            after = Some((provider, key));
        }
        count += rows.len() as u64;
        if count > room {
            return Ok(None);
        }
        if rows.len() < PAGE as usize {
            return Ok(Some(SlotFilter {
                sealed_at,
                keys,
                count,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_slot_reads_the_same_settled_or_not_and_forgetting_unsettles_it() {
        let view = RingView::new(0);
        assert_eq!((view.current(), view.settled()), (None, false));
        view.current.store(5, Ordering::Relaxed);
        assert_eq!((view.current(), view.settled()), (Some(5), false));
        view.current.store(5 | SETTLED, Ordering::Relaxed);
        assert_eq!((view.current(), view.settled()), (Some(5), true));
        // Slot 0 settled is the bit alone.
        view.current.store(SETTLED, Ordering::Relaxed);
        assert_eq!((view.current(), view.settled()), (Some(0), true));
        view.forget();
        assert_eq!((view.current(), view.settled()), (None, false));
    }

    fn with_filter(view: &RingView, slot: i16, sealed_at: SystemTime, keys: &[&EventId]) {
        let mut filter = filter(1000);
        for id in keys {
            filter.insert(&member(id));
        }
        let mut filters = HashMap::clone(&view.filters.read().unwrap());
        filters.insert(
            slot,
            Arc::new(SlotFilter {
                sealed_at,
                keys: filter,
                count: keys.len() as u64,
            }),
        );
        *view.filters.write().unwrap() = Arc::new(filters);
        view.order();
    }

    #[test]
    fn a_claim_probes_the_filtered_slots_first_then_the_current_one() {
        let view = RingView::new(1_000);
        *view.read.write().unwrap() = Some(Arc::from([1, 4, 3, 6]));
        view.order();
        assert_eq!(view.filled().as_deref(), Some(&[1, 4, 3, 6][..]));
        with_filter(&view, 3, SystemTime::UNIX_EPOCH, &[]);
        assert_eq!(view.filled().as_deref(), Some(&[3, 1, 4, 6][..]));
        with_filter(&view, 4, SystemTime::UNIX_EPOCH, &[]);
        assert_eq!(view.filled().as_deref(), Some(&[4, 3, 1, 6][..]));
        view.keep_filters(|slot, _| slot == 3);
        view.order();
        assert_eq!(view.filled().as_deref(), Some(&[3, 1, 4, 6][..]));
    }

    #[test]
    fn a_key_is_skipped_only_in_the_slots_whose_filter_has_not_got_it() {
        let view = RingView::new(1_000);
        let (held, other) = (EventId::new("p", "held"), EventId::new("p", "other"));
        let (two, five) = (
            SystemTime::UNIX_EPOCH + Duration::from_secs(2),
            SystemTime::UNIX_EPOCH + Duration::from_secs(5),
        );
        assert_eq!(view.skips([&held]).masks, vec![0]);
        with_filter(&view, 2, two, &[&held]);
        with_filter(&view, 5, five, &[&held, &EventId::new("q", "other")]);
        let skips = view.skips([&held, &other]);
        assert_eq!(skips.masks, vec![0, 1 << 2 | 1 << 5]);
        assert_eq!(
            skips.sealed,
            vec![None, None, Some(two), None, None, Some(five)]
        );
        // A filter whose slot is no longer sealed in its life goes.
        view.keep_filters(|slot, at| (slot, at) == (5, five));
        let skips = view.skips([&held, &other]);
        assert_eq!(skips.masks, vec![0, 1 << 5]);
        assert_eq!(skips.sealed[2], None);
    }
}
