//! The queue-mode chaos run's report: one block of counts (accepted, done, dead by reason,
//! attempts, overlaps, double 2xx, stranded), examples of each violation labelled with the
//! fault they fall in, and each node's exits, panics and most frequent log messages.
//! Prints only; answers the violations it printed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::chaos_attempts::{show, Judged};
use crate::chaos_logs::LogSummary;
use crate::chaos_operator::Operator;
use crate::chaos_rows::Census;
use crate::chaos_senders::Sent;
use crate::chaos_target::Seen;
use hookgate_kit::node::Node;

/// Examples printed of each kind of violation, and of each cause of one.
const EXAMPLES: usize = 6;
const EXAMPLES_PER_CAUSE: usize = 2;

/// How long after a replay was sent a violation of its key is blamed on it: the slowest
/// answer (7 s) and a lease (3 s), with room.
const REPLAY_SPAN: Duration = Duration::from_secs(12);

/// Everything the run collected.
pub struct Run<'a> {
    pub started: Instant,
    /// What happened when, in words.
    pub faults: &'a [String],
    /// Named spans of the run a violation may be blamed on (a fault and its aftermath).
    pub windows: &'a [(String, Instant, Instant)],
    pub sent: &'a Sent,
    pub operator: &'a Operator,
    pub census: &'a Census,
    pub judged: &'a Judged,
    pub seen: &'a [Seen],
    pub provider: &'a str,
}

impl Run<'_> {
    /// The fault a violation of `key` starting at `at` is blamed on: of the fault windows
    /// and this key's replays covering `at`, the one that began last.
    fn cause(&self, key: &str, at: Instant) -> String {
        let bare = key
            .strip_prefix(&format!("{}:", self.provider))
            .unwrap_or(key);
        let replayed = self.operator.replayed.borrow();
        let replays = replayed.get(bare).into_iter().flatten();
        let replay = replays
            .filter(|from| (**from..=**from + REPLAY_SPAN).contains(&at))
            .map(|from| ("replay of this key", *from))
            .max_by_key(|(_, from)| *from);
        let fault = self
            .windows
            .iter()
            .filter(|(_, from, to)| (*from..=*to).contains(&at))
            .map(|(name, from, _)| (name.as_str(), *from))
            .max_by_key(|(_, from)| *from);
        [replay, fault]
            .into_iter()
            .flatten()
            .max_by_key(|(_, from)| *from)
            .map_or("outside any fault", |(name, _)| name)
            .to_owned()
    }

    fn attempts_of(&self, key: &str) -> String {
        let mut of: Vec<&Seen> = self.seen.iter().filter(|s| s.key == key).collect();
        of.sort_by_key(|s| s.start);
        let shown: Vec<String> = of.iter().map(|s| show(s, self.started)).collect();
        shown.join(", ")
    }

    /// Prints the block; answers its violations.
    pub fn print(&self) -> u64 {
        let (census, judged) = (self.census, self.judged);
        let accepted = &self.sent.accepted;
        let stranded = census.stranded(accepted);
        let dead: Vec<String> = census
            .by_status
            .iter()
            .filter_map(|(s, n)| s.strip_prefix("dead:").map(|r| format!("{r}={n}")))
            .collect();
        println!("# chaos queue faults: {}", self.faults.join("; "));
        println!(
            "# sender answers: {:?}; never accepted: {}",
            self.sent.answers, self.sent.gave_up
        );
        println!("# replays: {:?}", self.operator.tally.borrow());
        println!("scenario=chaos-queue store=postgres nodes=2");
        let line = |what: &str, n: String| println!("  {what:.<38} {n}");
        line("events accepted (2xx) ", accepted.len().to_string());
        line(
            "events never accepted (sender gave up) ",
            self.sent.gave_up.to_string(),
        );
        line("done ", census.count("done").to_string());
        line(
            "dead ",
            format!("{} ({})", census.count("dead"), dead.join(", ")),
        );
        line(
            "attempts at the target ",
            format!(
                "{} (2xx {}, client hung up {})",
                judged.attempts, judged.ok, judged.hung_up
            ),
        );
        let overlaps: Vec<(String, &crate::chaos_attempts::Overlap)> = judged
            .overlaps
            .iter()
            .map(|o| (self.cause(&o.key, o.second.start), o))
            .collect();
        line(
            "attempts overlapping one of their key ",
            format!("{}   (must be 0) {}", overlaps.len(), by_cause(&overlaps)),
        );
        line(
            "keys 2xx twice, unrecordable ",
            format!(
                "{}   (excused: the first 2xx reached a node SIGKILLed or cut off from its \
                 database for longer than a lease) {}",
                judged.doubles_unrecordable.len(),
                by_cause(
                    &judged
                        .doubles_unrecordable
                        .iter()
                        .map(|(key, what)| (what.to_string(), key))
                        .collect::<Vec<_>>()
                )
            ),
        );
        let doubles: Vec<(String, &String)> = judged
            .doubles_outside
            .iter()
            .map(|k| (self.cause(k, self.double_at(k)), k))
            .collect();
        line(
            "keys 2xx more than once otherwise ",
            format!("{}   (must be 0) {}", doubles.len(), by_cause(&doubles)),
        );
        line(
            "neither done nor dead at the end ",
            format!("{}   (must be 0)", stranded.len()),
        );
        line("rows by status ", format!("{:?}", census.by_status));
        for (cause, o) in examples(&overlaps) {
            println!(
                "# overlap [{cause}] {}: {} still open when {} started",
                o.key,
                show(&o.first, self.started),
                show(&o.second, self.started)
            );
        }
        for (cause, key) in examples(&doubles) {
            println!(
                "# 2xx more than once [{cause}] {key}: {}",
                self.attempts_of(key)
            );
        }
        let replayed = self.operator.replayed.borrow();
        let mut stranded_by: BTreeMap<String, usize> = BTreeMap::new();
        for key in &stranded {
            let status = census.status_of.get(*key).map_or("no row", String::as_str);
            let label = match replayed.contains_key(*key) {
                true => format!("{status}, replayed"),
                false => status.to_owned(),
            };
            *stranded_by.entry(label).or_default() += 1;
        }
        if !stranded.is_empty() {
            println!("# stranded by status: {stranded_by:?}");
        }
        for key in stranded.iter().take(EXAMPLES) {
            let status = census.status_of.get(*key).map_or("no row", String::as_str);
            let attempts = self.attempts_of(&format!("{}:{key}", self.provider));
            println!("# stranded {key} ({status}): {attempts}");
        }
        (overlaps.len() + doubles.len() + stranded.len()) as u64
    }

    /// When `key`'s double began: the first attempt started after its first 2xx had
    /// started (the one that should not have happened), whatever it answered.
    fn double_at(&self, key: &str) -> Instant {
        let mut of: Vec<&Seen> = self.seen.iter().filter(|s| s.key == key).collect();
        of.sort_by_key(|s| s.start);
        of.iter()
            .skip_while(|s| !s.status.is_some_and(|c| (200..300).contains(&c)))
            .nth(1)
            .map_or(self.started, |s| s.start)
    }
}

