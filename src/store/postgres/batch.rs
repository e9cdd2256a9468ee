//! The Postgres store's group commit: many claims, or many completions, in one statement.
//!
//! The statements keep the single-row rules exactly (see `sql.rs`); `unnest` turns the
//! batch's arrays into rows. Rows are locked in (provider, event_key) order so two batches
//! on different nodes cannot deadlock on claims; if Postgres still reports a deadlock or a
//! key the batch could not report, those calls fall back to the single-row statements.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::batch_sql::{COMPLETE_BATCH, COMPLETE_BATCH_PLAIN};
use super::pool::{CompleteCall, Inner};
use super::routed::{
    claim_rows, coded, enqueue_rows, key, BatchError, ClaimCall, EnqueueCall, Report,
};
use super::rows::get;
use super::sql::on_slot;
use crate::claim::ClaimResult;
use crate::key::EventId;
use crate::store::{millis, Enqueued, Fenced, History, Routed, StoreError};

/// Errors after which the calls are worth retrying one by one: a deadlock or
/// serialization failure between two nodes' batches rolled the whole statement back, or
/// the server refused one call's data (a data exception or a violated constraint,
/// SQLSTATE classes 22 and 23), which must fail that call alone, not every call that
/// shared its statement.
fn retry_alone(code: Option<&SqlState>) -> bool {
    matches!(code, Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED
        || *c == SqlState::T_R_SERIALIZATION_FAILURE
        || c.code().starts_with("22")
        || c.code().starts_with("23"))
}

/// Runs a batch of claims; one answer per call, in order.
pub(crate) async fn claims(
    inner: Arc<Inner>,
    calls: Vec<ClaimCall>,
) -> Vec<Result<Routed<ClaimResult>, StoreError>> {
    keyed(&inner, &calls).await
}

/// A call that names one event (a statement may name each event once), run in a batch
/// statement or alone.
trait Keyed: Sized + Sync {
    type Answer: Send;
    fn id(&self) -> &EventId;
    fn batch(
        inner: &Inner,
        calls: &[&Self],
    ) -> impl Future<Output = Result<Report<Self::Answer>, BatchError>> + Send;
    fn alone(&self, inner: &Inner)
        -> impl Future<Output = Result<Self::Answer, StoreError>> + Send;
}

impl Keyed for ClaimCall {
    type Answer = Routed<ClaimResult>;
    fn id(&self) -> &EventId {
        &self.id
    }
    fn batch(
        inner: &Inner,
        calls: &[&Self],
    ) -> impl Future<Output = Result<Report<Routed<ClaimResult>>, BatchError>> + Send {
        claim_batch(inner, calls)
    }
    fn alone(
        &self,
        inner: &Inner,
    ) -> impl Future<Output = Result<Routed<ClaimResult>, StoreError>> + Send {
        inner.claim(self)
    }
}

impl Keyed for EnqueueCall {
    type Answer = Routed<Enqueued>;
    fn id(&self) -> &EventId {
        &self.row.id
    }
    fn batch(
        inner: &Inner,
        calls: &[&Self],
    ) -> impl Future<Output = Result<Report<Routed<Enqueued>>, BatchError>> + Send {
        enqueue_batch(inner, calls)
    }
    fn alone(
        &self,
        inner: &Inner,
    ) -> impl Future<Output = Result<Routed<Enqueued>, StoreError>> + Send {
        super::queue::enqueue(inner, self)
    }
}

/// One answer per call, in order, for a group-commit batch of calls keyed by event: the
/// first call of each key goes into one batch statement; the later copies of a key, every
/// call the statement did not report, and all of them after a deadlock or serialization
/// failure, run alone (so does a call with nobody to share a statement with). The
/// reconnect backoff refuses them all at once, and sees the statement's outcome (or the
/// lone call's).
async fn keyed<C: Keyed>(inner: &Inner, calls: &[C]) -> Vec<Result<C::Answer, StoreError>> {
    if let Err(e) = inner.reconnect.check() {
        return calls.iter().map(|_| Err(e.clone())).collect();
    }
    let mut seen = std::collections::HashSet::new();
    let first: Vec<bool> = calls.iter().map(|c| seen.insert(key(c.id()))).collect();
    let together: Vec<&C> = calls
        .iter()
        .zip(&first)
        .filter(|(_, f)| **f)
        .map(|(c, _)| c)
        .collect();
    let mut reported = if together.len() > 1 {
        let outcome = C::batch(inner, &together).await;
        inner
            .reconnect
            .observe(&outcome.as_ref().map(|_| ()).map_err(|(e, _)| e.clone()));
        match outcome {
            Ok(map) => map,
            Err((_, code)) if retry_alone(code.as_ref()) => HashMap::new(),
            Err((e, _)) => return calls.iter().map(|_| Err(e.clone())).collect(),
        }
    } else {
        HashMap::new()
    };
    let mut answers = Vec::with_capacity(calls.len());
    for (call, is_first) in calls.iter().zip(first) {
        let found = if is_first {
            reported.remove(&key(call.id()))
        } else {
            None
        };
        answers.push(match found {
            Some(result) => result,
            None => call.alone(inner).await,
        });
    }
    if let [only] = answers.as_slice() {
        inner.reconnect.observe(only);
    }
    answers
}

