//! The embedded store's side of a rekey: stale bodies a page at a time in each table's
//! primary-key order (a read on the reader thread), and one body's compare-and-set (a
//! write on the writer thread, in its next batch).

use rusqlite::types::Value;
use rusqlite::{params, Connection, Row};

use super::operator::SqliteOperator;
use super::writer::sql_error;
use crate::seal::Column;
use crate::store::reseal::{RowKey, SealedBy, Stale, StalePage, Stored, Table};
use crate::store::{Resealer, StoreFuture};

/// Events after `(?1, ?2)`, at most `?7`: each body not starting with the sealing key's
/// prefix (`?4`, `?3` bytes long; text `?6`, `?5` characters long).
const STALE_EVENTS: &str = "
SELECT provider, event_key,
       CASE WHEN payload IS NOT NULL AND substr(payload, 1, ?3) IS NOT ?4 THEN payload END,
       CASE WHEN result_body IS NOT NULL AND substr(result_body, 1, ?3) IS NOT ?4
            THEN result_body END,
       CASE WHEN request_headers IS NOT NULL AND substr(request_headers, 1, ?5) IS NOT ?6
            THEN request_headers END
FROM webhook_events
WHERE (provider, event_key) > (?1, ?2)
ORDER BY provider, event_key
LIMIT ?7";

/// History rows after `(?1, ?2, ?3)`, at most `?6`: each excerpt not starting with `?5`
/// (`?4` characters long).
const STALE_ATTEMPTS: &str = "
SELECT provider, event_key, attempt,
       CASE WHEN answer IS NOT NULL AND substr(answer, 1, ?4) IS NOT ?5 THEN answer END
FROM webhook_attempts
WHERE (provider, event_key, attempt) > (?1, ?2, ?3)
ORDER BY provider, event_key, attempt
LIMIT ?6";

/// One body's compare-and-set (`?3` old, `?4` new); its row's times stay as they are.
macro_rules! reseal_event {
    ($column:literal) => {
        concat!(
            "UPDATE webhook_events SET ",
            $column,
            " = ?4 WHERE provider = ?1 AND event_key = ?2 AND ",
            $column,
            " IS ?3"
        )
    };
}

const RESEAL_ANSWER: &str = "
UPDATE webhook_attempts SET answer = ?5
WHERE provider = ?1 AND event_key = ?2 AND attempt = ?3 AND answer IS ?4";

fn stored(value: Value) -> Option<Stored> {
    match value {
        Value::Blob(bytes) => Some(Stored::Bytes(bytes)),
        Value::Text(text) => Some(Stored::Text(text)),
        _ => None,
    }
}

fn value(stored: &Stored) -> Value {
    match stored {
        Stored::Bytes(bytes) => Value::Blob(bytes.clone()),
        Stored::Text(text) => Value::Text(text.clone()),
    }
}

fn read_page(
    conn: &Connection,
    table: Table,
    after: &RowKey,
    limit: i64,
    current: &SealedBy,
) -> rusqlite::Result<StalePage> {
    let mut page = StalePage::default();
    let mut push = |row: &Row<'_>, key: RowKey, columns: &[(usize, Column)]| {
        for &(at, column) in columns {
            if let Some(value) = stored(row.get(at)?) {
                page.stale.push(Stale {
                    row: key.clone(),
                    column,
                    value,
                });
            }
        }
        page.read += 1;
        page.last = Some(key);
        Ok::<_, rusqlite::Error>(())
    };
    let text_len = i64::try_from(current.text.chars().count()).unwrap_or(i64::MAX);
    match table {
        Table::Events => {
            let bytes_len = i64::try_from(current.bytes.len()).unwrap_or(i64::MAX);
            let mut stmt = conn.prepare_cached(STALE_EVENTS)?;
            let mut rows = stmt.query(params![
                after.provider,
                after.key,
                bytes_len,
                current.bytes,
                text_len,
                current.text,
                limit
            ])?;
            while let Some(row) = rows.next()? {
                let key = RowKey {
                    provider: row.get(0)?,
                    key: row.get(1)?,
                    ..RowKey::default()
                };
                let columns = [
                    (2, Column::Payload),
                    (3, Column::ResultBody),
                    (4, Column::RequestHeaders),
                ];
                push(row, key, &columns)?;
            }
        }
        Table::Attempts => {
            let mut stmt = conn.prepare_cached(STALE_ATTEMPTS)?;
            let mut rows = stmt.query(params![
                after.provider,
                after.key,
                after.attempt,
                text_len,
                current.text,
                limit
            ])?;
            while let Some(row) = rows.next()? {
                let key = RowKey {
                    provider: row.get(0)?,
                    key: row.get(1)?,
                    attempt: row.get(2)?,
                    ..RowKey::default()
                };
                let attempt = key.attempt;
                push(row, key, &[(3, Column::Answer(attempt))])?;
            }
        }
    }
    Ok(page)
}

impl Resealer for SqliteOperator {
    fn stale<'a>(
        &'a self,
        table: Table,
        after: Option<&'a RowKey>,
        limit: u32,
        current: &'a SealedBy,
    ) -> StoreFuture<'a, StalePage> {
        let after = after.cloned().unwrap_or(RowKey {
            attempt: i32::MIN,
            ..RowKey::default()
        });
        let current = current.clone();
        Box::pin(self.reader.call(move |conn| {
            read_page(conn, table, &after, i64::from(limit), &current).map_err(sql_error)
        }))
    }

    fn reseal<'a>(
        &'a self,
        row: &'a RowKey,
        column: Column,
        old: &'a Stored,
        new: &'a Stored,
    ) -> StoreFuture<'a, bool> {
        let (row, old, new) = (row.clone(), value(old), value(new));
        Box::pin(self.writer.call(move |conn| {
            let (provider, key) = (&row.provider, &row.key);
            let changed = match column {
                Column::Payload => conn
                    .prepare_cached(reseal_event!("payload"))
                    .and_then(|mut s| s.execute(params![provider, key, old, new])),
                Column::ResultBody => conn
                    .prepare_cached(reseal_event!("result_body"))
                    .and_then(|mut s| s.execute(params![provider, key, old, new])),
                Column::RequestHeaders => conn
                    .prepare_cached(reseal_event!("request_headers"))
                    .and_then(|mut s| s.execute(params![provider, key, old, new])),
                Column::Answer(attempt) => conn
                    .prepare_cached(RESEAL_ANSWER)
                    .and_then(|mut s| s.execute(params![provider, key, attempt, old, new])),
            }
            .map_err(sql_error)?;
            Ok(changed == 1)
        }))
    }
}
