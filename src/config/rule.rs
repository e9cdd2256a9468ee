//! One checked rule of a configuration and its status, shown with the numbers it
//! compared; the helpers the rule lists use to build them.

use std::fmt;
use std::time::Duration;

/// Whether a rule holds: ok, a warning, or a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleStatus {
    /// The rule holds.
    Ok,
    /// Allowed, but probably not what you want.
    Warn,
    /// hookgate refuses to start.
    Fail,
}

/// One checked rule and its status.
#[derive(Debug, Clone)]
pub struct Rule {
    /// What was checked, naming the config keys.
    pub name: String,
    /// The numbers compared.
    pub detail: String,
    /// Whether the rule holds.
    pub status: RuleStatus,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            RuleStatus::Ok => "ok  ",
            RuleStatus::Warn => "WARN",
            RuleStatus::Fail => "FAIL",
        };
        write!(f, "{status} {}: {}", self.name, self.detail)
    }
}

pub(super) fn rule(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Rule {
    Rule {
        name: name.into(),
        status: if ok { RuleStatus::Ok } else { RuleStatus::Fail },
        detail: detail.into(),
    }
}

/// A rule that only warns when it does not hold.
pub(super) fn advice(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Rule {
    Rule {
        status: if ok { RuleStatus::Ok } else { RuleStatus::Warn },
        ..rule(name, true, detail)
    }
}

/// A duration as people write it (`1m 30s`).
pub(super) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
