//! Reading a chaos node's JSON log afterwards: how often each message was logged, and its
//! panics (hookgate's panic hook logs `"msg":"panic"` with the message and location).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

/// A node's log, summarised.
#[derive(Debug, Default)]
pub struct LogSummary {
    /// Lines by `msg`.
    pub messages: BTreeMap<String, usize>,
    /// Panics by `message at location (thread)`.
    pub panics: BTreeMap<String, usize>,
    /// When each panic was logged (the log's `ts`, wall clock).
    pub panic_times: Vec<SystemTime>,
    /// Lines that are not JSON (a crash's last words, a start-up error).
    pub other: Vec<String>,
}

/// Reads the log at `path`; an unreadable log is an empty summary.
pub fn summarise(path: &Path) -> LogSummary {
    let mut summary = LogSummary::default();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else {
            if summary.other.len() < 5 && !line.trim().is_empty() {
                summary.other.push(line.chars().take(200).collect());
            }
            continue;
        };
        let msg = json["msg"].as_str().unwrap_or("?").to_owned();
        if msg == "panic" {
            let what = format!(
                "{} at {} ({})",
                json["message"].as_str().unwrap_or("?"),
                json["location"].as_str().unwrap_or("?"),
                json["thread"].as_str().unwrap_or("?")
            );
            *summary.panics.entry(what).or_default() += 1;
            if let Some(ts) = json["ts"].as_str() {
                summary
                    .panic_times
                    .extend(humantime::parse_rfc3339(ts).ok());
            }
        }
        *summary.messages.entry(msg).or_default() += 1;
    }
    summary
}

impl LogSummary {
    /// `msg=count` pairs, most frequent first, at most `n`.
    pub fn top(&self, n: usize) -> String {
        let mut pairs: Vec<(&String, &usize)> = self.messages.iter().collect();
        pairs.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        pairs
            .iter()
            .take(n)
            .map(|(m, c)| format!("{m}={c}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}
