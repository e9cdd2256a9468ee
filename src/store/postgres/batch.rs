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

use super::pool::{ClaimCall, CompleteCall, Inner};
use super::queue_sql::pg_queue_values;
use super::rows::{claim_result, db_error, existing, get};
use super::sql::pg_claim_conflict;
use crate::claim::ClaimResult;
use crate::key::EventId;
use crate::store::{millis, Enqueued, Fenced, History, Kept, QueueRow, StoreError};

/// Claims for many keys: the single-row `CLAIM` over `unnest`ed input.
///
/// Reads: each input key's row as the statement's snapshot sees it (`found`: the slots'
/// key indexes probed in turn up to the slot that holds the key), never a scan. Keys whose
/// row is neither `done` nor `dead` go on to the insert; the others, and keys whose claim
/// did not win, are reported from `found`, without probing the table again (which would
/// descend every slot's key index: see `CLAIM`). Won keys are filtered out of the report
/// with `NOT IN`, a hashed lookup: `NOT EXISTS` would be an anti-join, which without hash
/// joins (see `PgStore::connect`) costs won × reported comparisons. `found` carries the
/// input's columns so that no step joins two sets of rows.
/// Locks: each input key's row that is not `done` or `dead` (those are only read, as in
/// `CLAIM`), in key order. A concurrent claimer of one of these keys waits for this
/// statement's commit and then sees the row it left (a live lease). Keys whose row was
/// inserted by another transaction after this statement's snapshot are missing from the
/// report; their calls retry alone.
const CLAIM_BATCH: &str = concat!(
    "
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[], $5::bytea[],
                         $6::text[], $7::text[])
        AS i(provider, event_key, fingerprint, lease_ms, payload, content_type,
             request_headers)
),
current AS (SELECT slot FROM hookgate_slots WHERE state = 'current'),
found AS (
    SELECT i.*, s.slot, s.status, s.attempts, s.last_path, s.fingerprint AS row_fingerprint,
           s.locked_until, s.result_status, s.result_content_type, s.result_body
    FROM input i
    LEFT JOIN LATERAL (
        SELECT w.slot, w.status, w.attempts, w.last_path, w.fingerprint, w.locked_until,
               w.result_status, w.result_content_type, w.result_body
        FROM webhook_events w
        WHERE w.provider = i.provider AND w.event_key = i.event_key
        LIMIT 1) s ON true
),
claimed AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, slot, status, attempts, last_path, fingerprint, locked_until,
         payload, content_type, request_headers, keep_payload)
    SELECT f.provider, f.event_key, COALESCE(f.slot, (SELECT slot FROM current)),
           'in_progress', 1, 'first_run', f.fingerprint,
           now() + f.lease_ms * interval '1 millisecond',
           f.payload, f.content_type, f.request_headers, f.payload IS NOT NULL
    FROM found f
    -- A key whose row is done or dead is only reported (no claim changes it: see `CLAIM`).
    WHERE f.status IS NULL OR f.status NOT IN ('done', 'dead')
    ORDER BY f.provider, f.event_key
",
    pg_claim_conflict!(),
    "
    RETURNING e.provider, e.event_key, true AS won, e.status, e.attempts, e.last_path,
              e.fingerprint, 0::bigint AS lease_left_ms,
              e.result_status, e.result_content_type, e.result_body
)
SELECT * FROM claimed
UNION ALL
SELECT f.provider, f.event_key, false, f.status, f.attempts, f.last_path, f.row_fingerprint,
       GREATEST(0, extract(epoch FROM f.locked_until - now()) * 1000)::bigint,
       f.result_status, f.result_content_type, f.result_body
FROM found f
-- Keys with a row; won keys are not reported (NOT IN: the keys are never NULL).
WHERE f.status IS NOT NULL
  AND (f.provider, f.event_key) NOT IN (SELECT provider, event_key FROM claimed)"
);

