//! The Postgres store's queue-mode operations and the abandoning of events no sender will
//! retry, each one statement under the statement deadline (`queue_sql`).

use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;

use super::pool::Inner;
use super::queue_sql::{
    ABANDON, DUE, ENQUEUE, ORPHAN, ORPHAN_SYNC, QUEUE_DEPTH, RENEW, TAKE, TAKE_DUE,
};
use super::routed::{enqueue_rows, key, EnqueueCall};
use super::rows::{db_error, existing, get, parse_path};
use crate::key::EventId;
use crate::store::{millis, Enqueued, Fenced, QueueDepth, Routed, StoreError, Taken};

/// [`Store::enqueue`](crate::store::Store::enqueue_routed); retried while a concurrent
/// insert hides the row from the report (see `ENQUEUE`). A call with other routes runs the
/// batch statement, which writes their rows too, for one call.
pub(crate) async fn enqueue(
    inner: &Inner,
    call: &EnqueueCall,
) -> Result<Routed<Enqueued>, StoreError> {
    let item = &call.row;
    for _ in 0..3 {
        let answer = inner
            .run(async |client| {
                if !call.others.is_empty() {
                    let mut reported = enqueue_rows(client, &[call], None)
                        .await
                        .map_err(|(e, _)| e)?;
                    return reported.remove(&key(&item.id)).transpose();
                }
                let stmt = client.prepare_cached(ENQUEUE).await.map_err(db_error)?;
                let row = client
                    .query_opt(
                        &stmt,
                        &[
                            &&*item.id.provider,
                            &&*item.id.key,
                            &item.fingerprint,
                            &&*item.payload,
                            &item.content_type,
                            &item.headers,
                            &item.start.map(millis),
                            &item.keep_payload,
                        ],
                    )
                    .await
                    .map_err(db_error)?;
                let Some(row) = row else {
                    return Ok(None);
                };
                let answer = if get::<bool>(&row, "inserted")? {
                    Enqueued::Inserted
                } else {
                    existing(&row)?
                };
                Ok(Some(Routed {
                    answer,
                    written: Vec::new(),
                }))
            })
            .await?;
        if let Some(answer) = answer {
            return Ok(answer);
        }
    }
    Err(StoreError::Corrupt(
        format!("enqueue of {} reported no row", item.id).into(),
    ))
}

/// [`Store::take`](crate::store::Store::take).
pub(crate) async fn take(
    inner: &Inner,
    id: &EventId,
    lease: Duration,
) -> Result<Option<Taken>, StoreError> {
    let lease_ms = millis(lease);
    let row = inner
        .run(async |client| {
            let stmt = client.prepare_cached(TAKE).await.map_err(db_error)?;
            client
                .query_opt(&stmt, &[&&*id.provider, &&*id.key, &lease_ms])
                .await
                .map_err(db_error)
        })
        .await?;
    row.map(|row| taken(id.clone(), &row)).transpose()
}

/// A taken row as [`TAKE`] and [`TAKE_DUE`] return it.
fn taken(id: EventId, row: &tokio_postgres::Row) -> Result<Taken, StoreError> {
    Ok(Taken {
        id,
        attempts: get(row, "attempts")?,
        tries: get(row, "tries")?,
        age: Duration::from_millis(u64::try_from(get::<i64>(row, "age_ms")?).unwrap_or(0)),
        path: parse_path(&get::<String>(row, "last_path")?)?,
        payload: Bytes::from(get::<Option<Vec<u8>>>(row, "payload")?.unwrap_or_default()),
        content_type: get(row, "content_type")?,
        fingerprint: get(row, "fingerprint")?,
        trace_headers: get(row, "trace_headers")?,
        unreadable: None,
    })
}

/// [`Store::take_due`](crate::store::Store::take_due).
pub(crate) async fn take_due(
    inner: &Inner,
    provider: &str,
    limit: u32,
    lease: Duration,
    busy: &[Arc<str>],
) -> Result<Vec<Taken>, StoreError> {
    let lease_ms = millis(lease);
    let busy: Vec<&str> = busy.iter().map(|key| &**key).collect();
    let rows = inner
        .run(async |client| {
            let stmt = client.prepare_cached(TAKE_DUE).await.map_err(db_error)?;
            client
                .query(&stmt, &[&provider, &i64::from(limit), &lease_ms, &busy])
                .await
                .map_err(db_error)
        })
        .await?;
    rows.iter()
        .map(|row| {
            taken(
                EventId::new(provider, get::<String>(row, "event_key")?),
                row,
            )
        })
        .collect()
}

/// [`Store::due`](crate::store::Store::due).
pub(crate) async fn due(
    inner: &Inner,
    provider: &str,
    limit: u32,
) -> Result<Vec<EventId>, StoreError> {
    let rows = inner
        .run(async |client| {
            let stmt = client.prepare_cached(DUE).await.map_err(db_error)?;
            client
                .query(&stmt, &[&provider, &i64::from(limit)])
                .await
                .map_err(db_error)
        })
        .await?;
    rows.iter()
        .map(|row| Ok(EventId::new(provider, get::<String>(row, "event_key")?)))
        .collect()
}

/// [`Store::renew`](crate::store::Store::renew).
pub(crate) async fn renew(
    inner: &Inner,
    id: &EventId,
    attempts: i32,
    lease: Duration,
) -> Result<Fenced, StoreError> {
    let lease_ms = millis(lease);
    inner
        .fenced_on_slot(
            RENEW,
            &[&&*id.provider, &&*id.key, &attempts, &lease_ms],
            false,
        )
        .await
}

/// [`Store::abandon`](crate::store::Store::abandon).
pub(crate) async fn abandon(
    inner: &Inner,
    provider: &str,
    horizon: Duration,
    batch: u32,
) -> Result<u64, StoreError> {
    let horizon_ms = millis(horizon);
    inner
        .run(async |client| {
            client
                .execute(ABANDON, &[&provider, &horizon_ms, &i64::from(batch)])
                .await
                .map_err(db_error)
        })
        .await
}

/// [`Store::orphan`](crate::store::Store::orphan).
pub(crate) async fn orphan(
    inner: &Inner,
    known: &[String],
    grace: Duration,
    batch: u32,
) -> Result<u64, StoreError> {
    let grace_ms = millis(grace);
    inner
        .run(async |client| {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&known, &i64::from(batch), &grace_ms];
            let queued = client.execute(ORPHAN, &params).await.map_err(db_error)?;
            let sync = client
                .execute(ORPHAN_SYNC, &params)
                .await
                .map_err(db_error)?;
            Ok(queued + sync)
        })
        .await
}

/// [`Store::queue_depth`](crate::store::Store::queue_depth).
pub(crate) async fn queue_depth(inner: &Inner) -> Result<Vec<QueueDepth>, StoreError> {
    let rows = inner
        .run(async |client| client.query(QUEUE_DEPTH, &[]).await.map_err(db_error))
        .await?;
    rows.iter()
        .map(|row| {
            let oldest_ms: i64 = get(row, "oldest_due_ms")?;
            Ok(QueueDepth {
                provider: get(row, "provider")?,
                rows: u64::try_from(get::<i64>(row, "rows")?).unwrap_or(0),
                oldest_due: Duration::from_millis(u64::try_from(oldest_ms).unwrap_or(0)),
            })
        })
        .collect()
}
