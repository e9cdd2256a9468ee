//! The row protocol checked by random interleavings, on both stores: a seeded generator of
//! operation sequences over a few keys and several holders — sync claims, enqueues, due
//! and take, renewals, completions, failures (retryable, dead, throttled), replays, the
//! sender-gave-up pass, sweeps, holders that crash, and the store's clock moving forward —
//! each run against the real store and against a pure reference model ([`Model`]). Every
//! answer must be the model's, and after every step every row must be the model's.
//!
//! Times are whole multiples of [`TICK`], and the store's clock is moved in SQL
//! ([`TestDb::advance_clock`]), so the real time a case takes (well under a tick) can never
//! put an instant on the other side of a boundary.
//!
//! A failing case is shrunk (steps removed while it still fails) and printed with its seed;
//! `tests/api/store/model_regressions.txt` keeps every sequence that ever failed, replayed first.
//! More cases: `HOOKGATE_MODEL_CASES=100000 scripts/test.sh model` (with
//! `HOOKGATE_MODEL_SEED=N` to start from a given seed).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use actix_web::web::Bytes;
use hookgate::claim::{classify, ClaimResult, Mode, Path, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::outcome::DeadReason;
use hookgate::store::{Enqueued, Failure, Fenced, QueueRow, Retention, Store};

use crate::helpers::{Backend, TestDb};

/// The unit of time: every duration and step is a whole number of ticks, far longer than
/// a case takes to run.
const TICK: i64 = 10;
/// The lease every claim, take and replay asks for.
const LEASE: i64 = 6 * TICK;
/// A queue row's backoff after a retryable failure.
const BACKOFF: i64 = 12 * TICK;
/// A queue row's wait after a throttled try.
const THROTTLE: i64 = 3 * TICK;
const PROVIDER: &str = "m";
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const HOLDERS: usize = 3;
/// Cases in the normal suite, per store.
const CASES: u64 = 48;
/// Steps per case.
const STEPS: usize = 50;

/// The retention of a [`Op::Turn`]'s pass: a year, so no row of a case is past it, and a
/// batch of two, so a slot's keepers move in several batches.
const RING_RETENTION: Retention = Retention {
    done: Duration::from_secs(365 * 24 * 3600),
    dead: Duration::from_secs(365 * 24 * 3600),
    batch: 2,
    budget: Duration::from_secs(3600),
    interval: Duration::ZERO,
};

fn secs(n: i64) -> Duration {
    Duration::from_secs(n.unsigned_abs())
}

// ---------------------------------------------------------------------------------------
// Operations.

/// How an attempt fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailKind {
    /// Retryable: `failed`, due again after the backoff (queue).
    Retry,
    /// A dead letter (`attempts_exhausted`).
    Dead,
    /// The target asked for time: `failed`, not counted against the attempts.
    Throttle,
}