/// Enqueues of many events: the single-row `ENQUEUE` over `unnest`ed input — each key
/// inserted (queued, or taken at once when its `start_ms` is set), or reported as it
/// stands.
///
/// Locks each new row's index slot, in key order; a concurrent enqueue or claim of one of
/// these keys waits for this statement's commit. As with the claim batch, a key whose row
/// another transaction inserted after this statement's snapshot is missing from the
/// report; its call runs alone.
const ENQUEUE_BATCH: &str = concat!(
    "
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[],
                         $6::text[], $7::int8[], $8::bool[])
        AS i(provider, event_key, fingerprint, payload, content_type, request_headers,
             start_ms, keep_payload)
),
current AS (SELECT slot FROM hookgate_slots WHERE state = 'current'),
queued AS (
    INSERT INTO webhook_events AS e
        (provider, event_key, slot, status, attempts, last_path, fingerprint, mode, payload,
         content_type, request_headers, next_attempt_at, locked_until, keep_payload)
    SELECT i.provider, i.event_key, COALESCE(s.slot, (SELECT slot FROM current)), ",
    pg_queue_values!("i.start_ms"),
    ", i.fingerprint, 'queue', i.payload, i.content_type, i.request_headers,
           now() + COALESCE(i.start_ms, 0) * interval '1 millisecond',
           now() + i.start_ms * interval '1 millisecond', i.keep_payload
    FROM input i
    LEFT JOIN LATERAL (
        SELECT w.slot FROM webhook_events w
        WHERE w.provider = i.provider AND w.event_key = i.event_key
        LIMIT 1) s ON true
    ORDER BY i.provider, i.event_key
    ON CONFLICT (provider, event_key, slot) DO NOTHING
    RETURNING e.provider, e.event_key, true AS inserted, e.status, e.attempts, e.fingerprint,
              0::bigint AS lease_left_ms, e.result_status, e.result_content_type,
              e.result_body, e.mode
)
SELECT * FROM queued
UNION ALL
SELECT w.provider, w.event_key, false, w.status, w.attempts, w.fingerprint,
       GREATEST(0, extract(epoch FROM w.locked_until - now()) * 1000)::bigint,
       w.result_status, w.result_content_type, w.result_body, w.mode
FROM input i
CROSS JOIN LATERAL (
    SELECT * FROM webhook_events w
    WHERE w.provider = i.provider AND w.event_key = i.event_key
    OFFSET 0) w
WHERE (i.provider, i.event_key) NOT IN (SELECT provider, event_key FROM queued)"
);

/// Completions for many attempts: the single-row `COMPLETE`, fenced per row.
///
/// Locks each matching row; rows whose attempt or status moved on match nothing and are
/// not returned (stale). A deadlock with another node's batch falls back to single rows.
/// The status is checked with `IS NOT DISTINCT FROM`, which no index serves, so the rows are
/// found by the primary key per input key (see `sql.rs`).
///
/// The joined input carries only the keys, the attempt and the position `n`; the results
/// are read from their arrays by position. An `UPDATE … FROM` keeps a copy of each joined
/// row (for re-checking a concurrently updated row), and copying the result bodies into
/// those cost about 7 % of Postgres's time on first runs.
///
/// History rows (for attempts that were not plain first runs) are written from the same
/// statement, read from their arrays (`$7`…`$10`) by position; a NULL path writes none.
const COMPLETE_BATCH: &str = "
WITH done AS (
    UPDATE webhook_events AS e
    SET status = 'done', result_status = ($4::int2[])[u.n],
        result_content_type = ($5::text[])[u.n], result_body = ($6::bytea[])[u.n],
        locked_until = NULL, last_error = NULL, dead_reason = NULL,
        payload = CASE WHEN e.keep_payload THEN e.payload END,
        content_type = CASE WHEN e.keep_payload THEN e.content_type END,
        request_headers = CASE WHEN e.keep_payload THEN e.request_headers END,
        updated_at = now()
    FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::int4[]) WITH ORDINALITY
              AS u(provider, event_key, attempts, n)
          ORDER BY provider, event_key) AS u
    WHERE e.provider = u.provider AND e.event_key = u.event_key
      AND e.attempts = u.attempts AND e.status IS NOT DISTINCT FROM 'in_progress'
    RETURNING e.provider, e.event_key, e.slot, e.mode, e.attempts, u.n),
history AS (
    INSERT INTO webhook_attempts
        (provider, event_key, slot, attempt, path, node, mode, outcome, started_at, ended_at,
         target_status, answer)
    SELECT provider, event_key, slot, attempts, ($7::text[])[n], ($8::text[])[n], mode, 'done',
           now() - ($9::int8[])[n] * interval '1 millisecond', now(), ($4::int2[])[n],
           ($10::text[])[n]
    FROM done WHERE ($7::text[])[n] IS NOT NULL)
