//! The model check's steps: the operations a sequence is made of, written and read back as
//! text (as `model_regressions.txt` keeps them), and the seeded generator of sequences.

use std::fmt;
use std::str::FromStr;

use hookgate::claim::Status;

use super::reference::Model;
use super::{HOLDERS, KEYS, TICK};

/// How an attempt fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailKind {
    /// Retryable: `failed`, due again after the backoff (queue).
    Retry,
    /// A dead letter (`attempts_exhausted`).
    Dead,
    /// The target asked for time: `failed`, not counted against the attempts.
    Throttle,
}

/// One step of a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Op {
    /// `routed`: the event has one other route, whose row (the key's row in [`ROUTE`](
    /// super::ROUTE)) a claim that writes the key's row writes too. `filtered`: the main
    /// route's filter refused the delivery — a new row is claimed `filtered`.
    Claim {
        key: usize,
        fp: Option<char>,
        holder: usize,
        routed: bool,
        filtered: bool,
    },
    /// With a holder: written already taken for its first attempt, held by it. `routed`:
    /// a new row writes the key's row in the other route too.
    Enqueue {
        key: usize,
        fp: Option<char>,
        start: Option<usize>,
        routed: bool,
    },
    Due,
    /// Takes every due row at once; each goes to a holder with none, in key order (a row
    /// beyond the idle holders is taken by nobody, as if its taker crashed).
    TakeDue,
    Take {
        key: usize,
        holder: usize,
    },
    Renew {
        holder: usize,
    },
    Complete {
        holder: usize,
        status: u16,
    },
    Fail {
        holder: usize,
        kind: FailKind,
    },
    Replay {
        key: usize,
        holder: usize,
    },
    Abandon {
        horizon: i64,
    },
    Sweep {
        status: Status,
        older: i64,
    },
    Crash {
        holder: usize,
    },
    Step {
        by: i64,
    },
    /// The Postgres ring turns and empties (its clock, not the rows', moved a retention
    /// period and a turn ahead) in a retention pass with a retention far longer than any
    /// case: the current slot is sealed and emptied at once, every row of it moving to the
    /// keep slot as a keeper (where the rows of earlier turns stay, never moved again).
    /// Nothing may change, nothing may go.
    Turn,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fp = |fp: &Option<char>| fp.map_or("-".to_owned(), |c| c.to_string());
        let routed = |routed: &bool| if *routed { " +r" } else { "" };
        match self {
            Op::Claim {
                key,
                fp: p,
                holder,
                routed: r,
                filtered,
            } => {
                let filtered = if *filtered { " +f" } else { "" };
                write!(f, "claim k{key} {} h{holder}{filtered}{}", fp(p), routed(r))
            }
            Op::Enqueue {
                key,
                fp: p,
                start,
                routed: r,
            } => match start {
                Some(h) => write!(f, "enqueue k{key} {} h{h}{}", fp(p), routed(r)),
                None => write!(f, "enqueue k{key} {}{}", fp(p), routed(r)),
            },
            Op::Due => write!(f, "due"),
            Op::TakeDue => write!(f, "takedue"),
            Op::Take { key, holder } => write!(f, "take k{key} h{holder}"),
            Op::Renew { holder } => write!(f, "renew h{holder}"),
            Op::Complete { holder, status } => write!(f, "complete h{holder} {status}"),
            Op::Fail { holder, kind } => {
                let kind = match kind {
                    FailKind::Retry => "retry",
                    FailKind::Dead => "dead",
                    FailKind::Throttle => "throttle",
                };
                write!(f, "fail h{holder} {kind}")
            }
            Op::Replay { key, holder } => write!(f, "replay k{key} h{holder}"),
            Op::Abandon { horizon } => write!(f, "abandon {horizon}"),
            Op::Sweep { status, older } => write!(f, "sweep {} {older}", status.as_str()),
            Op::Crash { holder } => write!(f, "crash h{holder}"),
            Op::Step { by } => write!(f, "step {by}"),
            Op::Turn => write!(f, "turn"),
        }
    }
}

