//! The Postgres store's searches and lists (`store/search.rs` says what they answer): one
//! statement a page, each status read newest first (or oldest first) by its own scan of
//! the (status, updated_at) index, the scans merged in the page order, at most
//! [`SCAN_BUDGET`] rows read, the filter's other conditions tested on them. Plain reads: no
//! lock, the last committed rows; a claim or completion meanwhile moves its row to the
//! front of the order, where the next page does not look.

use tokio_postgres::types::ToSql;

use super::pool::Inner;
use super::rows::{db_error, get, summary};
use crate::store::operator::SearchFilter;
use crate::store::page::PageCursor;
use crate::store::search::{page, start, Order, SearchPage, SCAN_BUDGET};
use crate::store::StoreError;

/// What each status's scan reads of a row: a summary's columns (no payload), raw times.
macro_rules! scan_columns {
    () => {
        "provider, event_key, status, attempts, last_path, result_status, last_error,
         dead_reason, mode, octet_length(payload)::int8 AS payload_bytes, locked_until,
         created_at, updated_at"
    };
}

/// One status's rows in the page order from the start on, at most the budget (`$14`); a
/// status other than the one searched (`$1`, NULL: all) is not read at all (a one-time
/// test). `$2`…`$4`: the start, `(Unix µs, provider, key)`, rows strictly past it; `$5`:
/// changed at or after (Unix seconds). Both bound the index scan itself; the start's ties
/// on `updated_at` are tested on the rows.
macro_rules! scan {
    ($status:literal, newest) => {
        concat!(
            "(SELECT ",
            scan_columns!(),
            " FROM webhook_events
  WHERE status = '",
            $status,
            "' AND ($1::text IS NULL OR $1::text = '",
            $status,
            "')
    AND (updated_at, provider, event_key)
        < (COALESCE('epoch'::timestamptz + $2::bigint * interval '1 microsecond', 'infinity'),
           COALESCE($3::text, ''), COALESCE($4::text, ''))
    AND updated_at >= COALESCE(to_timestamp($5::float8), '-infinity')
  ORDER BY updated_at DESC, provider DESC, event_key DESC LIMIT $14)"
        )
    };
    ($status:literal, oldest) => {
        concat!(
            "(SELECT ",
            scan_columns!(),
            " FROM webhook_events
  WHERE status = '",
            $status,
            "' AND ($1::text IS NULL OR $1::text = '",
            $status,
            "')
    AND (updated_at, provider, event_key)
        > (COALESCE('epoch'::timestamptz + $2::bigint * interval '1 microsecond', '-infinity'),
           COALESCE($3::text, ''), COALESCE($4::text, ''))
    AND updated_at >= COALESCE(to_timestamp($5::float8), '-infinity')
  ORDER BY updated_at, provider, event_key LIMIT $14)"
        )
    };
}

/// A page: the scans of every status merged in the page order and cut at the budget, each
/// row numbered (`n`) and tested against the filter (`hit`: `$6` provider, `$7` last path,
/// `$8` key prefix, exactly, `$9` mode, `$10` dead reason, `$11`/`$12` created from /
/// before, Unix seconds). Answers the rows that match and the budget's last row, whether it
/// matches or not (the page's end when the budget runs out first), at most `$13`.
macro_rules! page_of {
    ($order:ident, $dir:literal) => {
        concat!(
            "
SELECT provider, event_key, status, attempts, last_path, result_status, last_error,
       dead_reason, mode, payload_bytes,
       GREATEST(0, extract(epoch FROM locked_until - now()) * 1000)::bigint AS lease_left_ms,
       extract(epoch FROM created_at)::float8 AS created_unix,
       extract(epoch FROM updated_at)::float8 AS updated_unix, n, hit
FROM (
    SELECT s.*,
           row_number() OVER (ORDER BY updated_at ",
            $dir,
            ", provider ",
            $dir,
            ", event_key ",
            $dir,
            ") AS n,
           (($6::text IS NULL OR provider = $6)
            AND ($7::text IS NULL OR last_path = $7)
            AND ($8::text IS NULL OR starts_with(event_key, $8))
            AND ($9::text IS NULL OR mode = $9)
            AND ($10::text IS NULL OR dead_reason = $10)
            AND ($11::float8 IS NULL OR created_at >= to_timestamp($11))
            AND ($12::float8 IS NULL OR created_at < to_timestamp($12))) AS hit
    FROM (",
            scan!("queued", $order),
            "
          UNION ALL ",
            scan!("in_progress", $order),
            "
          UNION ALL ",
            scan!("failed", $order),
            "
          UNION ALL ",
            scan!("done", $order),
            "
          UNION ALL ",
            scan!("dead", $order),
            "
          ORDER BY updated_at ",
            $dir,
            ", provider ",
            $dir,
            ", event_key ",
            $dir,
            " LIMIT $14) AS s
) AS w
WHERE hit OR n = $14
ORDER BY updated_at ",
            $dir,
            ", provider ",
            $dir,
            ", event_key ",
            $dir,
            " LIMIT $13"
        )
    };
}

/// A page, last changed first (searches, dead letters).
const NEWEST: &str = page_of!(newest, "DESC");

/// A page, least recently changed first (`events list`).
const OLDEST: &str = page_of!(oldest, "ASC");

/// A page of rows matching `filter` in `order`, after `after` (newest first only), at most
/// `limit`, on `inner`'s connections.
pub(crate) async fn scan(
    inner: &Inner,
    filter: &SearchFilter,
    after: Option<&PageCursor>,
    limit: u32,
    order: Order,
) -> Result<SearchPage, StoreError> {
    let (sql, start) = match order {
        Order::Newest => (NEWEST, start(filter, after)),
        Order::Oldest => (OLDEST, None),
    };
    let status = filter.status.map(|s| s.as_str());
    let (us, from_provider, from_key) = match start {
        Some((us, p, k)) => (Some(us), Some(p), Some(k)),
        None => (None, None, None),
    };
    // The matches of a full page and one more (the next page exists), and the budget's end.
    let rows = i64::from(limit) + 2;
    let budget = i64::from(SCAN_BUDGET);
    let params: [&(dyn ToSql + Sync); 14] = [
        &status,
        &us,
        &from_provider,
        &from_key,
        &filter.updated_after,
        &filter.provider,
        &filter.path,
        &filter.key_prefix,
        &filter.mode,
        &filter.reason,
        &filter.created_after,
        &filter.created_before,
        &rows,
        &budget,
    ];
    let found = inner
        .guarded(inner.run(async |client| {
            let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
            client.query(&stmt, &params).await.map_err(db_error)
        }))
        .await?;
    let mut hits = Vec::with_capacity(found.len());
    let mut end = None;
    for row in &found {
        let read = summary(row)?;
        if get::<i64>(row, "n")? == budget {
            end = Some(PageCursor::after(read.updated_at, &read.id));
        }
        if get::<bool>(row, "hit")? {
            hits.push(read);
        }
    }
    Ok(page(hits, end, limit))
}

#[cfg(test)]
mod tests {
    use super::{NEWEST, OLDEST};
    use crate::claim::Status;

    #[test]
    fn a_search_without_a_status_reads_every_status() {
        for sql in [NEWEST, OLDEST] {
            for status in Status::ALL {
                let scan = format!("WHERE status = '{}'", status.as_str());
                assert_eq!(sql.matches(&scan).count(), 1, "{scan} in {sql}");
            }
        }
    }
}