SELECT provider, event_key FROM done";

/// [`COMPLETE_BATCH`] for a batch without history rows (first runs that ended done: the
/// hot path), with nothing of the history's statement to plan or run.
const COMPLETE_BATCH_PLAIN: &str = "
UPDATE webhook_events AS e
SET status = 'done', result_status = ($4::int2[])[u.n],
    result_content_type = ($5::text[])[u.n], result_body = ($6::bytea[])[u.n],
    locked_until = NULL, last_error = NULL, dead_reason = NULL,
    payload = CASE WHEN e.keep_payload THEN e.payload END,
    content_type = CASE WHEN e.keep_payload THEN e.content_type END,
    request_headers = CASE WHEN e.keep_payload THEN e.request_headers END,
    updated_at = now()
FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::int4[]) WITH ORDINALITY
          AS u(provider, event_key, attempts, n)
      ORDER BY provider, event_key) AS u
WHERE e.provider = u.provider AND e.event_key = u.event_key
  AND e.attempts = u.attempts AND e.status IS NOT DISTINCT FROM 'in_progress'
RETURNING e.provider, e.event_key";

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

fn key(id: &EventId) -> (Arc<str>, Arc<str>) {
    (Arc::clone(&id.provider), Arc::clone(&id.key))
}

/// Runs a batch of claims; one answer per call, in order.
pub(crate) async fn claims(
    inner: Arc<Inner>,
    calls: Vec<ClaimCall>,
) -> Vec<Result<ClaimResult, StoreError>> {
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
    type Answer = ClaimResult;
    fn id(&self) -> &EventId {
        &self.id
    }
    fn batch(
        inner: &Inner,
        calls: &[&Self],
    ) -> impl Future<Output = Result<Report<ClaimResult>, BatchError>> + Send {
        claim_batch(inner, calls)
    }
    fn alone(&self, inner: &Inner) -> impl Future<Output = Result<ClaimResult, StoreError>> + Send {
        inner.claim(self)
    }
}

