//! What a search answers and how far it reads, the same on both stores. A search reads
//! rows in the page order — last changed first, ties by provider then key, descending (or
//! the reverse, for `events list`) — one ordered scan of the (status, updated_at) index
//! per status, merged, from a start strictly after the cursor. The filter's other
//! conditions test the rows read, and one page reads at most [`SCAN_BUDGET`] of them: a
//! page that did not fill within the budget ends where the reading stopped, and its cursor
//! goes on from there ([`SearchPage::scan_stopped`]). So a search costs at most the
//! budget, whatever its filter and however large the table. Shapes and rules only; each
//! backend reads the rows its own way.

use serde::{Deserialize, Serialize};

use super::page::{micros, PageCursor};
use super::EventSummary;
use crate::claim::Status;

/// Which events a search (or a bulk replay) is about; every field narrows it. An unknown
/// field is refused, never ignored: a misspelled one would widen a bulk replay to
/// everything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchFilter {
    /// Only this provider's.
    pub provider: Option<String>,
    /// Only rows in this status.
    #[serde(default, with = "status_name")]
    pub status: Option<Status>,
    /// Only rows whose last attempt took this path.
    pub path: Option<String>,
    /// Only keys that start with this.
    pub key_prefix: Option<String>,
    /// Only `sync` or `queue` rows.
    pub mode: Option<String>,
    /// Only dead letters of this reason.
    pub reason: Option<String>,
    /// Created at or after (Unix seconds).
    pub created_after: Option<f64>,
    /// Created before (Unix seconds).
    pub created_before: Option<f64>,
    /// Last changed at or after (Unix seconds).
    pub updated_after: Option<f64>,
    /// Last changed before (Unix seconds).
    pub updated_before: Option<f64>,
}

mod status_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::claim::Status;

    pub fn serialize<S: Serializer>(status: &Option<Status>, s: S) -> Result<S::Ok, S::Error> {
        match status {
            Some(status) => s.serialize_str(status.as_str()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Status>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => Status::parse(&text)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown status {text:?}"))),
        }
    }
}

/// Rows one page of a search reads at most. Ten thousand rows of an index read in order,
/// their heap rows fetched, took 16 ms (67 ms in a busier hour) on a million-row table on
/// the 2-core development machine (docs/performance.md): a bound on one page's cost for
/// any filter, against a second or more for a scan of the table. A filter that matches
/// fewer than one row in ten thousand is paged on through the cursor.
pub const SCAN_BUDGET: u32 = 10_000;

/// One page of a search.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchPage {
    /// The matching rows, in the page order.
    pub rows: Vec<EventSummary>,
    /// Where the next page starts (strictly after it); `None` on the last page.
    pub next: Option<PageCursor>,
    /// The page ended because [`SCAN_BUDGET`] rows were read before it was full: rows
    /// further back may still match, and `next` goes on from the last row read.
    pub scan_stopped: bool,
}

/// Which end of the page order a scan reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Last changed first (searches, dead letters).
    Newest,
    /// Least recently changed first (`events list`: what is stuck).
    Oldest,
}

/// Where a newest-first scan starts, as `(Unix µs, provider, key)`: the rows strictly
/// before it in the page order. The cursor, or `updated_before` when that comes first (a
/// row changed at that instant sorts after `(instant, "", "")`, as no provider or key is
/// empty); `None`: from the newest row.
pub(crate) fn start(
    filter: &SearchFilter,
    after: Option<&PageCursor>,
) -> Option<(i64, String, String)> {
    let before = filter
        .updated_before
        .map(|t| (micros(t), String::new(), String::new()));
    let cursor = after.map(|c| {
        (
            c.updated_us,
            c.id.provider.to_string(),
            c.id.key.to_string(),
        )
    });
    match (before, cursor) {
        (Some(b), Some(c)) => Some(if b.0 <= c.0 { b } else { c }),
        (b, c) => b.or(c),
    }
}

/// Whether a row read matches the filter's conditions other than its status and its time
/// of change, which bound the scans themselves.
pub(crate) fn matches(filter: &SearchFilter, row: &EventSummary) -> bool {
    let same = |want: &Option<String>, have: Option<&str>| {
        want.as_deref().is_none_or(|want| have == Some(want))
    };
    same(&filter.provider, Some(&row.id.provider))
        && same(&filter.path, row.last_path.map(|p| p.as_str()))
        && filter
            .key_prefix
            .as_deref()
            .is_none_or(|prefix| row.id.key.starts_with(prefix))
        && same(&filter.mode, Some(&row.mode))
        && same(&filter.reason, row.dead_reason.as_deref())
        && filter.created_after.is_none_or(|t| row.created_at >= t)
        && filter.created_before.is_none_or(|t| row.created_at < t)
}