impl FromStr for Op {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let mut words: Vec<&str> = line.split_whitespace().collect();
        let routed = words.last() == Some(&"+r");
        if routed {
            words.pop();
        }
        let filtered = words.last() == Some(&"+f");
        if filtered {
            words.pop();
        }
        let index = |w: &str, prefix: char| -> Result<usize, String> {
            w.strip_prefix(prefix)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("{w:?} in {line:?}"))
        };
        let number = |w: &str| -> Result<i64, String> {
            w.parse().map_err(|_| format!("{w:?} in {line:?}"))
        };
        let fp = |w: &str| if w == "-" { None } else { w.chars().next() };
        Ok(match words.as_slice() {
            ["claim", k, p, h] => Op::Claim {
                key: index(k, 'k')?,
                fp: fp(p),
                holder: index(h, 'h')?,
                routed,
                filtered,
            },
            ["enqueue", k, p] => Op::Enqueue {
                key: index(k, 'k')?,
                fp: fp(p),
                start: None,
                routed,
            },
            ["enqueue", k, p, h] => Op::Enqueue {
                key: index(k, 'k')?,
                fp: fp(p),
                start: Some(index(h, 'h')?),
                routed,
            },
            ["due"] => Op::Due,
            ["takedue"] => Op::TakeDue,
            ["take", k, h] => Op::Take {
                key: index(k, 'k')?,
                holder: index(h, 'h')?,
            },
            ["renew", h] => Op::Renew {
                holder: index(h, 'h')?,
            },
            ["complete", h, s] => Op::Complete {
                holder: index(h, 'h')?,
                status: u16::try_from(number(s)?).map_err(|e| e.to_string())?,
            },
            ["fail", h, kind] => Op::Fail {
                holder: index(h, 'h')?,
                kind: match *kind {
                    "retry" => FailKind::Retry,
                    "dead" => FailKind::Dead,
                    "throttle" => FailKind::Throttle,
                    other => return Err(format!("fail kind {other:?}")),
                },
            },
            ["replay", k, h] => Op::Replay {
                key: index(k, 'k')?,
                holder: index(h, 'h')?,
            },
            ["abandon", n] => Op::Abandon {
                horizon: number(n)?,
            },
            ["sweep", s, n] => Op::Sweep {
                status: Status::parse(s).ok_or_else(|| format!("status {s:?}"))?,
                older: number(n)?,
            },
            ["crash", h] => Op::Crash {
                holder: index(h, 'h')?,
            },
            ["step", n] => Op::Step { by: number(n)? },
            ["turn"] => Op::Turn,
            _ => return Err(format!("not a step: {line:?}")),
        })
    }
}

/// A random sequence of `steps` steps from `rng`. It is generated against the model, so
/// that a step about a holder's attempt picks a holder that holds one (most of the time)
/// and keys are picked unevenly: contention on one key is where defects live.
pub(super) fn generate(rng: &mut fastrand::Rng, steps: usize) -> Vec<Op> {
    let fp = |rng: &mut fastrand::Rng| match rng.u8(..10) {
        0..=5 => Some('a'),
        6..=7 => Some('b'),
        _ => None,
    };
    let mut model = Model::default();
    let mut ops = Vec::with_capacity(steps);
    for _ in 0..steps {
        let key = [0, 0, 0, 0, 1, 1, 1, 2, 2, 3][rng.usize(..10)];
        // `k0` and `k1` often have another route; steps on a row may pick its route's row.
        let routed = key < 2 && rng.u8(..10) < 5;
        let row = if key < 2 && rng.u8(..10) < 3 {
            key + KEYS.len()
        } else {
            key
        };
        let holder = rng.usize(..HOLDERS);
        let holding: Vec<usize> = (0..HOLDERS)
            .filter(|h| model.holders[*h].is_some())
            .collect();
        let busy = if !holding.is_empty() && rng.u8(..10) < 8 {
            holding[rng.usize(..holding.len())]
        } else {
            holder
        };
        // A new attempt goes to a holder with none, mostly, so the old one lives on to
        // write late (a stale write is only tested by a holder that kept its attempt).
        let idle: Vec<usize> = (0..HOLDERS)
            .filter(|h| model.holders[*h].is_none())
            .collect();
        let holder = if !idle.is_empty() && rng.u8(..10) < 8 {
            idle[rng.usize(..idle.len())]
        } else {
            holder
        };
        let op = match rng.u32(..100) {
            0..=13 => Op::Claim {
                key,
                fp: fp(rng),
                holder,
                routed,
                filtered: rng.u8(..10) < 2,
            },
            14..=23 => Op::Enqueue {
                key,
                fp: fp(rng),
                start: rng.bool().then_some(holder),
                routed,
            },
            24..=26 => Op::Due,
            27..=30 => Op::TakeDue,
            31..=40 => Op::Take { key: row, holder },
            41..=48 => Op::Renew { holder: busy },
            49..=57 => Op::Complete {
                holder: busy,
                status: [200, 201, 204][rng.usize(..3)],
            },
            58..=66 => Op::Fail {
                holder: busy,
                kind: [FailKind::Retry, FailKind::Dead, FailKind::Throttle][rng.usize(..3)],
            },
            67..=72 => Op::Replay { key: row, holder },
            73..=75 => Op::Abandon {
                horizon: [3, 6, 30, 60][rng.usize(..4)] * TICK,
            },
            76..=78 => Op::Sweep {
                status: if rng.bool() {
                    Status::Done
                } else {
                    Status::Dead
                },
                older: [6, 60, 360][rng.usize(..3)] * TICK,
            },
            79..=81 => Op::Crash { holder },
            82..=85 => Op::Turn,
            _ => Op::Step {
                by: [1, 3, 5, 6, 7, 12, 13, 30, 61, 400][rng.usize(..10)] * TICK,
            },
        };
        model.apply(&op);
        ops.push(op);
    }
    ops
}
