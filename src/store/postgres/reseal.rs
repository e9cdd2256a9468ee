//! The Postgres store's side of a rekey: stale bodies a page at a time in each table's key
//! order (the tables' unique indexes, merged across slots), and one body's compare-and-set.
//! On the operators' pool; each page locks nothing, each write one row for one statement.

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::operator::PgOperator;
use super::rows::get;
use crate::seal::Column;
use crate::store::reseal::{RowKey, SealedBy, Stale, StalePage, Stored, Table};
use crate::store::{Resealer, StoreError, StoreFuture};

/// Events after `($1, $2, $3)`, at most `$7`: each body not starting with the sealing
/// key's prefix (`$5`, `$4` bytes long; text `$6`).
const STALE_EVENTS: &str = "
SELECT provider, event_key, slot,
       CASE WHEN payload IS NOT NULL AND substring(payload FROM 1 FOR $4) <> $5
            THEN payload END AS payload,
       CASE WHEN result_body IS NOT NULL AND substring(result_body FROM 1 FOR $4) <> $5
            THEN result_body END AS result_body,
       CASE WHEN request_headers IS NOT NULL AND NOT starts_with(request_headers, $6)
            THEN request_headers END AS request_headers
FROM webhook_events
WHERE (provider, event_key, slot) > ($1, $2, $3)
ORDER BY provider, event_key, slot
LIMIT $7";

/// History rows after `($1, $2, $3, $4)`, at most `$6`: each excerpt not starting with `$5`.
const STALE_ATTEMPTS: &str = "
SELECT provider, event_key, slot, attempt,
       CASE WHEN answer IS NOT NULL AND NOT starts_with(answer, $5) THEN answer END AS answer
FROM webhook_attempts
WHERE (provider, event_key, slot, attempt) > ($1, $2, $3, $4)
ORDER BY provider, event_key, slot, attempt
LIMIT $6";

/// One body's compare-and-set (`$3` old, `$4` new); its row's times stay as they are. By
/// key, not slot: the ring may have moved a live row to the current slot since the read.
macro_rules! reseal_event {
    ($column:literal) => {
        concat!(
            "UPDATE webhook_events SET ",
            $column,
            " = $4 WHERE provider = $1 AND event_key = $2 AND ",
            $column,
            " = $3"
        )
    };
}

const RESEAL_ANSWER: &str = "
UPDATE webhook_attempts SET answer = $5
WHERE provider = $1 AND event_key = $2 AND attempt = $3 AND answer = $4";

fn row_key(row: &Row, attempt: bool) -> Result<RowKey, StoreError> {
    Ok(RowKey {
        provider: get(row, "provider")?,
        key: get(row, "event_key")?,
        slot: get(row, "slot")?,
        attempt: if attempt { get(row, "attempt")? } else { 0 },
    })
}

impl Resealer for PgOperator {
    fn stale<'a>(
        &'a self,
        table: Table,
        after: Option<&'a RowKey>,
        limit: u32,
        current: &'a SealedBy,
    ) -> StoreFuture<'a, StalePage> {
        Box::pin(async move {
            let start = RowKey {
                slot: i16::MIN,
                attempt: i32::MIN,
                ..RowKey::default()
            };
            let after = after.unwrap_or(&start);
            let limit = i64::from(limit);
            let rows = match table {
                Table::Events => {
                    let prefix_len = i32::try_from(current.bytes.len()).unwrap_or(i32::MAX);
                    let params: [&(dyn ToSql + Sync); 7] = [
                        &after.provider,
                        &after.key,
                        &after.slot,
                        &prefix_len,
                        &current.bytes,
                        &current.text,
                        &limit,
                    ];
                    self.rows(STALE_EVENTS, &params).await?
                }
                Table::Attempts => {
                    let params: [&(dyn ToSql + Sync); 6] = [
                        &after.provider,
                        &after.key,
                        &after.slot,
                        &after.attempt,
                        &current.text,
                        &limit,
                    ];
                    self.rows(STALE_ATTEMPTS, &params).await?
                }
            };
            let mut page = StalePage::default();
            for row in &rows {
                let key = row_key(row, table == Table::Attempts)?;
                let mut found = |column, value: Option<Stored>| {
                    if let Some(value) = value {
                        page.stale.push(Stale {
                            row: key.clone(),
                            column,
                            value,
                        });
                    }
                };
                match table {
                    Table::Events => {
                        found(
                            Column::Payload,
                            get::<Option<Vec<u8>>>(row, "payload")?.map(Stored::Bytes),
                        );
                        found(
                            Column::ResultBody,
                            get::<Option<Vec<u8>>>(row, "result_body")?.map(Stored::Bytes),
                        );
                        found(
                            Column::RequestHeaders,
                            get::<Option<String>>(row, "request_headers")?.map(Stored::Text),
                        );
                    }
                    Table::Attempts => {
                        found(
                            Column::Answer(key.attempt),
                            get::<Option<String>>(row, "answer")?.map(Stored::Text),
                        );
                    }
                }
                page.read += 1;
                page.last = Some(key);
            }
            Ok(page)
        })
    }

    fn reseal<'a>(
        &'a self,
        row: &'a RowKey,
        column: Column,
        old: &'a Stored,
        new: &'a Stored,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let (old, new): (&(dyn ToSql + Sync), &(dyn ToSql + Sync)) = match (old, new) {
                (Stored::Bytes(old), Stored::Bytes(new)) => (old, new),
                (Stored::Text(old), Stored::Text(new)) => (old, new),
                _ => return Err(StoreError::Query("a reseal changes a value's type".into())),
            };
            let changed = match column {
                Column::Payload => {
                    self.changed(
                        reseal_event!("payload"),
                        &[&row.provider, &row.key, old, new],
                    )
                    .await?
                }
                Column::ResultBody => {
                    self.changed(
                        reseal_event!("result_body"),
                        &[&row.provider, &row.key, old, new],
                    )
                    .await?
                }
                Column::RequestHeaders => {
                    self.changed(
                        reseal_event!("request_headers"),
                        &[&row.provider, &row.key, old, new],
                    )
                    .await?
                }
                Column::Answer(attempt) => {
                    self.changed(
                        RESEAL_ANSWER,
                        &[&row.provider, &row.key, &attempt, old, new],
                    )
                    .await?
                }
            };
            Ok(changed == 1)
        })
    }
}
