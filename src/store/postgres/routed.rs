//! Claims and enqueues of many events in one statement, each with its other routes' rows:
//! `CLAIM_BATCH` and `ENQUEUE_BATCH`, or — when a call has other routes — `CLAIM_ROUTED`
//! and `ENQUEUE_ROUTED`, whose rows for the other routes of each key they won (or wrote)
//! are written by the same statement, so they commit together with no transaction. The
//! group commit (`batch.rs`) runs them for many calls; the single-row paths (`pool.rs`,
//! `queue.rs`) run them for one call with other routes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::batch_sql::{claim_on_slots, CLAIM_BATCH, CLAIM_ROUTED, ENQUEUE_BATCH, ENQUEUE_ROUTED};
use super::ring_view::RingView;
use super::rows::{claim_result, db_error, existing, get};
use crate::claim::{ClaimResult, Path};
use crate::key::EventId;
use crate::store::{millis, Enqueued, Kept, QueueRow, Routed, StoreError};

/// One claim: run alone (`pool.rs`) or in a batch (`batch.rs`).
pub(crate) struct ClaimCall {
    pub(crate) id: EventId,
    pub(crate) fingerprint: Option<String>,
    pub(crate) lease_ms: i64,
    /// The payload to write with a new row (its provider keeps payloads always).
    pub(crate) keep: Option<Kept>,
    /// The path a new row is claimed under: `first_run`, or `filtered`.
    pub(crate) first: Path,
    /// The event's rows for its other routes, written with a claim that writes its row.
    pub(crate) others: Vec<QueueRow>,
}

/// One enqueue: run alone (`queue.rs`) or in a batch (`batch.rs`).
pub(crate) struct EnqueueCall {
    pub(crate) row: QueueRow,
    /// The event's rows for its other routes, written with a new `row`.
    pub(crate) others: Vec<QueueRow>,
}

/// A batch's key for an event.
pub(super) fn key(id: &EventId) -> (Arc<str>, Arc<str>) {
    (Arc::clone(&id.provider), Arc::clone(&id.key))
}

/// [`claim_on_slots`] of `whole` and `slots`, made once and kept for the process's life (a
/// text per set of filled slots the ring passes through: a few dozen at most), so its
/// prepared statement is cached by text on each connection.
pub(super) fn on_slots(whole: &'static str, slots: &[i16]) -> &'static str {
    type Texts = dashmap::DashMap<(usize, usize, Vec<i16>), &'static str>;
    static TEXTS: std::sync::LazyLock<Texts> = std::sync::LazyLock::new(Texts::new);
    let id = (whole.as_ptr() as usize, whole.len(), slots.to_vec());
    if let Some(text) = TEXTS.get(&id) {
        return *text;
    }
    let text: &'static str = TEXTS
        .entry(id)
        .or_insert_with(|| Box::leak(claim_on_slots(whole, slots).into_boxed_str()))
        .value();
    text
}

/// A batch statement's error, with its SQLSTATE.
pub(super) type BatchError = (StoreError, Option<SqlState>);

/// The driver's error as a batch's.
pub(super) fn coded(e: tokio_postgres::Error) -> BatchError {
    let code = e.code().cloned();
    (db_error(e), code)
}

/// A batch statement's answers by key; a key it did not report is run alone.
pub(super) type Report<T> = HashMap<(Arc<str>, Arc<str>), Result<T, StoreError>>;

/// The claims of `calls` in one statement: each key won, or reported as it stands, with
/// the other routes' rows of the keys whose row it inserted. With `slots` (the slots that
/// are not empty, as last read), the keys' rows are probed in those slots alone, each
/// key skipping the sealed slots whose filter has not got it, and a ring that has outgrown
/// them answers no key (`batch_sql::claim_on_slots`).
pub(super) async fn claim_rows(
    client: &Client,
    calls: &[&ClaimCall],
    slots: Option<(&[i16], &RingView)>,
) -> Result<Report<Routed<ClaimResult>>, BatchError> {
    let others = Others::of(calls.iter().map(|c| (&c.id, &c.others[..])));
    let whole = if others.is_empty() {
        CLAIM_BATCH
    } else {
        CLAIM_ROUTED
    };
    let (sql, skips) = match slots {
        Some((slots, ring)) => (
            on_slots(whole, slots),
            Some(ring.skips(calls.iter().map(|c| &c.id))),
        ),
        None => (whole, None),
    };
    let stmt = client.prepare_cached(sql).await.map_err(coded)?;
    let providers: Vec<&str> = calls.iter().map(|c| &*c.id.provider).collect();
    let keys: Vec<&str> = calls.iter().map(|c| &*c.id.key).collect();
    let fingerprints: Vec<Option<&str>> = calls.iter().map(|c| c.fingerprint.as_deref()).collect();
    let leases: Vec<i64> = calls.iter().map(|c| c.lease_ms).collect();
    let kept = |f: fn(&Kept) -> Option<&str>| -> Vec<Option<&str>> {
        calls.iter().map(|c| c.keep.as_ref().and_then(f)).collect()
    };
    let payloads: Vec<Option<&[u8]>> = calls
        .iter()
        .map(|c| c.keep.as_ref().map(|k| &k.payload[..]))
        .collect();
    let content_types = kept(|k| k.content_type.as_deref());
    let headers = kept(|k| k.headers.as_deref());
    let firsts: Vec<&str> = calls.iter().map(|c| c.first.as_str()).collect();
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &providers,
        &keys,
        &fingerprints,
        &leases,
        &payloads,
        &content_types,
        &headers,
        &firsts,
    ];
    params.extend(others.params());
    if let Some(skips) = &skips {
        params.extend([&skips.masks as &(dyn ToSql + Sync), &skips.sealed]);
    }
    let rows = client.query(&stmt, &params).await.map_err(coded)?;
    let won = |answer: &ClaimResult| matches!(answer, ClaimResult::Won { .. });
    reported(rows, "won", claim_result, won, calls, |c| {
        (&c.id, &c.others)
    })
}