/// One step of a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Claim {
        key: usize,
        fp: Option<char>,
        holder: usize,
    },
    /// With a holder: written already taken for its first attempt, held by it.
    Enqueue {
        key: usize,
        fp: Option<char>,
        start: Option<usize>,
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
    /// case: the current slot is sealed and emptied at once, every row moving to the next
    /// slot as a keeper. Nothing may change, nothing may go.
    Turn,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fp = |fp: &Option<char>| fp.map_or("-".to_owned(), |c| c.to_string());
        match self {
            Op::Claim { key, fp: p, holder } => write!(f, "claim k{key} {} h{holder}", fp(p)),
            Op::Enqueue { key, fp: p, start } => match start {
                Some(h) => write!(f, "enqueue k{key} {} h{h}", fp(p)),
                None => write!(f, "enqueue k{key} {}", fp(p)),
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
        let words: Vec<&str> = line.split_whitespace().collect();
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
            },
            ["enqueue", k, p] => Op::Enqueue {
                key: index(k, 'k')?,
                fp: fp(p),
                start: None,
            },
            ["enqueue", k, p, h] => Op::Enqueue {
                key: index(k, 'k')?,
                fp: fp(p),
                start: Some(index(h, 'h')?),
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
fn generate(rng: &mut fastrand::Rng, steps: usize) -> Vec<Op> {
    let fp = |rng: &mut fastrand::Rng| match rng.u8(..10) {
        0..=5 => Some('a'),
        6..=7 => Some('b'),
        _ => None,
    };
    let mut model = Model::default();
    let mut ops = Vec::with_capacity(steps);
    for _ in 0..steps {
        let key = [0, 0, 0, 0, 1, 1, 1, 2, 2, 3][rng.usize(..10)];
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
            },
            14..=23 => Op::Enqueue {
                key,
                fp: fp(rng),
                start: rng.bool().then_some(holder),
            },
            24..=26 => Op::Due,
            27..=30 => Op::TakeDue,
            31..=40 => Op::Take { key, holder },
            41..=48 => Op::Renew { holder: busy },
            49..=57 => Op::Complete {
                holder: busy,
                status: [200, 201, 204][rng.usize(..3)],
            },
            58..=66 => Op::Fail {
                holder: busy,
                kind: [FailKind::Retry, FailKind::Dead, FailKind::Throttle][rng.usize(..3)],
            },
            67..=72 => Op::Replay { key, holder },
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

// ---------------------------------------------------------------------------------------
// The reference model.

/// What the model knows of one row. Times are model seconds.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    status: Status,
    mode: Mode,
    attempts: i32,
    throttles: i32,
    fingerprint: Option<char>,
    payload: bool,
    result: Option<u16>,
    dead_reason: Option<&'static str>,
    lease_end: Option<i64>,
    next_at: Option<i64>,
    updated: i64,
}

impl Row {
    fn lease_live(&self, now: i64) -> bool {
        self.status == Status::InProgress && self.lease_end.is_some_and(|end| end > now)
    }

    /// The take's rule on an existing row (and the claim's, on a sync row): `queued`,
    /// `failed`, or `in_progress` past its lease.
    fn takeable(&self, now: i64) -> bool {
        match self.status {
            Status::Queued | Status::Failed => true,
            Status::InProgress => self.lease_end.is_some_and(|end| end <= now),
            Status::Done | Status::Dead => false,
        }
    }

    fn path_of_take(&self) -> Path {
        match self.status {
            Status::Queued => Path::FirstRun,
            Status::Failed => Path::RetryAfterFailure,
            _ => Path::LeaseRetake,
        }
    }

    fn due(&self, now: i64) -> bool {
        self.mode == Mode::Queue && self.next_at.is_some_and(|at| at <= now) && self.takeable(now)
    }
}

/// The pure reference: every key's row, who holds which attempt, and the time.
#[derive(Debug, Clone, Default)]
struct Model {
    now: i64,
    rows: BTreeMap<usize, Row>,
    holders: [Option<(usize, i32)>; HOLDERS],
}

/// The model's answer to one step, compared with the store's.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// A claim won: attempts and path.
    Won(i32, Path),
    /// A claim or enqueue not won: the path a sender would get and the row's attempts.
    Existing(Path, i32),
    /// An enqueue that met a sync row: the path a sender would get and the row's attempts.
    SyncRow(Path, i32),
    /// An enqueue that wrote a new row.
    Inserted,
    /// The due keys.
    Due(BTreeSet<usize>),
    /// A take or a replay: attempts, path and (takes) tries; `None` when not taken.
    Taken(Option<(i32, Path, i32)>),
    /// A take of every due row: per key, attempts, path and tries.
    TakenMany(BTreeMap<usize, (i32, Path, i32)>),
    /// A fenced write.
    Fenced(Fenced),
    /// Rows changed by a pass.
    Count(u64),
    /// Nothing to compare (a crash, a step, a holder holding nothing).
    Nothing,
}

impl Model {
    /// Applies `op` and says what the store must answer.
    fn apply(&mut self, op: &Op) -> Answer {
        let now = self.now;
        match *op {
            Op::Claim { key, fp, holder } => match self.rows.get_mut(&key) {
                None => {
                    self.rows.insert(
                        key,
                        Row {
                            status: Status::InProgress,
                            mode: Mode::Sync,
                            attempts: 1,
                            throttles: 0,
                            fingerprint: fp,
                            payload: false,
                            result: None,
                            dead_reason: None,
                            lease_end: Some(now + LEASE),
                            next_at: None,
                            updated: now,
                        },
                    );
                    self.holders[holder] = Some((key, 1));
                    Answer::Won(1, Path::FirstRun)
                }
                Some(row) => {
                    let same = matches!((row.fingerprint, fp), (Some(a), Some(b)) if a == b)
                        || row.fingerprint.is_none()
                        || fp.is_none();
                    // A queue row is never claimed: it keeps the mode it was accepted in.
                    if row.mode == Mode::Sync && row.takeable(now) && same {
                        let path = row.path_of_take();
                        row.attempts += 1;
                        row.status = Status::InProgress;
                        row.lease_end = Some(now + LEASE);
                        row.updated = now;
                        self.holders[holder] = Some((key, row.attempts));
                        Answer::Won(row.attempts, path)
                    } else {
                        Answer::Existing(sender_path(row, fp), row.attempts)
                    }
                }
            },
            Op::Enqueue { key, fp, start } => match self.rows.get(&key) {
                Some(row) if row.mode == Mode::Sync => {
                    Answer::SyncRow(sender_path(row, fp), row.attempts)
                }
                Some(row) => Answer::Existing(sender_path(row, fp), row.attempts),
                None => {
                    let started = start.is_some();
                    self.rows.insert(
                        key,
                        Row {
                            status: if started {
                                Status::InProgress
                            } else {
                                Status::Queued
                            },
                            mode: Mode::Queue,
                            attempts: i32::from(started),
                            throttles: 0,
                            fingerprint: fp,
                            payload: true,
                            result: None,
                            dead_reason: None,
                            lease_end: started.then_some(now + LEASE),
                            next_at: Some(if started { now + LEASE } else { now }),
                            updated: now,
                        },
                    );
                    if let Some(holder) = start {
                        self.holders[holder] = Some((key, 1));
                    }
                    Answer::Inserted
                }
            },
            Op::TakeDue => {
                let due: Vec<usize> = self
                    .rows
                    .iter()
                    .filter(|(_, r)| r.due(now))
                    .map(|(k, _)| *k)
                    .collect();
                let mut taken = BTreeMap::new();
                for key in due {
                    if let Some(row) = self.rows.get_mut(&key) {
                        let path = row.path_of_take();
                        row.attempts += 1;
                        row.status = Status::InProgress;
                        row.lease_end = Some(now + LEASE);
                        row.next_at = Some(now + LEASE);
                        row.updated = now;
                        taken.insert(key, (row.attempts, path, row.attempts - row.throttles));
                        if let Some(idle) = self.holders.iter_mut().find(|h| h.is_none()) {
                            *idle = Some((key, row.attempts));
                        }
                    }
                }
                Answer::TakenMany(taken)
            }
            Op::Due => Answer::Due(
                self.rows
                    .iter()
                    .filter(|(_, r)| r.due(now))
                    .map(|(k, _)| *k)
                    .collect(),
            ),
            Op::Take { key, holder } => {
                let Some(row) = self.rows.get_mut(&key).filter(|r| r.due(now)) else {
                    return Answer::Taken(None);
                };
                let path = row.path_of_take();
                row.attempts += 1;
                row.status = Status::InProgress;
                row.lease_end = Some(now + LEASE);
                row.next_at = Some(now + LEASE);
                row.updated = now;
                self.holders[holder] = Some((key, row.attempts));
                Answer::Taken(Some((row.attempts, path, row.attempts - row.throttles)))
            }
            Op::Renew { holder } => {
                let Some(row) = self.held(holder) else {
                    return Answer::Nothing;
                };
                let row = row.map(|r| {
                    r.lease_end = Some(now + LEASE);
                    r.next_at = Some(now + LEASE);
                });
                Answer::Fenced(row)
            }
            Op::Complete { holder, status } => {
                let Some(row) = self.held(holder) else {
                    return Answer::Nothing;
                };
                // The attempt ends with its outcome write, whatever the fence said.
                let written = row.map(|r| {
                    r.status = Status::Done;
                    r.result = Some(status);
                    r.lease_end = None;
                    r.payload = false;
                    r.dead_reason = None;
                    r.updated = now;
                });
                self.holders[holder] = None;
                Answer::Fenced(written)
            }
            Op::Fail { holder, kind } => {
                let Some(row) = self.held(holder) else {
                    return Answer::Nothing;
                };
                let written = row.map(|r| {
                    r.status = if kind == FailKind::Dead {
                        Status::Dead
                    } else {
                        Status::Failed
                    };
                    r.dead_reason = (kind == FailKind::Dead).then_some("attempts_exhausted");
                    r.payload = true;
                    r.lease_end = None;
                    r.updated = now;
                    if r.mode == Mode::Queue {
                        r.next_at = Some(
                            now + if kind == FailKind::Throttle {
                                THROTTLE
                            } else {
                                BACKOFF
                            },
                        );
                    }
                    if kind == FailKind::Throttle {
                        r.throttles += 1;
                    }
                });
                self.holders[holder] = None;
                Answer::Fenced(written)
            }
            Op::Replay { key, holder } => {
                let Some(row) = self
                    .rows
                    .get_mut(&key)
                    .filter(|r| r.status == Status::Dead && r.payload)
                else {
                    return Answer::Taken(None);
                };
                row.status = Status::InProgress;
                row.attempts += 1;
                row.lease_end = Some(now + LEASE);
                row.next_at = Some(now + LEASE);
                row.updated = now;
                self.holders[holder] = Some((key, row.attempts));
                Answer::Taken(Some((row.attempts, Path::Replay, 0)))
            }
            Op::Abandon { horizon } => {
                let mut n = 0;
                for row in self.rows.values_mut() {
                    let untouched = now - row.updated >= horizon;
                    let stale = row.status == Status::Failed
                        || (row.status == Status::InProgress && !row.lease_live(now));
                    if row.mode == Mode::Sync && untouched && stale {
                        row.status = Status::Dead;
                        row.dead_reason = Some("sender_gave_up");
                        row.lease_end = None;
                        row.updated = now;
                        n += 1;
                    }
                }
                Answer::Count(n)
            }
            Op::Sweep { status, older } => {
                let before = self.rows.len();
                self.rows
                    .retain(|_, r| !(r.status == status && now - r.updated >= older));
                // No attempt outlives a swept row: retention is days (at least 72 h), an
                // attempt's life a lease and a shutdown. A holder of a swept key is gone.
                for held in &mut self.holders {
                    if held.is_some_and(|(k, _)| !self.rows.contains_key(&k)) {
                        *held = None;
                    }
                }
                Answer::Count((before - self.rows.len()) as u64)
            }
            Op::Crash { holder } => {
                self.holders[holder] = None;
                Answer::Nothing
            }
            Op::Step { by } => {
                self.now += by;
                Answer::Nothing
            }
            Op::Turn => Answer::Count(0),
        }
    }

    /// The row `holder`'s attempt is about, and whether that attempt still owns it (the
    /// fence: same attempt number, still in progress). `None` when it holds nothing.
    fn held(&mut self, holder: usize) -> Option<Held<'_>> {
        let (key, attempts) = self.holders[holder]?;
        let row = self.rows.get_mut(&key);
        Some(match row {
            Some(r) if r.attempts == attempts && r.status == Status::InProgress => Held::Owns(r),
            _ => Held::Stale,
        })
    }
}

/// A holder's attempt: it owns its row, or its fenced writes must change nothing.
enum Held<'a> {
    Owns(&'a mut Row),
    Stale,
}

impl Held<'_> {
    /// Applies a fenced write: `change` when the attempt owns the row.
    fn map(self, change: impl FnOnce(&mut Row)) -> Fenced {
        match self {
            Held::Owns(row) => {
                change(row);
                Fenced::Applied
            }
            Held::Stale => Fenced::Stale,
        }
    }
}