/// A page of at most `limit` rows from a scan that found `hits` (in the page order, asked
/// for one more than `limit`) and stopped at its budget on the row `end`, if it did.
pub(crate) fn page(mut hits: Vec<EventSummary>, end: Option<PageCursor>, limit: u32) -> SearchPage {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if hits.len() > limit {
        hits.truncate(limit);
        let next = hits.last().map(|r| PageCursor::after(r.updated_at, &r.id));
        return SearchPage {
            rows: hits,
            next,
            scan_stopped: false,
        };
    }
    SearchPage {
        rows: hits,
        scan_stopped: end.is_some(),
        next: end,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_filter_reads_its_status_by_name_and_refuses_others() {
        let filter: SearchFilter = serde_json::from_str(r#"{"status":"dead"}"#).unwrap();
        assert_eq!(filter.status, Some(Status::Dead));
        assert!(serde_json::from_str::<SearchFilter>(r#"{"status":"gone"}"#).is_err());
    }
    use crate::claim::Status;
    use crate::key::EventId;

    fn row(key: &str, updated_at: f64) -> EventSummary {
        EventSummary {
            id: EventId::new("p", key),
            status: Status::Dead,
            attempts: 1,
            last_path: None,
            result_status: None,
            last_error: None,
            dead_reason: Some("non_retryable".into()),
            payload_bytes: None,
            lease_left: Duration::ZERO,
            mode: "sync".into(),
            created_at: updated_at,
            updated_at,
        }
    }

    #[test]
    fn a_scan_starts_at_the_cursor_or_the_updated_before_bound_whichever_comes_first() {
        let cursor = PageCursor::after(100.0, &EventId::new("p", "k"));
        let before = |t: f64| SearchFilter {
            updated_before: Some(t),
            ..SearchFilter::default()
        };
        assert_eq!(start(&SearchFilter::default(), None), None);
        assert_eq!(
            start(&SearchFilter::default(), Some(&cursor)),
            Some((100_000_000, "p".into(), "k".into()))
        );
        assert_eq!(
            start(&before(50.0), Some(&cursor)),
            Some((50_000_000, String::new(), String::new()))
        );
        assert_eq!(
            start(&before(100.0), Some(&cursor)),
            Some((100_000_000, String::new(), String::new())),
            "a row changed at the bound itself is not before it"
        );
        assert_eq!(
            start(&before(200.0), Some(&cursor)),
            Some((100_000_000, "p".into(), "k".into()))
        );
    }

    #[test]
    fn a_full_page_goes_on_after_its_last_row_and_a_stopped_scan_after_its_last_read() {
        let hits = vec![row("a", 3.0), row("b", 2.0), row("c", 1.0)];
        let full = page(hits.clone(), None, 2);
        assert_eq!(full.rows.len(), 2);
        assert_eq!(full.next, Some(PageCursor::after(2.0, &hits[1].id)));
        assert!(!full.scan_stopped);
        let last = page(hits.clone(), None, 3);
        assert_eq!(
            (last.rows.len(), last.next, last.scan_stopped),
            (3, None, false)
        );
        let end = PageCursor::after(0.5, &EventId::new("p", "z"));
        let stopped = page(hits, Some(end.clone()), 5);
        assert_eq!(stopped.rows.len(), 3);
        assert_eq!(stopped.next, Some(end));
        assert!(stopped.scan_stopped);
    }

    #[test]
    fn a_row_matches_every_condition_given_and_a_key_prefix_exactly() {
        let r = row("evt_Ab", 1.0);
        let filter = |f: SearchFilter| matches(&f, &r);
        assert!(filter(SearchFilter::default()));
        assert!(filter(SearchFilter {
            key_prefix: Some("evt_A".into()),
            reason: Some("non_retryable".into()),
            created_after: Some(1.0),
            ..SearchFilter::default()
        }));
        assert!(!filter(SearchFilter {
            key_prefix: Some("evt_a".into()),
            ..SearchFilter::default()
        }));
        assert!(!filter(SearchFilter {
            provider: Some("q".into()),
            ..SearchFilter::default()
        }));
        assert!(!filter(SearchFilter {
            path: Some("first_run".into()),
            ..SearchFilter::default()
        }));
        assert!(!filter(SearchFilter {
            created_before: Some(1.0),
            ..SearchFilter::default()
        }));
    }
}