/// The enqueues of `calls` in one statement: each key written (queued, or taken at once
/// with its start lease), or reported as it stands, with the other routes' rows of the
/// keys it wrote. With `slots`, each key's row is probed as [`claim_rows`] probes it.
pub(super) async fn enqueue_rows(
    client: &Client,
    calls: &[&EnqueueCall],
    slots: Option<(&[i16], &RingView)>,
) -> Result<Report<Routed<Enqueued>>, BatchError> {
    let others = Others::of(calls.iter().map(|c| (&c.row.id, &c.others[..])));
    let whole = if others.is_empty() {
        ENQUEUE_BATCH
    } else {
        ENQUEUE_ROUTED
    };
    let (sql, skips) = match slots {
        Some((slots, ring)) => {
            let mut skips = ring.skips(calls.iter().map(|c| &c.row.id));
            // The current slot is not probed for an enqueue's own rows: a key whose row is
            // there goes on to the insert as a key with no row does, and meets the row in
            // the insert's conflict (a key found in another slot is only reported). Under
            // the guard the view's current slot is the ring's (a turn since the view was
            // read opened a slot `slots` leaves out, and the statement answers nothing), so
            // no slot that could hold the row is skipped. One index descent a key less.
            if let Some(current) = ring.current() {
                for mask in &mut skips.masks {
                    *mask |= 1 << current;
                }
            }
            (on_slots(whole, slots), Some(skips))
        }
        None => (whole, None),
    };
    let stmt = client.prepare_cached(sql).await.map_err(coded)?;
    let rows: Vec<&QueueRow> = calls.iter().map(|c| &c.row).collect();
    let arrays = QueueArrays::of(&rows);
    let mut params = arrays.params();
    params.extend(others.params());
    if let Some(skips) = &skips {
        params.extend([&skips.masks as &(dyn ToSql + Sync), &skips.sealed]);
    }
    let rows = client.query(&stmt, &params).await.map_err(coded)?;
    let answer = |row: &Row| match get::<bool>(row, "inserted")? {
        true => Ok(Enqueued::Inserted),
        false => existing(row),
    };
    let inserted = |answer: &Enqueued| *answer == Enqueued::Inserted;
    reported(rows, "inserted", answer, inserted, calls, |c| {
        (&c.row.id, &c.others)
    })
}

