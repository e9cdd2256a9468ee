//! The scenarios: which key each request carries.

use std::time::Duration;

/// A load shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Every request a new key: `first_run`.
    Unique,
    /// A small set of keys delivered before the run: `duplicate_done`.
    Duplicate,
    /// Four requests in five new, one a repeat of one of the sender's recent keys.
    Mixed,
    /// All connections on the same four brand-new keys, renewed every 50 ms.
    Hot,
    /// `Hot`, with the target failing 20 % of deliveries.
    HotFail,
    /// New keys, the target adding 50 ms.
    SlowTarget,
    /// `SlowTarget` with four times the connections the node's workers can serve: the
    /// excess must be refused (503 `overloaded`), answers stay bounded, and no attempt
    /// starts after its lease.
    Overload,
    /// No hookgate: a bare actix-web handler returning a fixed body (the reference).
    Bare,
}

/// Keys the `duplicate` scenario repeats (delivered once before the run).
pub const DUPLICATE_KEYS: u64 = 100;

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Scenario::Unique,
        Scenario::Duplicate,
        Scenario::Mixed,
        Scenario::Hot,
        Scenario::HotFail,
        Scenario::SlowTarget,
        Scenario::Overload,
    ];

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain([Scenario::Bare])
            .find(|s| s.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Unique => "unique",
            Scenario::Duplicate => "duplicate",
            Scenario::Mixed => "mixed",
            Scenario::Hot => "hot",
            Scenario::HotFail => "hot_fail",
            Scenario::SlowTarget => "slow_target",
            Scenario::Overload => "overload",
            Scenario::Bare => "bare",
        }
    }

    /// The key of request `i` of connection `conn`, `elapsed` into the run.
    pub fn key(self, conn: usize, i: u64, elapsed: Duration) -> String {
        match self {
            Scenario::Unique | Scenario::SlowTarget | Scenario::Overload | Scenario::Bare => {
                format!("u{conn}-{i}")
            }
            Scenario::Duplicate => format!("dup-{}", (conn as u64 + i) % DUPLICATE_KEYS),
            Scenario::Mixed if i % 5 == 4 && i >= 5 => {
                format!("m{conn}-{}", i - 1 - fastrand::u64(0..4))
            }
            Scenario::Mixed => format!("m{conn}-{i}"),
            Scenario::Hot | Scenario::HotFail => {
                format!("hot-{}-{}", elapsed.as_millis() / 50, fastrand::u8(0..4))
            }
        }
    }
}
