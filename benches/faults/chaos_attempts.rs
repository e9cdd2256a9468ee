//! Judging what the queue-mode chaos target saw: attempts of one key open at once, and keys
//! answered 2xx more than once — apart from those whose first 2xx reached a node that
//! could not record it (SIGKILLed, or cut off from its database for longer than a lease),
//! which the promise excuses (docs/design.md). Pure: no I/O.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::chaos_target::Seen;

/// A 2xx answered this little before a SIGKILL or a cut-off may not have been recorded by
/// the node (it records an outcome within milliseconds of the answer, so anything older
/// was).
pub const RECORD_MARGIN: Duration = Duration::from_millis(500);

/// A time one node could not record what its target answered: from a SIGKILL to itself
/// (`from == to`), or while its database was cut off for longer than a lease.
pub struct Unrecordable {
    /// What happened, for the report ("SIGKILL A").
    pub what: &'static str,
    /// The node's name, as the target sees it (`Seen::node`).
    pub node: &'static str,
    pub from: Instant,
    pub to: Instant,
}

/// Two attempts of one key that were open at the target at the same time.
#[derive(Debug, Clone)]
pub struct Overlap {
    pub key: String,
    pub first: Seen,
    pub second: Seen,
}

/// What the attempts show.
#[derive(Debug, Default)]
pub struct Judged {
    /// Attempts seen.
    pub attempts: usize,
    /// Attempts answered 2xx.
    pub ok: usize,
    /// Attempts whose client hung up before the answer.
    pub hung_up: usize,
    /// Keys whose attempts overlapped, one entry per overlapping pair (later attempt
    /// against the one still open when it started).
    pub overlaps: Vec<Overlap>,
    /// Keys answered 2xx twice where the first answer reached a node that could not
    /// record it, with what kept it from recording.
    pub doubles_unrecordable: Vec<(String, &'static str)>,
    /// Keys answered 2xx more than once otherwise.
    pub doubles_outside: Vec<String>,
}

/// Judges every attempt against the times a node could not record its answers.
pub fn judge(seen: &[Seen], unrecordable: &[Unrecordable]) -> Judged {
    let mut by_key: HashMap<&str, Vec<&Seen>> = HashMap::new();
    for s in seen {
        by_key.entry(&s.key).or_default().push(s);
    }
    let mut judged = Judged {
        attempts: seen.len(),
        ok: seen.iter().filter(|s| is_ok(s)).count(),
        hung_up: seen.iter().filter(|s| s.status.is_none()).count(),
        ..Judged::default()
    };
    for (key, mut attempts) in by_key {
        attempts.sort_by_key(|s| s.start);
        // The attempt that stays open longest among those started so far.
        let mut open: Option<&Seen> = None;
        for s in &attempts {
            if let Some(o) = open {
                if s.start < o.end {
                    judged.overlaps.push(Overlap {
                        key: key.to_owned(),
                        first: o.clone(),
                        second: (*s).clone(),
                    });
                }
            }
            if open.is_none_or(|o| s.end > o.end) {
                open = Some(s);
            }
        }
        let oks: Vec<&&Seen> = attempts.iter().filter(|s| is_ok(s)).collect();
        if oks.len() < 2 {
            continue;
        }
        let (first, second) = (oks[0], oks[1]);
        let excuse = unrecordable.iter().find(|u| {
            oks.len() == 2
                && first.node == u.node
                && first.start <= u.to
                && first.end + RECORD_MARGIN >= u.from
                && first.end <= u.to + RECORD_MARGIN
                && second.start > first.end
        });
        if let Some(u) = excuse {
            judged.doubles_unrecordable.push((key.to_owned(), u.what));
        } else {
            judged.doubles_outside.push(key.to_owned());
        }
    }
    judged.overlaps.sort_by_key(|o| o.second.start);
    judged.doubles_outside.sort();
    judged
}

fn is_ok(s: &Seen) -> bool {
    s.status.is_some_and(|c| (200..300).contains(&c))
}

/// One attempt for a report line: `#attempt start..end status`, times from `started`.
pub fn show(s: &Seen, started: Instant) -> String {
    let at = |t: Instant| t.saturating_duration_since(started).as_secs_f64();
    let status = s.status.map_or("hung up".to_owned(), |c| c.to_string());
    format!(
        "#{} {:.2}s..{:.2}s {status}",
        s.attempt,
        at(s.start),
        at(s.end)
    )
}