/// The path a sender's delivery of `fp` gets from a row it did not win.
fn sender_path(row: &Row, fp: Option<char>) -> Path {
    let state = hookgate::claim::RowState {
        status: row.status,
        attempts: row.attempts,
        fingerprint: row.fingerprint.map(String::from),
        lease_left: Duration::ZERO,
        result: None,
    };
    classify(&state, fp.map(String::from).as_deref())
}

// ---------------------------------------------------------------------------------------
// Running a sequence against a real store.

fn id(key: usize) -> EventId {
    EventId::new(PROVIDER, KEYS[key])
}

/// Runs `op` against the store; its answer in the model's terms.
async fn run(store: &dyn Store, model: &Model, op: &Op) -> Result<Answer, String> {
    let lease = secs(LEASE);
    let e = |e: hookgate::store::StoreError| e.to_string();
    Ok(match *op {
        Op::Claim { key, fp, .. } => {
            let fp = fp.map(String::from);
            match store
                .claim(&id(key), fp.as_deref(), lease, None)
                .await
                .map_err(e)?
            {
                ClaimResult::Won { attempts, path } => Answer::Won(attempts, path),
                ClaimResult::Existing(row) => {
                    Answer::Existing(classify(&row, fp.as_deref()), row.attempts)
                }
            }
        }
        Op::Enqueue { key, fp, start } => {
            let start = start.is_some();
            let fp = fp.map(String::from);
            let item = QueueRow {
                id: id(key),
                fingerprint: fp.clone(),
                payload: Bytes::from_static(b"{}"),
                content_type: Some("application/json".into()),
                headers: None,
                keep_payload: false,
                start: start.then(|| secs(LEASE)),
            };
            match store.enqueue(&item).await.map_err(e)? {
                Enqueued::Inserted => Answer::Inserted,
                Enqueued::Existing(row) => {
                    Answer::Existing(classify(&row, fp.as_deref()), row.attempts)
                }
                Enqueued::SyncRow(row) => {
                    Answer::SyncRow(classify(&row, fp.as_deref()), row.attempts)
                }
            }
        }
        Op::Due => {
            let keys = store.due(PROVIDER, 100).await.map_err(e)?;
            Answer::Due(
                keys.iter()
                    .map(|k| KEYS.iter().position(|x| **x == *k.key).unwrap_or(99))
                    .collect(),
            )
        }
        Op::TakeDue => Answer::TakenMany(
            store
                .take_due(PROVIDER, 100, lease, &[])
                .await
                .map_err(e)?
                .into_iter()
                .map(|t| {
                    let key = KEYS.iter().position(|x| **x == *t.id.key).unwrap_or(99);
                    (key, (t.attempts, t.path, t.tries))
                })
                .collect(),
        ),
        Op::Take { key, .. } => Answer::Taken(
            store
                .take(&id(key), lease)
                .await
                .map_err(e)?
                .map(|t| (t.attempts, t.path, t.tries)),
        ),
        Op::Renew { holder } => match model.holders[holder] {
            Some((key, attempts)) => {
                Answer::Fenced(store.renew(&id(key), attempts, lease).await.map_err(e)?)
            }
            None => Answer::Nothing,
        },
        Op::Complete { holder, status } => match model.holders[holder] {
            Some((key, attempts)) => {
                let result = StoredResult {
                    status,
                    content_type: Some("text/plain".into()),
                    body: format!("answer {status}").into_bytes(),
                };
                Answer::Fenced(
                    store
                        .complete(&id(key), attempts, &result, None)
                        .await
                        .map_err(e)?,
                )
            }
            None => Answer::Nothing,
        },
        Op::Fail { holder, kind } => match model.holders[holder] {
            Some((key, attempts)) => {
                // The caller knows the event's mode: a queue event's failure says when it
                // is due again, a sync one's does not (its sender redelivers).
                let queue = model.rows.get(&key).is_some_and(|r| r.mode == Mode::Queue);
                let wait = if kind == FailKind::Throttle {
                    THROTTLE
                } else {
                    BACKOFF
                };
                let failure = Failure {
                    error: format!("injected {kind:?}"),
                    dead: (kind == FailKind::Dead).then_some(DeadReason::AttemptsExhausted),
                    payload: Bytes::from_static(b"{}"),
                    content_type: Some("application/json".into()),
                    headers: None,
                    retry_in: queue.then(|| secs(wait)),
                    uncounted: kind == FailKind::Throttle,
                    history: None,
                };
                Answer::Fenced(store.fail(&id(key), attempts, &failure).await.map_err(e)?)
            }
            None => Answer::Nothing,
        },
        Op::Replay { key, .. } => Answer::Taken(
            store
                .replay(&id(key), lease)
                .await
                .map_err(e)?
                .map(|r| (r.attempts, Path::Replay, 0)),
        ),
        Op::Abandon { horizon } => Answer::Count(
            store
                .abandon(PROVIDER, secs(horizon), 1000)
                .await
                .map_err(e)?,
        ),
        Op::Sweep { status, older } => {
            Answer::Count(store.sweep(status, secs(older), 1000).await.map_err(e)?)
        }
        Op::Crash { .. } | Op::Step { .. } => Answer::Nothing,
        Op::Turn => {
            let kept = store.retain(&RING_RETENTION).await.map_err(e)?;
            Answer::Count(kept.done + kept.dead)
        }
    })
}

