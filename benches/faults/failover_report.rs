//! The failover scenario's report: what the senders were answered (and when), what the
//! target received, and which rows the new primary holds, judged against the kill and the
//! promotion. Prints only; answers the violations it printed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::chaos_attempts::{judge, RECORD_MARGIN};
use crate::chaos_target::Seen;

/// Answers this long before the kill still count as "around the promotion" (a request
/// already on its way when the primary died).
const BEFORE_KILL: Duration = Duration::from_secs(1);

/// One answer a sender got.
pub struct Answer {
    pub key: String,
    /// 0: no answer (the connection failed).
    pub status: u16,
    /// `Hookgate-Path`.
    pub path: String,
    pub at: Instant,
}

impl Answer {
    pub fn new(key: &str, status: u16, path: &str) -> Self {
        Self {
            key: key.to_owned(),
            status,
            path: path.to_owned(),
            at: Instant::now(),
        }
    }
}

/// Everything the run collected.
pub struct Report<'a> {
    /// The provider, the prefix of every `Idempotency-Key`.
    pub provider: &'a str,
    pub queue: bool,
    pub rate: u64,
    pub duration: Duration,
    pub events: u64,
    pub started: Instant,
    /// When the primary was killed, and when `pg-ha.sh promote` returned (it polls every
    /// 50 ms for the standby to accept writes, so the node may write a little before).
    pub kill_at: Instant,
    pub promoted_at: Instant,
    pub took: Duration,
    pub answers: &'a [Answer],
    /// Rows done on the old primary just before the kill (`provider:key`).
    pub done_before: &'a HashMap<String, String>,
    /// Rows done or dead on the new primary at the end, with their status.
    pub finished: &'a HashMap<String, String>,
    /// Every attempt the target saw.
    pub seen: &'a [Seen],
    pub first_done_after_kill: Option<f64>,
}

impl Report<'_> {
    /// Prints the block; answers its violations.
    pub fn print(&self) -> u64 {
        let provider = self.provider;
        // Seconds from the kill, negative before it.
        let rel = |t: Instant| {
            t.saturating_duration_since(self.kill_at).as_secs_f64()
                - self.kill_at.saturating_duration_since(t).as_secs_f64()
        };
        let accepted: HashSet<String> = self
            .answers
            .iter()
            .filter(|a| (200..300).contains(&a.status))
            .map(|a| format!("{provider}:{}", a.key))
            .collect();
        let status = |key: &str| self.finished.get(key).map(String::as_str);
        let count = |s: &str| self.finished.values().filter(|v| v.as_str() == s).count();
        let lost: Vec<&String> = self
            .done_before
            .keys()
            .filter(|k| status(k) != Some("done"))
            .collect();
        let unfinished: Vec<&String> = accepted
            .iter()
            .filter(|k| !matches!(status(k), Some("done" | "dead")))
            .collect();

        // Keys the target answered 2xx more than once; those whose first 2xx came while
        // the node had no primary to record it on, apart.
        let judged = judge(self.seen, &[]);
        let mut oks: HashMap<&str, Vec<&Seen>> = HashMap::new();
        for s in self.seen {
            if s.status.is_some_and(|c| (200..300).contains(&c)) {
                oks.entry(&s.key).or_default().push(s);
            }
        }
        let (mut twice, mut in_outage) = (Vec::new(), 0);
        for (key, mut runs) in oks {
            if runs.len() < 2 {
                continue;
            }
            runs.sort_by_key(|s| s.start);
            let first = runs[0];
            if first.end + RECORD_MARGIN >= self.kill_at && first.end <= self.promoted_at {
                in_outage += 1;
            }
            twice.push(key.to_owned());
        }
        twice.sort();

        let around: Vec<&Answer> = self
            .answers
            .iter()
            .filter(|a| a.status == 503 && a.at + BEFORE_KILL >= self.kill_at)
            .collect();
        let mut by_path: BTreeMap<&str, usize> = BTreeMap::new();
        for a in &around {
            *by_path.entry(&a.path).or_default() += 1;
        }
        let window = match (around.first(), around.last()) {
            (Some(first), Some(last)) => format!(
                "{} answers over {:.1}s, from {:+.1}s to {:+.1}s of the kill {by_path:?}",
                around.len(),
                (last.at - first.at).as_secs_f64(),
                rel(first.at),
                rel(last.at),
            ),
            _ => "none".to_owned(),
        };
        let no_answer = self
            .answers
            .iter()
            .filter(|a| a.status == 0 && a.at >= self.kill_at)
            .count();

        let mode = if self.queue { "queue" } else { "sync" };
        println!(
            "# failover: mode={mode} rate={}/s for {:.0}s; primary SIGKILLed at {:.1}s, \
             standby accepting writes {:.1}s later; run took {:.1}s",
            self.rate,
            self.duration.as_secs_f64(),
            (self.kill_at - self.started).as_secs_f64(),
            (self.promoted_at - self.kill_at).as_secs_f64(),
            self.took.as_secs_f64(),
        );
        println!("scenario=failover mode={mode} store=postgres-ha");
        let line = |what: &str, n: String| println!("  {what:.<50} {n}");
        line("events sent ", self.events.to_string());
        line("events acknowledged (2xx) ", accepted.len().to_string());
        line("done on the new primary ", count("done").to_string());
        line("dead on the new primary ", count("dead").to_string());
        line(
            "done before the kill, missing or not done now ",
            format!("{} of {}   (must be 0)", lost.len(), self.done_before.len()),
        );
        line(
            "acknowledged, neither done nor dead now ",
            format!("{}   (must be 0)", unfinished.len()),
        );
        line(
            "keys delivered (2xx) more than once ",
            format!("{}   (must be 0)", twice.len()),
        );
        line(
            "  of them acted on while nothing could record ",
            in_outage.to_string(),
        );
        line(
            "attempts overlapping one of their key ",
            format!("{}   (must be 0)", judged.overlaps.len()),
        );
        line("503s around the promotion ", window);
        line("requests unanswered after the kill ", no_answer.to_string());
        line(
            "first done on the new primary ",
            match self.first_done_after_kill {
                Some(s) => format!(
                    "{s:.2}s after the kill ({:+.2}s from pg-ha.sh promote's return)",
                    s - (self.promoted_at - self.kill_at).as_secs_f64()
                ),
                None => "none".to_owned(),
            },
        );
        for key in lost.iter().take(5) {
            println!("# lost done row {key}");
        }
        for key in unfinished.iter().take(5) {
            println!("# unfinished {key} ({:?})", status(key));
        }
        for key in twice.iter().take(5) {
            println!("# delivered twice {key}");
        }
        (lost.len() + unfinished.len() + twice.len() + judged.overlaps.len()) as u64
    }
}