/// The batched claim (with the other routes' rows of the keys it won) on one pooled
/// connection, within the statement deadline.
async fn claim_batch(
    inner: &Inner,
    calls: &[&ClaimCall],
) -> Result<Report<Routed<ClaimResult>>, BatchError> {
    inner
        .run(async |client| {
            on_filled(inner, client, calls.len(), async |slots| {
                claim_rows(client, calls, slots.map(|slots| (slots, &inner.ring))).await
            })
            .await
        })
        .await
        .unwrap_or_else(|e| Err((e, None)))
}

/// `batch` on the filled slots of the node's view of the ring (read first if never read):
/// a key left out of its report (a ring outgrown since it was read, or a row inserted after
/// the statement's snapshot) runs alone, and the ring is read again.
async fn on_filled<T>(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    calls: usize,
    batch: impl AsyncFnOnce(Option<&[i16]>) -> Result<Report<T>, BatchError>,
) -> Result<Result<Report<T>, BatchError>, StoreError> {
    let filled = match inner.ring.filled() {
        Some(filled) => filled,
        None => {
            inner.ring.read(client).await?;
            inner.ring.filled().unwrap_or_default()
        }
    };
    let slots = Some(&filled[..]).filter(|slots| !slots.is_empty());
    let reported = batch(slots).await;
    if reported.as_ref().is_ok_and(|r| r.len() < calls) {
        inner.ring.refresh(client).await;
    }
    Ok(reported)
}

/// Runs a batch of enqueues; one answer per call, in order.
pub(crate) async fn enqueues(
    inner: Arc<Inner>,
    calls: Vec<EnqueueCall>,
) -> Vec<Result<Routed<Enqueued>, StoreError>> {
    keyed(&inner, &calls).await
}

/// The batched enqueue (with the other routes' rows of the keys it wrote) on one pooled
/// connection, within the statement deadline.
async fn enqueue_batch(
    inner: &Inner,
    calls: &[&EnqueueCall],
) -> Result<Report<Routed<Enqueued>>, BatchError> {
    inner
        .run(async |client| {
            on_filled(inner, client, calls.len(), async |slots| {
                enqueue_rows(client, calls, slots.map(|slots| (slots, &inner.ring))).await
            })
            .await
        })
        .await
        .unwrap_or_else(|e| Err((e, None)))
}

/// Runs a batch of completions; one answer per call, in order.
pub(crate) async fn completions(
    inner: Arc<Inner>,
    calls: Vec<CompleteCall>,
) -> Vec<Result<Fenced, StoreError>> {
    if let Err(e) = inner.reconnect.check() {
        return calls.iter().map(|_| Err(e.clone())).collect();
    }
    let mut seen = std::collections::HashSet::new();
    let unique = calls.len() > 1 && calls.iter().all(|c| seen.insert(key(&c.id)));
    if !unique {
        let mut answers = Vec::with_capacity(calls.len());
        for c in &calls {
            let result = inner.complete(c).await;
            inner.reconnect.observe(&result);
            answers.push(result);
        }
        return answers;
    }
    let calls: Vec<&CompleteCall> = calls.iter().collect();
    let (applied, failed) = complete_batch(&inner, &calls).await;
    inner.reconnect.observe(&match &failed {
        Some((e, _)) => Err(e.clone()),
        None => Ok(()),
    });
    let mut answers = Vec::with_capacity(calls.len());
    for c in &calls {
        answers.push(match &failed {
            _ if applied.contains(&key(&c.id)) => Ok(Fenced::Applied),
            None => Ok(Fenced::Stale),
            Some((_, code)) if retry_alone(code.as_ref()) => inner.complete(c).await,
            Some((e, _)) => Err(e.clone()),
        });
    }
    answers
}

type Applied = std::collections::HashSet<(Arc<str>, Arc<str>)>;

/// The batched completion on one pooled connection, within the statement deadline: on
/// the current slot's partition first, then on the whole table for the calls that changed
/// no row there, reading the current slot again (as [`Inner::fenced_on_slot`] does for one
/// call). Answers the calls applied, and the error that ended the batch, if any: each
/// statement commits on its own, so the first one's rows are done whatever the second one
/// met (a missed deadline forgets both: its calls learn from the row whether they landed).
async fn complete_batch(inner: &Inner, calls: &[&CompleteCall]) -> (Applied, Option<BatchError>) {
    let mut applied = Applied::new();
    let ran = inner
        .run(async |client| Ok(complete_batch_with(inner, client, calls, &mut applied).await))
        .await;
    match ran {
        Ok(Ok(())) => (applied, None),
        Ok(Err(e)) => (applied, Some(e)),
        Err(e) => (Applied::new(), Some((e, None))),
    }
}