/// Every row as the store has it, against the model: the invariants after a step.
async fn check_rows(store: &dyn Store, model: &Model, seen: &mut [i32]) -> Result<(), String> {
    for (key, name) in KEYS.iter().enumerate() {
        let stored = store.lookup(&id(key)).await.map_err(|e| e.to_string())?;
        let expected = model.rows.get(&key);
        let (stored, expected) = match (stored, expected) {
            (None, None) => {
                seen[key] = 0;
                continue;
            }
            (Some(s), Some(e)) => (s, e),
            (s, e) => {
                return Err(format!(
                    "{name}: the store has {:?}, the model {:?}",
                    s.map(|r| r.status),
                    e.map(|r| r.status)
                ))
            }
        };
        let mut found = Vec::new();
        let mut differ = |what: &str, store: String, model: String| {
            if store != model {
                found.push(format!("{what}: store {store}, model {model}"));
            }
        };
        differ(
            "status",
            stored.status.as_str().into(),
            expected.status.as_str().into(),
        );
        differ(
            "attempts",
            stored.attempts.to_string(),
            expected.attempts.to_string(),
        );
        differ("mode", stored.mode.clone(), expected.mode.as_str().into());
        differ(
            "fingerprint",
            format!("{:?}", stored.fingerprint),
            format!("{:?}", expected.fingerprint.map(String::from)),
        );
        differ(
            "result",
            format!("{:?}", stored.result.as_ref().map(|r| r.status)),
            format!("{:?}", expected.result),
        );
        differ(
            "payload kept",
            stored.payload.is_some().to_string(),
            expected.payload.to_string(),
        );
        differ(
            "dead_reason",
            format!("{:?}", stored.dead_reason),
            format!("{:?}", expected.dead_reason),
        );
        differ(
            "lease live",
            (stored.lease_left > Duration::ZERO).to_string(),
            expected.lease_live(model.now).to_string(),
        );
        if !found.is_empty() {
            return Err(format!("{name}: {}", found.join("; ")));
        }
        if stored.attempts < seen[key] {
            return Err(format!(
                "{name}: attempts went down, {} after {}",
                stored.attempts, seen[key]
            ));
        }
        seen[key] = stored.attempts;
        // At most one holder of a key has a live lease: the latest attempt.
        let live = model
            .holders
            .iter()
            .flatten()
            .filter(|(k, a)| *k == key && *a == stored.attempts)
            .count();
        if stored.status == Status::InProgress && live > 1 {
            return Err(format!("{name}: {live} holders of one live attempt"));
        }
    }
    Ok(())
}

