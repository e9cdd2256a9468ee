//! What a search answers and how far it reads, the same on both stores. A search reads
//! rows in the page order — last changed first, ties by provider then key, descending (or
//! the reverse, for `events list`) — one ordered scan of the (status, updated_at) index
//! per status, merged, from a start strictly after the cursor. The filter's other
//! conditions test the rows read, and one page reads at most [`SCAN_BUDGET`] of them: a
//! page that did not fill within the budget ends where the reading stopped, and its cursor
//! goes on from there ([`SearchPage::scan_stopped`]). So a search costs at most the
//! budget, whatever its filter and however large the table. Shapes and rules only; each
//! backend reads the rows its own way.

use super::operator::SearchFilter;
use super::page::{micros, PageCursor};
use super::types::EventSummary;

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
