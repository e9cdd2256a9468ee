//! The checks over one case's journal and final rows: no two deliveries of a key overlap,
//! no 2xx is resent unless excused (a kill, or every call that would have kept the lease
//! refused or held), every row ends done or dead with its own attempt's answer.

use std::time::{Duration, Instant};

use crate::helpers::{AttemptNote, Call, Op, Span};

use super::case::Case;
use super::script::answer_body;
use super::{margin, LEASE, WRITE_PAUSE};

/// What one case found.
pub(super) struct Found {
    pub(super) violations: Vec<String>,
    /// The case's parameters, findings and schedule.
    pub(super) report: String,
    pub(super) excused: Vec<String>,
    pub(super) stats: Stats,
}

#[derive(Default, Debug, Clone, Copy)]
pub(super) struct Stats {
    pub(super) deliveries: usize,
    pub(super) delivered: usize,
    pub(super) hung_up: usize,
    pub(super) faults: usize,
    pub(super) kills: usize,
    pub(super) replays: usize,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Self) {
        self.deliveries += o.deliveries;
        self.delivered += o.delivered;
        self.hung_up += o.hung_up;
        self.faults += o.faults;
        self.kills += o.kills;
        self.replays += o.replays;
    }
}

/// Whether `[from, to]` is covered by the union of `intervals`.
fn covered(from: Instant, to: Instant, mut intervals: Vec<(Instant, Instant)>) -> bool {
    intervals.sort();
    let mut reach = from;
    for (start, end) in intervals {
        if reach >= to {
            break;
        }
        if start > reach {
            return false;
        }
        reach = reach.max(end);
    }
    reach >= to
}

/// Why a delivery of `key` after attempt `n`'s 2xx (which ended at `answered`) may happen,
/// if it may: the runner was killed before the outcome landed, or every call that would
/// have kept the lease was refused or held from the answer until the row was retaken.
fn excuse(
    key: &str,
    n: i32,
    answered: Instant,
    next: &Span,
    calls: &[Call],
    attempts: &[AttemptNote],
) -> Option<String> {
    let note = attempts.iter().find(|a| a.key == key && a.attempts == n)?;
    if note.crashed.is_some() {
        return Some(format!(
            "{key} #{n}: killed between its 2xx and its outcome; delivered again as #{}",
            next.attempts
        ));
    }
    let ours = |c: &&Call| c.key.as_deref() == Some(key);
    // The first call after the answer is made a moment after it.
    let answered = answered + margin();
    let far = answered + Duration::from_secs(3600);
    // The take, claim or replay that reopened the row after attempt n.
    let retake = calls
        .iter()
        .filter(ours)
        .filter(|c| matches!(c.op, Op::Take | Op::Claim | Op::Replay))
        .filter(|c| c.applied && c.attempts == Some(n + 1))
        .filter_map(|c| c.reached)
        .min()
        .unwrap_or(next.start);
    if note.queue {
        // Renewals (and the take itself) keep the lease: the next is due a third of a
        // lease after the last, later by at most the hang-up margin's worth of slack.
        let keep = LEASE / 3 + margin();
        let intervals = calls
            .iter()
            .filter(ours)
            .filter(|c| {
                (c.op == Op::Renew && c.attempts == Some(n))
                    || (matches!(c.op, Op::Take | Op::Replay) && c.attempts == Some(n))
            })
            .map(|c| (c.issued, c.ended.map_or(far, |e| e + keep)))
            .collect();
        covered(answered, retake, intervals).then(|| {
            format!(
                "{key} #{n}: every renewal refused or held from its 2xx until #{} took the row",
                n + 1
            )
        })
    } else {
        // The outcome write is tried until the lease ends, pausing at most WRITE_PAUSE; a
        // query error ends it at once (it will not heal).
        let keep = WRITE_PAUSE + margin();
        let intervals = calls
            .iter()
            .filter(ours)
            .filter(|c| matches!(c.op, Op::Complete | Op::Fail) && c.attempts == Some(n))
            .filter(|c| !c.applied)
            .map(|c| {
                let query = c.said.contains("query");
                let end = c.ended.map_or(far, |e| if query { far } else { e + keep });
                (c.issued, end)
            })
            .collect();
        covered(answered, retake.min(note.lease_ends), intervals).then(|| {
            format!("{key} #{n}: sync outcome write refused or held until its lease ended")
        })
    }
}