/// Runs `ops` on a fresh database of `backend`; the first disagreement, with the step.
async fn run_case(backend: Backend, ops: &[Op]) -> Result<(), String> {
    let db = TestDb::on(backend).await;
    let store = db.store().await;
    let mut model = Model::default();
    let mut seen = [0; KEYS.len()];
    for (n, op) in ops.iter().enumerate() {
        if matches!(op, Op::Turn) && backend == Backend::Postgres {
            // A retention period and a turn have passed for the ring (not for the rows):
            // this pass seals the current slot and, its time being up, empties it.
            db.age_ring(RING_RETENTION.done + RING_RETENTION.done / 4 + secs(TICK))
                .await;
        }
        let actual = run(&*store, &model, op)
            .await
            .map_err(|e| format!("step {n} `{op}`: the store failed: {e}"))?;
        let expected = model.apply(op);
        if let Op::Step { by } = op {
            db.advance_clock(secs(*by)).await;
        }

        if actual != expected {
            return Err(format!(
                "step {n} `{op}`: the store answered {actual:?}, the model {expected:?}"
            ));
        }
        check_rows(&*store, &model, &mut seen)
            .await
            .map_err(|e| format!("after step {n} `{op}`: {e}"))?;
    }
    drain(&db, &*store, &mut model).await
}

