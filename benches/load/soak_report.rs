//! What the soak run prints and how it is judged: one line per window ([`Sample`]), then
//! the checks, each with the numbers it compared. The growth rules (see `soak.rs` for why
//! these) look only at the steady part of the run, the windows ending after
//! [`Rules::settle`]: its last third against its middle third.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::soak_db::{Counts, PrefillLeft};
use crate::soak_target::Tally;

/// Growth the disk may show from the middle third of the steady windows to the last:
/// Postgres's table grows between autovacuum runs and SQLite's WAL between checkpoints,
/// so a store that holds its size still moves by some percent from window to window.
const GROWTH_TOLERANCE: f64 = 1.15;

/// One window's figures.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// The end of the window, since the senders started.
    pub at: Duration,
    pub length: Duration,
    /// 2xx answers, other answers, no answer, in the window.
    pub accepted: u64,
    pub refused: u64,
    pub errors: u64,
    /// The other answers by status and path (`"503/overloaded"`).
    pub refused_by: BTreeMap<String, u64>,
    pub counts: Counts,
    /// The node's `hookgate_table_bytes` for the events and their history, as of its last
    /// sweep.
    pub events_bytes: u64,
    pub attempts_bytes: u64,
    /// The node's `hookgate_retention_backlog_seconds`, as of its last sweep.
    pub backlog_s: f64,
    /// Done rows the node's retention removed in the window (`hookgate_swept_rows_total`):
    /// which windows a slot was emptied in.
    pub swept: u64,
    /// CPU per accepted event: the bench's process without its senders and its own reads
    /// (the node and the bench's target), and the Postgres cluster without the bench's
    /// backend.
    pub node_us: f64,
    pub postgres_us: Option<f64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// At the target, since the start.
    pub tally: Tally,
    pub rss_mib: u64,
}

impl Sample {
    /// The window as one line.
    pub fn line(&self) -> String {
        let cpu = match self.postgres_us {
            Some(pg) => format!("{:.0}+{pg:.0}µs", self.node_us),
            None => format!("{:.0}µs", self.node_us),
        };
        let refused_as = if self.refused_by.is_empty() {
            String::new()
        } else {
            let each: Vec<String> = self
                .refused_by
                .iter()
                .map(|(k, n)| format!("{k}:{n}"))
                .collect();
            format!(" refused_as={}", each.join(","))
        };
        format!(
            "t={:>5.0}s ev/s={:>6.0} rows={:>8} history={:>6} past_retention={:>7} \
             backlog={:.0}s swept={} disk={} events={} history={} cpu/ev={cpu} p50={:.1}ms \
             p99={:.1}ms max={:.0}ms refused={} errors={} deliveries={} duplicates={} rss={}MiB{refused_as}",
            self.at.as_secs_f64(),
            self.accepted as f64 / self.length.as_secs_f64().max(1e-3),
            self.counts.rows,
            self.counts.attempts,
            self.counts.past_retention,
            self.backlog_s,
            self.swept,
            mib(self.counts.disk),
            mib(self.events_bytes),
            mib(self.attempts_bytes),
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.refused,
            self.errors,
            self.tally.deliveries,
            self.tally.duplicates,
            self.rss_mib,
        )
    }
}

/// Bytes as MiB with one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1}MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// One check's outcome: `Some(true)` passed, `Some(false)` failed, `None` not judged.
pub struct Check {
    pub name: &'static str,
    pub passed: Option<bool>,
    /// The numbers compared, or why the check was not judged.
    pub detail: String,
}

impl Check {
    pub fn line(&self) -> String {
        let mark = match self.passed {
            Some(true) => "ok  ",
            Some(false) => "FAIL",
            None => "--  ",
        };
        format!("# check {mark} {}: {}", self.name, self.detail)
    }
}

/// The run's timing, which the growth rules need.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub retention: Duration,
    pub sweep_interval: Duration,
    pub window: Duration,
}

impl Rules {
    /// When the run should hold its size: every row of the first retention period has
    /// expired, a sweep pass has run since, and one more window has passed.
    pub fn settle(&self) -> Duration {
        self.retention + self.sweep_interval + self.window
    }

    /// The shortest run whose growth is judged: three windows after the settling time.
    pub fn judged_after(&self) -> Duration {
        self.settle() + 3 * self.window
    }

    /// Every check, in the order printed.
    pub fn checks(
        &self,
        samples: &[Sample],
        tally: Tally,
        left: Option<PrefillLeft>,
    ) -> Vec<Check> {
        let mut checks = vec![Check {
            name: "no key delivered twice",
            passed: Some(tally.duplicates == 0 && tally.foreign == 0),
            detail: format!(
                "{} duplicate(s) and {} delivery(ies) of keys never sent, in {} deliveries",
                tally.duplicates, tally.foreign, tally.deliveries
            ),
        }];
        checks.extend(left.map(prefill_checks).into_iter().flatten());
        let steady: Vec<&Sample> = samples.iter().filter(|s| s.at >= self.settle()).collect();
        if steady.len() < 3 {
            let why = format!(
                "not judged: needs three windows after {} (retention + sweep interval + a \
                 window), a run of at least {}",
                humantime::format_duration(self.settle()),
                humantime::format_duration(self.judged_after())
            );
            for name in ["the disk holds its size", "retention keeps up"] {
                checks.push(Check {
                    name,
                    passed: None,
                    detail: why.clone(),
                });
            }
            return checks;
        }
        let third = steady.len() / 3;
        let (middle, last) = (
            &steady[steady.len() - 2 * third..steady.len() - third],
            &steady[steady.len() - third..],
        );
        let max_disk = |s: &[&Sample]| s.iter().map(|s| s.counts.disk).max().unwrap_or(0);
        let (before, after) = (max_disk(middle), max_disk(last));
        checks.push(Check {
            name: "the disk holds its size",
            passed: Some(after as f64 <= GROWTH_TOLERANCE * before as f64),
            detail: format!(
                "largest of the last third {}, of the middle third {} (at most {GROWTH_TOLERANCE}×)",
                mib(after),
                mib(before)
            ),
        });
        let accepted: u64 = steady.iter().map(|s| s.accepted).sum();
        let seconds: f64 = steady.iter().map(|s| s.length.as_secs_f64()).sum();
        let rate = accepted as f64 / seconds.max(1e-3);
        let limit = (rate * (self.sweep_interval + self.window).as_secs_f64()).ceil() as u64;
        let fewest = last
            .iter()
            .map(|s| s.counts.past_retention)
            .min()
            .unwrap_or(0);
        checks.push(Check {
            name: "retention keeps up",
            passed: Some(fewest <= limit),
            detail: format!(
                "fewest rows past retention in the last third {fewest}, at most {limit} \
                 ({rate:.0} events/s × (sweep interval + window))"
            ),
        });
        checks
    }
}

/// The prefill's expired rows are gone, and none of those within retention is.
fn prefill_checks(left: PrefillLeft) -> Vec<Check> {
    vec![
        Check {
            name: "the expired prefill is removed",
            passed: Some(left.expired == 0),
            detail: format!(
                "{} row(s) already past retention at the start still there",
                left.expired
            ),
        },
        Check {
            name: "the prefill within retention is kept",
            // A row on the boundary may fall either side of it.
            passed: Some(left.young.abs_diff(left.young_expected) <= 1),
            detail: format!(
                "{} row(s) within retention, {} expected",
                left.young, left.young_expected
            ),
        },
    ]
}