/// A few of `labelled`, in order, at most [`EXAMPLES_PER_CAUSE`] of each cause.
fn examples<T>(labelled: &[(String, T)]) -> Vec<&(String, T)> {
    let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
    labelled
        .iter()
        .filter(|(cause, _)| {
            let n = shown.entry(cause).or_default();
            *n += 1;
            *n <= EXAMPLES_PER_CAUSE
        })
        .collect()
}

/// `{cause: n, …}` of violations labelled with their cause.
fn by_cause<T>(labelled: &[(String, T)]) -> String {
    if labelled.is_empty() {
        return String::new();
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (cause, _) in labelled {
        *counts.entry(cause).or_default() += 1;
    }
    format!("{counts:?}")
}

/// Prints each node's exits it did not owe the bench and its panics — both violations, as
/// no input may panic hookgate — with its log's most frequent messages.
pub fn print_nodes(nodes: &[(&Node, LogSummary)], started: Instant) -> u64 {
    let mut violations = 0;
    for (node, log) in nodes {
        let died: Vec<String> = node
            .died
            .iter()
            .map(|(at, status)| format!("{status} (noticed at {:.1}s)", secs(*at - started)))
            .collect();
        violations += (died.len() + log.panics.values().sum::<usize>()) as u64;
        let or_none = |v: String, empty: bool| if empty { "none".to_owned() } else { v };
        println!(
            "# node {}: exited by itself: {}; panics: {}",
            node.name,
            or_none(died.join(", "), died.is_empty()),
            or_none(format!("{:?}", log.panics), log.panics.is_empty()),
        );
        println!("#   log: {}", log.top(16));
        let stderr = node
            .stderr
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        let stderr: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
        for line in stderr.iter().rev().take(3).rev() {
            println!("#   stderr: {line}");
        }
        for line in &log.other {
            println!("#   not JSON: {line}");
        }
    }
    violations
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