/// A key and its row at the end: status, attempts and the stored answer's body.
pub(super) type Row = (String, Option<(String, i32, Option<String>)>);

/// The invariants over one case's journal and final rows.
pub(super) fn check(case: &Case, rows: &[Row]) -> Found {
    let spans = case.journal.spans();
    let calls = case.journal.calls();
    let attempts = case.journal.attempts();
    let mut violations = Vec::new();
    let mut excused = Vec::new();
    let ms = |t: Instant| case.journal.ms(t);
    for (key, _) in &case.keys {
        let mut ours: Vec<&Span> = spans.iter().filter(|s| &s.key == key).collect();
        ours.sort_by_key(|s| s.start);
        for s in &ours {
            if s.end.is_none() {
                violations.push(format!("{key} #{}: delivery never ended", s.attempts));
            }
        }
        // 1. No two deliveries of one key open at once; no fencing token delivered twice.
        for (i, a) in ours.iter().enumerate() {
            for b in &ours[i + 1..] {
                let a_end = a.end.unwrap_or(b.start + Duration::from_secs(3600));
                if b.start < a_end {
                    violations.push(format!(
                        "{key}: deliveries overlap: #{} (r{}) {}..{} ms and #{} (r{}) from {} ms",
                        a.attempts,
                        a.runner,
                        ms(a.start),
                        ms(a_end),
                        b.attempts,
                        b.runner,
                        ms(b.start)
                    ));
                }
                if a.attempts == b.attempts {
                    violations.push(format!(
                        "{key}: fencing token #{} delivered twice",
                        a.attempts
                    ));
                }
            }
        }
        // 2. After a 2xx, no further delivery unless excused.
        for a in ours.iter().filter(|s| s.delivered) {
            let Some(answered) = a.end else { continue };
            let Some(next) = ours
                .iter()
                .find(|b| b.attempts != a.attempts && b.start >= answered)
            else {
                continue;
            };
            match excuse(key, a.attempts, answered, next, &calls, &attempts) {
                Some(why) => excused.push(why),
                None => violations.push(format!(
                    "{key}: answered 2xx to #{} (r{}) at {} ms, delivered again as #{} (r{}) at \
                     {} ms",
                    a.attempts,
                    a.runner,
                    ms(answered),
                    next.attempts,
                    next.runner,
                    ms(next.start)
                )),
            }
        }
    }
    // 3. Every row done or dead; a done row's attempt answered 2xx, and the row holds
    // that answer (not another attempt's, written stale).
    for (key, row) in rows {
        match row {
            Some((status, n, body)) if status == "done" => {
                let ok = spans
                    .iter()
                    .any(|s| &s.key == key && s.attempts == *n && s.delivered);
                if !ok {
                    violations.push(format!(
                        "{key}: the row is done by attempt #{n}, which the target never answered \
                         2xx"
                    ));
                }
                if body.as_deref() != Some(answer_body(*n).as_str()) {
                    violations.push(format!(
                        "{key}: the row is done by attempt #{n} but holds the answer {body:?}"
                    ));
                }
            }
            Some((status, _, _)) if status == "dead" => {}
            other => violations.push(format!("{key}: ends {other:?}, not done or dead")),
        }
    }
    let stats = Stats {
        deliveries: spans.len(),
        delivered: spans.iter().filter(|s| s.delivered).count(),
        hung_up: spans.iter().filter(|s| s.answer.is_none()).count(),
        faults: calls.iter().filter(|c| c.fault.is_some()).count(),
        kills: attempts.iter().filter(|a| a.crashed.is_some()).count(),
        replays: calls
            .iter()
            .filter(|c| c.op == Op::Replay && c.applied)
            .count(),
    };
    Found {
        violations,
        report: String::new(),
        excused,
        stats,
    }
}