async fn complete_batch_with(
    inner: &Inner,
    client: &deadpool_postgres::Client,
    calls: &[&CompleteCall],
    applied: &mut Applied,
) -> Result<(), BatchError> {
    let slot = match inner.ring.current() {
        Some(slot) => Some(slot),
        None => inner.ring.read(client).await.map_err(|e| (e, None))?,
    };
    let mut rest: Vec<&CompleteCall> = calls.to_vec();
    if let Some(slot) = slot {
        if !inner.ring.settled() {
            // A failed check leaves the batch planned at each run, as it is until then.
            let _ = inner.ring.ripen(client, slot).await;
        }
        let on_slot = complete_batch_on(client, &rest, Some(slot), inner.ring.settled()).await;
        if on_slot.is_err() {
            // Perhaps a slot whose rows are moving: read afresh before naming one again.
            inner.ring.forget();
        }
        applied.extend(on_slot?);
        rest.retain(|c| !applied.contains(&key(&c.id)));
        if rest.is_empty() {
            return Ok(());
        }
        inner.ring.refresh(client).await;
    }
    applied.extend(complete_batch_on(client, &rest, None, inner.ring.settled()).await?);
    Ok(())
}

/// The types of [`COMPLETE_BATCH`]'s parameters (the first six are
/// [`COMPLETE_BATCH_PLAIN`]'s), for a run planned afresh (an unnamed statement).
const COMPLETE_TYPES: [Type; 10] = [
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT4_ARRAY,
    Type::INT2_ARRAY,
    Type::TEXT_ARRAY,
    Type::BYTEA_ARRAY,
    Type::TEXT_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
];

/// One completion statement for `calls`: its update named on `slot`'s partition, or on the
/// whole table. On a prepared statement when the current slot is `settled`; otherwise
/// planned afresh for this run alone, for the partition's size now (an unnamed statement,
/// sent with its values in one round trip; the hot sessions' plans are generic, so not
/// for the values themselves): a plan cached while the current slot's partition was small
/// would walk it whole once it has grown
/// ([`RingView::settled`](super::ring_view::RingView::settled)).
async fn complete_batch_on(
    client: &deadpool_postgres::Client,
    calls: &[&CompleteCall],
    slot: Option<i16>,
    settled: bool,
) -> Result<Applied, BatchError> {
    let plain = |e: StoreError| (e, None);
    let with_history = calls.iter().any(|c| c.history.is_some());
    let whole = if with_history {
        COMPLETE_BATCH
    } else {
        COMPLETE_BATCH_PLAIN
    };
    let sql = slot.and_then(|slot| on_slot(whole, slot)).unwrap_or(whole);
    let providers: Vec<&str> = calls.iter().map(|c| &*c.id.provider).collect();
    let keys: Vec<&str> = calls.iter().map(|c| &*c.id.key).collect();
    let attempts: Vec<i32> = calls.iter().map(|c| c.attempts).collect();
    let statuses: Vec<i16> = calls
        .iter()
        .map(|c| i16::try_from(c.result.status).unwrap_or(i16::MAX))
        .collect();
    let content_types: Vec<Option<&str>> = calls
        .iter()
        .map(|c| c.result.content_type.as_deref())
        .collect();
    let bodies: Vec<&[u8]> = calls.iter().map(|c| c.result.body.as_slice()).collect();
    let histories: Vec<Option<&History>> = calls.iter().map(|c| c.history.as_ref()).collect();
    let paths: Vec<Option<&str>> = histories
        .iter()
        .map(|h| h.map(|h| h.path.as_str()))
        .collect();
    let nodes: Vec<Option<&str>> = histories.iter().map(|h| h.map(|h| &*h.node)).collect();
    let took: Vec<Option<i64>> = histories
        .iter()
        .map(|h| h.map(|h| millis(h.took)))
        .collect();
    let answers: Vec<Option<&str>> = histories
        .iter()
        .map(|h| h.and_then(|h| h.answer.as_deref()))
        .collect();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
        &providers,
        &keys,
        &attempts,
        &statuses,
        &content_types,
        &bodies,
        &paths,
        &nodes,
        &took,
        &answers,
    ];
    let used = if with_history { 10 } else { 6 };
    let rows = if settled {
        let stmt = client.prepare_cached(sql).await.map_err(coded)?;
        client.query(&stmt, &params[..used]).await
    } else {
        let typed: Vec<_> = params[..used]
            .iter()
            .zip(COMPLETE_TYPES)
            .map(|(&param, ty)| (param, ty))
            .collect();
        client.query_typed(sql, &typed).await
    }
    .map_err(coded)?;
    rows.iter()
        .map(|row| {
            let provider: String = get(row, "provider").map_err(plain)?;
            let event_key: String = get(row, "event_key").map_err(plain)?;
            Ok((provider.into(), event_key.into()))
        })
        .collect()
}
