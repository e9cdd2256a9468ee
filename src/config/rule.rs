//! One checked rule of a configuration and its verdict, shown with the numbers it
//! compared; the helpers the rule lists use to build them.

use std::fmt;
use std::time::Duration;

/// A rule's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The rule holds.
    Ok,
    /// Allowed, but probably not what you want.
    Warn,
    /// hookgate refuses to start.
    Fail,
}

/// One checked rule and its verdict.
#[derive(Debug, Clone)]
pub struct Rule {
    /// What was checked, naming the config keys.
    pub name: String,
    /// The numbers compared.
    pub detail: String,
    /// Whether the rule holds.
    pub verdict: Verdict,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{verdict} {}: {}", self.name, self.detail)
    }
}

pub(super) fn rule(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Rule {
    Rule {
        name: name.into(),
        verdict: if ok { Verdict::Ok } else { Verdict::Fail },
        detail: detail.into(),
    }
}

/// A rule that only warns when it does not hold.
pub(super) fn advice(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Rule {
    Rule {
        verdict: if ok { Verdict::Ok } else { Verdict::Warn },
        ..rule(name, true, detail)
    }
}

/// A duration as people write it (`1m 30s`).
pub(super) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