/// With time moving and a holder completing everything it takes, every queue row ends
/// `done` or `dead`: nothing is stranded.
async fn drain(db: &TestDb, store: &dyn Store, model: &mut Model) -> Result<(), String> {
    for _ in 0..4 {
        let step = Op::Step { by: 400 * TICK };
        model.apply(&step);
        db.advance_clock(secs(400 * TICK)).await;
        let due = store.due(PROVIDER, 100).await.map_err(|e| e.to_string())?;
        for key in due {
            let taken = store
                .take(&key, secs(LEASE))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("drain: {key} is due but cannot be taken"))?;
            let result = StoredResult {
                status: 200,
                content_type: None,
                body: Vec::new(),
            };
            store
                .complete(&key, taken.attempts, &result, None)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    for (key, name) in KEYS.iter().enumerate() {
        let Some(row) = store.lookup(&id(key)).await.map_err(|e| e.to_string())? else {
            continue;
        };
        let finished = matches!(row.status, Status::Done | Status::Dead);
        if row.mode == "queue" && !finished {
            return Err(format!(
                "drain: queue row {name} is stranded {}",
                row.status.as_str()
            ));
        }
    }
    Ok(())
}

/// Removes steps from a failing `ops` while it still fails; the smallest found.
async fn shrink(backend: Backend, mut ops: Vec<Op>, mut why: String) -> (Vec<Op>, String) {
    loop {
        let mut smaller = false;
        let mut i = 0;
        while i < ops.len() {
            let mut fewer = ops.clone();
            fewer.remove(i);
            match run_case(backend, &fewer).await {
                Err(e) => {
                    ops = fewer;
                    why = e;
                    smaller = true;
                }
                Ok(()) => i += 1,
            }
        }
        if !smaller {
            return (ops, why);
        }
    }
}

/// The sequences kept in `tests/api/store/model_regressions.txt`: blocks of steps separated by
/// blank lines, `#` comments.
fn regressions() -> Vec<(String, Vec<Op>)> {
    let text = include_str!("model_regressions.txt");
    let mut cases = Vec::new();
    let mut name = String::new();
    let mut ops = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        let line = line.trim();
        if let Some(comment) = line.strip_prefix('#') {
            if ops.is_empty() {
                name = comment.trim().to_owned();
            }
        } else if line.is_empty() {
            if !ops.is_empty() {
                cases.push((std::mem::take(&mut name), std::mem::take(&mut ops)));
            }
        } else {
            ops.push(
                line.parse()
                    .unwrap_or_else(|e| panic!("model_regressions.txt: {e}")),
            );
        }
    }
    cases
}