/// A statement's rows as answers by key: a row whose `flag` column is NULL is one of the
/// other routes' rows it wrote, and each answer carries which of its call's other rows
/// were written (each row for one call only, one whose own row the statement `wrote`).
fn reported<T, C>(
    rows: Vec<Row>,
    flag: &str,
    answer: impl Fn(&Row) -> Result<T, StoreError>,
    wrote: fn(&T) -> bool,
    calls: &[&C],
    parts: fn(&C) -> (&EventId, &Vec<QueueRow>),
) -> Result<Report<Routed<T>>, BatchError> {
    let plain = |e: StoreError| (e, None);
    let mut answers = HashMap::with_capacity(rows.len());
    let mut written = HashSet::new();
    for row in rows {
        let provider: String = get(&row, "provider").map_err(plain)?;
        let event_key: String = get(&row, "event_key").map_err(plain)?;
        let id = (Arc::from(provider), Arc::from(event_key));
        if get::<Option<bool>>(&row, flag).map_err(plain)?.is_none() {
            written.insert(id);
        } else {
            answers.insert(id, answer(&row));
        }
    }
    // Each row written goes to one call, the first that carries it: two calls of one event
    // answered on two routes (their payloads took different routes) may carry the same
    // other row, which the statement wrote once and only one of them may start.
    let mut routed = HashMap::with_capacity(answers.len());
    for call in calls {
        let (id, others) = parts(call);
        let k = key(id);
        let Some(answer) = answers.remove(&k) else {
            continue;
        };
        let answer = answer.map(|answer| {
            let owns = wrote(&answer);
            let written = others
                .iter()
                .map(|o| owns && written.remove(&key(&o.id)))
                .collect();
            Routed { answer, written }
        });
        routed.insert(k, answer);
    }
    Ok(routed)
}

/// The arrays of `ENQUEUE_BATCH`'s `$1`…`$8`.
struct QueueArrays<'a> {
    providers: Vec<&'a str>,
    keys: Vec<&'a str>,
    fingerprints: Vec<Option<&'a str>>,
    payloads: Vec<&'a [u8]>,
    content_types: Vec<Option<&'a str>>,
    headers: Vec<Option<&'a str>>,
    starts: Vec<Option<i64>>,
    keeps: Vec<bool>,
}

impl<'a> QueueArrays<'a> {
    fn of(rows: &[&'a QueueRow]) -> Self {
        Self {
            providers: rows.iter().map(|r| &*r.id.provider).collect(),
            keys: rows.iter().map(|r| &*r.id.key).collect(),
            fingerprints: rows.iter().map(|r| r.fingerprint.as_deref()).collect(),
            payloads: rows.iter().map(|r| &r.payload[..]).collect(),
            content_types: rows.iter().map(|r| r.content_type.as_deref()).collect(),
            headers: rows.iter().map(|r| r.headers.as_deref()).collect(),
            starts: rows.iter().map(|r| r.start.map(millis)).collect(),
            keeps: rows.iter().map(|r| r.keep_payload).collect(),
        }
    }

    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.providers,
            &self.keys,
            &self.fingerprints,
            &self.payloads,
            &self.content_types,
            &self.headers,
            &self.starts,
            &self.keeps,
        ]
    }
}

/// The other routes' rows of a statement's calls: the nine arrays of `pg_others!` (the
/// queue arrays, with the main route's scope after the key).
struct Others<'a> {
    rows: QueueArrays<'a>,
    owners: Vec<&'a str>,
}

impl<'a> Others<'a> {
    fn of(calls: impl Iterator<Item = (&'a EventId, &'a [QueueRow])>) -> Self {
        let mut rows = Vec::new();
        let mut owners = Vec::new();
        for (id, others) in calls {
            for other in others {
                rows.push(other);
                owners.push(&*id.provider);
            }
        }
        Self {
            rows: QueueArrays::of(&rows),
            owners,
        }
    }

    fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// The nine parameters, or none when there are no other rows.
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        if self.is_empty() {
            return Vec::new();
        }
        let r = &self.rows;
        vec![
            &r.providers,
            &r.keys,
            &self.owners,
            &r.fingerprints,
            &r.payloads,
            &r.content_types,
            &r.headers,
            &r.starts,
            &r.keeps,
        ]
    }
}
