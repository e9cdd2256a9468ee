//! The pure reference model of the row protocol: what every step must answer and what
//! every row must hold after it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hookgate::claim::{classify, Mode, Path, Status};
use hookgate::store::Fenced;

use super::ops::{FailKind, Op};
use super::{BACKOFF, HOLDERS, KEYS, LEASE, THROTTLE};

/// What the model knows of one row. Times are model seconds.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Row {
    pub(super) status: Status,
    pub(super) mode: Mode,
    pub(super) attempts: i32,
    pub(super) throttles: i32,
    pub(super) fingerprint: Option<char>,
    pub(super) payload: bool,
    pub(super) result: Option<u16>,
    pub(super) dead_reason: Option<&'static str>,
    pub(super) lease_end: Option<i64>,
    pub(super) next_at: Option<i64>,
    pub(super) updated: i64,
    /// The row's path is `filtered` (claimed so, and not reopened since): a retake of it is
    /// filtered again.
    pub(super) filtered: bool,
}

impl Row {
    pub(super) fn lease_live(&self, now: i64) -> bool {
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
pub(super) struct Model {
    pub(super) now: i64,
    pub(super) rows: BTreeMap<usize, Row>,
    pub(super) holders: [Option<(usize, i32)>; HOLDERS],
}

/// The model's answer to one step, compared with the store's.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Answer {
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
    /// Applies `op` and says what the store must answer. A routed claim that writes the
    /// key's row (won at attempt 1), or a routed enqueue that writes its row, writes the
    /// key's row in the other route too (queued, due now) unless it exists; a won retry or
    /// retake writes none.
    pub(super) fn apply(&mut self, op: &Op) -> Answer {
        let answer = self.apply_one(op);
        let routed = match *op {
            Op::Claim {
                key,
                fp,
                routed: true,
                ..
            } if matches!(answer, Answer::Won(1, _)) => Some((key, fp)),
            Op::Enqueue {
                key,
                fp,
                routed: true,
                ..
            } if answer == Answer::Inserted => Some((key, fp)),
            _ => None,
        };
        if let Some((key, fp)) = routed {
            let now = self.now;
            self.rows.entry(key + KEYS.len()).or_insert(Row {
                status: Status::Queued,
                mode: Mode::Queue,
                attempts: 0,
                throttles: 0,
                fingerprint: fp,
                payload: true,
                result: None,
                dead_reason: None,
                lease_end: None,
                next_at: Some(now),
                updated: now,
                filtered: false,
            });
        }
        answer
    }

    fn apply_one(&mut self, op: &Op) -> Answer {
        let now = self.now;
        match *op {
            Op::Claim {
                key,
                fp,
                holder,
                filtered,
                ..
            } => match self.rows.get_mut(&key) {
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
                            filtered,
                        },
                    );
                    self.holders[holder] = Some((key, 1));
                    let path = if filtered {
                        Path::Filtered
                    } else {
                        Path::FirstRun
                    };
                    Answer::Won(1, path)
                }
                Some(row) => {
                    let same = matches!((row.fingerprint, fp), (Some(a), Some(b)) if a == b)
                        || row.fingerprint.is_none()
                        || fp.is_none();
                    // A queue row is never claimed: it keeps the mode it was accepted in.
                    if row.mode == Mode::Sync && row.takeable(now) && same {
                        let path = if row.filtered {
                            Path::Filtered
                        } else {
                            row.path_of_take()
                        };
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
            Op::Enqueue { key, fp, start, .. } => match self.rows.get(&key) {
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
                            filtered: false,
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
                row.filtered = false;
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
        mode: row.mode,
        attempts: row.attempts,
        fingerprint: row.fingerprint.map(String::from),
        lease_left: Duration::ZERO,
        result: None,
    };
    classify(&state, fp.map(String::from).as_deref())
}