/// Replays the regressions, then `HOOKGATE_MODEL_CASES` (default [`CASES`]) generated
/// cases from `HOOKGATE_MODEL_SEED` (default fixed, so the normal suite is the same run
/// every time; with a case count and no seed, a random one, printed).
async fn the_store_agrees_with_the_model(backend: Backend) {
    for (name, ops) in regressions() {
        if let Err(why) = run_case(backend, &ops).await {
            panic!("regression {name:?} fails again on {backend:?}: {why}");
        }
    }
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let cases = env("HOOKGATE_MODEL_CASES").unwrap_or(CASES);
    let seed = env("HOOKGATE_MODEL_SEED").unwrap_or_else(|| {
        if env("HOOKGATE_MODEL_CASES").is_some() {
            fastrand::u64(..)
        } else {
            0x6b_6f_6f_6b
        }
    });
    eprintln!("model on {backend:?}: {cases} cases from seed {seed}");
    // `HOOKGATE_MODEL_COUNT=1`: run every case and count the failing ones instead of
    // stopping at the first (how often a generator finds a defect).
    let count = env("HOOKGATE_MODEL_COUNT").is_some();
    let mut failed = Vec::new();
    for case in 0..cases {
        let case_seed = seed.wrapping_add(case);
        let ops = generate(&mut fastrand::Rng::with_seed(case_seed), STEPS);
        let outcome = run_case(backend, &ops).await;
        if let (true, Err(why)) = (count, &outcome) {
            failed.push((case_seed, why.clone()));
            continue;
        }
        if let Err(why) = outcome {
            let (ops, why) = shrink(backend, ops, why).await;
            let steps: Vec<String> = ops.iter().map(Op::to_string).collect();
            panic!(
                "the {backend:?} store disagrees with the model (seed {case_seed}, shrunk to \
                 {} steps; add this block to tests/api/store/model_regressions.txt):\n\n# seed \
                 {case_seed}: {why}\n{}\n",
                steps.len(),
                steps.join("\n")
            );
        }
    }
    if let Some((first, why)) = failed.first() {
        panic!(
            "{} of {cases} cases failed on {backend:?}; the first, seed {first}: {why}",
            failed.len()
        );
    }
}

#[test]
fn steps_are_written_and_read_back_the_same() {
    let mut rng = fastrand::Rng::with_seed(7);
    for op in generate(&mut rng, 500) {
        assert_eq!(op.to_string().parse::<Op>(), Ok(op.clone()), "{op}");
    }
    for (name, ops) in regressions() {
        assert!(!ops.is_empty(), "{name}");
    }
}

#[test]
fn the_model_refuses_a_write_fenced_by_an_older_attempt() {
    let mut model = Model::default();
    let steps = [
        "claim k0 a h0",
        "step 60",
        "claim k0 a h1",
        "complete h0 200",
        "complete h1 201",
    ];
    let answers: Vec<Answer> = steps
        .iter()
        .map(|s| model.apply(&s.parse().unwrap()))
        .collect();
    assert_eq!(answers[2], Answer::Won(2, Path::LeaseRetake));
    assert_eq!(answers[3], Answer::Fenced(Fenced::Stale));
    assert_eq!(answers[4], Answer::Fenced(Fenced::Applied));
    assert_eq!(model.rows[&0].result, Some(201));
}

on_both_stores!(the_store_agrees_with_the_model);