impl Keyed for QueueRow {
    type Answer = Enqueued;
    fn id(&self) -> &EventId {
        &self.id
    }
    fn batch(
        inner: &Inner,
        calls: &[&Self],
    ) -> impl Future<Output = Result<Report<Enqueued>, BatchError>> + Send {
        enqueue_batch(inner, calls)
    }
    fn alone(&self, inner: &Inner) -> impl Future<Output = Result<Enqueued, StoreError>> + Send {
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

type BatchError = (StoreError, Option<SqlState>);

fn coded(e: tokio_postgres::Error) -> BatchError {
    let code = e.code().cloned();
    (db_error(e), code)
}

/// A batch statement's answers by key; a key it did not report is run alone.
type Report<T> = HashMap<(Arc<str>, Arc<str>), Result<T, StoreError>>;

/// The batched claim on one pooled connection, within the statement deadline.
async fn claim_batch(
    inner: &Inner,
    calls: &[&ClaimCall],
) -> Result<Report<ClaimResult>, BatchError> {
    inner
        .run(async |client| Ok(claim_batch_on(client, calls).await))
        .await
        .unwrap_or_else(|e| Err((e, None)))
}

async fn claim_batch_on(
    client: &deadpool_postgres::Client,
    calls: &[&ClaimCall],
) -> Result<Report<ClaimResult>, BatchError> {
    let plain = |e: StoreError| (e, None);
    let stmt = client.prepare_cached(CLAIM_BATCH).await.map_err(coded)?;
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
    let rows = client
        .query(
            &stmt,
            &[
                &providers,
                &keys,
                &fingerprints,
                &leases,
                &payloads,
                &content_types,
                &headers,
            ],
        )
        .await
        .map_err(coded)?;
    let mut reported = HashMap::with_capacity(rows.len());
    for row in rows {
        let provider: String = get(&row, "provider").map_err(plain)?;
        let event_key: String = get(&row, "event_key").map_err(plain)?;
        reported.insert((provider.into(), event_key.into()), claim_result(&row));
    }
    Ok(reported)
}

/// Runs a batch of enqueues; one answer per call, in order.
pub(crate) async fn enqueues(
    inner: Arc<Inner>,
    calls: Vec<QueueRow>,
) -> Vec<Result<Enqueued, StoreError>> {
    keyed(&inner, &calls).await
}

/// The batched enqueue on one pooled connection, within the statement deadline.
async fn enqueue_batch(inner: &Inner, calls: &[&QueueRow]) -> Result<Report<Enqueued>, BatchError> {
    inner
        .run(async |client| Ok(enqueue_batch_on(client, calls).await))
        .await
        .unwrap_or_else(|e| Err((e, None)))
}

async fn enqueue_batch_on(
    client: &deadpool_postgres::Client,
    calls: &[&QueueRow],
) -> Result<Report<Enqueued>, BatchError> {
    let plain = |e: StoreError| (e, None);
    let stmt = client.prepare_cached(ENQUEUE_BATCH).await.map_err(coded)?;
    let providers: Vec<&str> = calls.iter().map(|c| &*c.id.provider).collect();
    let keys: Vec<&str> = calls.iter().map(|c| &*c.id.key).collect();
    let fingerprints: Vec<Option<&str>> = calls.iter().map(|c| c.fingerprint.as_deref()).collect();
    let payloads: Vec<&[u8]> = calls.iter().map(|c| &c.payload[..]).collect();
    let content_types: Vec<Option<&str>> =
        calls.iter().map(|c| c.content_type.as_deref()).collect();
    let headers: Vec<Option<&str>> = calls.iter().map(|c| c.headers.as_deref()).collect();
    let starts: Vec<Option<i64>> = calls.iter().map(|c| c.start.map(millis)).collect();
    let keeps: Vec<bool> = calls.iter().map(|c| c.keep_payload).collect();
    let rows = client
        .query(
            &stmt,
            &[
                &providers,
                &keys,
                &fingerprints,
                &payloads,
                &content_types,
                &headers,
                &starts,
                &keeps,
            ],
        )
        .await
        .map_err(coded)?;
    let mut reported = HashMap::with_capacity(rows.len());
    for row in rows {
        let provider: String = get(&row, "provider").map_err(plain)?;
        let event_key: String = get(&row, "event_key").map_err(plain)?;
        let answer = match get::<bool>(&row, "inserted") {
            Ok(true) => Ok(Enqueued::Inserted),
            Ok(false) => existing(&row),
            Err(e) => Err(e),
        };
        reported.insert((provider.into(), event_key.into()), answer);
    }
    Ok(reported)
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
    let outcome = complete_batch(&inner, &calls).await;
    inner
        .reconnect
        .observe(&outcome.as_ref().map(|_| ()).map_err(|(e, _)| e.clone()));
    match outcome {
        Ok(applied) => calls
            .iter()
            .map(|c| {
                Ok(if applied.contains(&key(&c.id)) {
                    Fenced::Applied
                } else {
                    Fenced::Stale
                })
            })
            .collect(),
        Err((_, code)) if retry_alone(code.as_ref()) => {
            let mut answers = Vec::with_capacity(calls.len());
            for c in &calls {
                answers.push(inner.complete(c).await);
            }
            answers
        }
        Err((e, _)) => calls.iter().map(|_| Err(e.clone())).collect(),
    }
}

type Applied = std::collections::HashSet<(Arc<str>, Arc<str>)>;

/// The batched completion on one pooled connection, within the statement deadline.
async fn complete_batch(inner: &Inner, calls: &[CompleteCall]) -> Result<Applied, BatchError> {
    inner
        .run(async |client| Ok(complete_batch_on(client, calls).await))
        .await
        .unwrap_or_else(|e| Err((e, None)))
}

async fn complete_batch_on(
    client: &deadpool_postgres::Client,
    calls: &[CompleteCall],
) -> Result<Applied, BatchError> {
    let plain = |e: StoreError| (e, None);
    let with_history = calls.iter().any(|c| c.history.is_some());
    let sql = if with_history {
        COMPLETE_BATCH
    } else {
        COMPLETE_BATCH_PLAIN
    };
    let stmt = client.prepare_cached(sql).await.map_err(coded)?;
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
    let rows = client.query(&stmt, &params[..used]).await.map_err(coded)?;
    rows.iter()
        .map(|row| {
            let provider: String = get(row, "provider").map_err(plain)?;
            let event_key: String = get(row, "event_key").map_err(plain)?;
            Ok((provider.into(), event_key.into()))
        })
        .collect()
}
