//! Faults put into a real store on a seeded schedule, and a journal of what happened.
//!
//! [`ChaosStore`] stands for one node's view of the store: it delegates every operation to
//! the real store it wraps, but by its own seeded random schedule a call may be delayed,
//! refused (`Unavailable`, `Transient`, `TimedOut`, `Query`), run and then reported as timed
//! out (the write landed, the caller cannot know), or held past the lease. A node killed
//! with SIGKILL is a store whose calls never reach the database any more ([`ChaosStore::kill`]).
//!
//! The [`Journal`] records every store call (when it was made, reached the database, was
//! answered, ended or was dropped), every delivery's span at the target (from its start to
//! its answer, or to the moment the runner dropped it: a hang-up), every attempt and every
//! crash, so a test can check afterwards which lease a runner could have confirmed, and
//! when. It never decides anything: it is read once the runners have stopped.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hookgate::store::{Store, StoreError, StoreFuture};

use super::wrapped::{CallOf, Hooks, Op, Read, Wrapped};

/// What the schedule does to one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Held for a while, then run.
    Delay(Duration),
    /// Not run; the caller gets this error.
    Refuse(&'static str),
    /// Run; the caller is told it timed out.
    RunThenTimeOut,
    /// Held past the lease, then run.
    Freeze(Duration),
    /// The node was killed: the call never reaches the database.
    Killed,
}

/// One store call.
#[derive(Debug, Clone)]
pub struct Call {
    pub runner: usize,
    pub op: Op,
    pub key: Option<String>,
    /// The fencing token asked with (renew, complete, fail) or won (take, claim, replay).
    pub attempts: Option<i32>,
    pub fault: Option<Fault>,
    pub issued: Instant,
    /// When the wrapped store was called.
    pub reached: Option<Instant>,
    /// When the wrapped store answered.
    pub answered: Option<Instant>,
    /// When the caller got its answer, or dropped the call.
    pub ended: Option<Instant>,
    /// A fenced write the database applied, or a take, claim or replay that won.
    pub applied: bool,
    pub said: String,
}

/// One delivery at the target.
#[derive(Debug, Clone)]
pub struct Span {
    pub runner: usize,
    pub key: String,
    pub attempts: i32,
    pub start: Instant,
    /// When it answered, or was dropped (the runner hung up).
    pub end: Option<Instant>,
    /// What the target answered (`None`: hung up on).
    pub answer: Option<String>,
    pub delivered: bool,
}

/// One attempt a runner started.
#[derive(Debug, Clone)]
pub struct AttemptNote {
    pub runner: usize,
    pub key: String,
    pub attempts: i32,
    pub queue: bool,
    pub path: &'static str,
    pub began: Instant,
    /// The lease's end by the runner's clock, as the attempt was built.
    pub lease_ends: Instant,
    /// When `Attempt::run` returned.
    pub ended: Option<Instant>,
    /// When the runner was killed while it ran (after its delivery answered).
    pub crashed: Option<Instant>,
    pub result: String,
}

#[derive(Default)]
struct Entries {
    calls: Vec<Call>,
    spans: Vec<Span>,
    attempts: Vec<AttemptNote>,
    notes: Vec<(Instant, String)>,
}

/// Everything the runners of one case did, with instants.
pub struct Journal {
    pub start: Instant,
    entries: Mutex<Entries>,
}

impl Default for Journal {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            entries: Mutex::new(Entries::default()),
        }
    }
}

impl Journal {
    fn with<T>(&self, f: impl FnOnce(&mut Entries) -> T) -> T {
        f(&mut self.entries.lock().unwrap())
    }

    pub fn calls(&self) -> Vec<Call> {
        self.with(|e| e.calls.clone())
    }

    pub fn spans(&self) -> Vec<Span> {
        self.with(|e| e.spans.clone())
    }

    pub fn attempts(&self) -> Vec<AttemptNote> {
        self.with(|e| e.attempts.clone())
    }

    /// A line for the schedule (a phase, a case's parameters).
    pub fn note(&self, text: impl Into<String>) {
        let text = text.into();
        self.with(|e| e.notes.push((Instant::now(), text)));
    }

    /// A delivery starts now; its index.
    pub fn open_span(&self, runner: usize, key: &str, attempts: i32) -> usize {
        self.with(|e| {
            e.spans.push(Span {
                runner,
                key: key.to_owned(),
                attempts,
                start: Instant::now(),
                end: None,
                answer: None,
                delivered: false,
            });
            e.spans.len() - 1
        })
    }

    /// The delivery answered (`Some`) or was dropped (`None`), unless it already ended.
    pub fn close_span(&self, index: usize, answer: Option<(String, bool)>) {
        self.with(|e| {
            let span = &mut e.spans[index];
            if span.end.is_none() {
                span.end = Some(Instant::now());
                if let Some((text, delivered)) = answer {
                    span.answer = Some(text);
                    span.delivered = delivered;
                }
            }
        });
    }

    pub fn began(&self, note: AttemptNote) -> usize {
        self.with(|e| {
            e.attempts.push(note);
            e.attempts.len() - 1
        })
    }

    pub fn ended(&self, index: usize, result: String) {
        self.with(|e| {
            let note = &mut e.attempts[index];
            note.ended = Some(Instant::now());
            note.result = result;
        });
    }

    pub fn crashed(&self, index: usize) {
        self.with(|e| {
            let note = &mut e.attempts[index];
            note.crashed = Some(Instant::now());
            note.result = "killed after the target's answer, before its outcome landed".into();
        });
    }

    fn begin_call(&self, call: Call) -> usize {
        self.with(|e| {
            e.calls.push(call);
            e.calls.len() - 1
        })
    }

    fn update(&self, index: usize, f: impl FnOnce(&mut Call)) {
        self.with(|e| f(&mut e.calls[index]));
    }

    /// Milliseconds since the case began.
    pub fn ms(&self, t: Instant) -> i64 {
        i64::try_from(t.saturating_duration_since(self.start).as_millis()).unwrap_or(i64::MAX)
    }

    /// The schedule, oldest first: notes, faulted calls, won takes, claims and replays,
    /// landed writes, deliveries and attempts.
    pub fn schedule(&self) -> String {
        let mut lines: Vec<(Instant, String)> = Vec::new();
        let ms = |t: Option<Instant>| t.map_or("-".to_owned(), |t| self.ms(t).to_string());
        self.with(|e| {
            lines.extend(e.notes.iter().cloned());
            for c in &e.calls {
                let interesting = c.fault.is_some()
                    || (c.applied && !matches!(c.op, Op::Renew | Op::Due | Op::Lookup));
                if !interesting {
                    continue;
                }
                let fault = c
                    .fault
                    .as_ref()
                    .map_or(String::new(), |f| format!(" {f:?}"));
                lines.push((
                    c.issued,
                    format!(
                        "r{} {:?} {} #{}{fault}: reached {} answered {} ended {}: {}",
                        c.runner,
                        c.op,
                        c.key.as_deref().unwrap_or("*"),
                        c.attempts.map_or("-".into(), |a| a.to_string()),
                        ms(c.reached),
                        ms(c.answered),
                        ms(c.ended),
                        c.said
                    ),
                ));
            }
            for s in &e.spans {
                lines.push((
                    s.start,
                    format!(
                        "r{} DELIVERY {} #{} until {}: {}",
                        s.runner,
                        s.key,
                        s.attempts,
                        ms(s.end),
                        s.answer.as_deref().unwrap_or("hung up")
                    ),
                ));
            }
            for a in &e.attempts {
                lines.push((
                    a.began,
                    format!(
                        "r{} ATTEMPT {} #{} ({}, {}) lease to {}, ended {}{}: {}",
                        a.runner,
                        a.key,
                        a.attempts,
                        if a.queue { "queue" } else { "sync" },
                        a.path,
                        self.ms(a.lease_ends),
                        ms(a.ended),
                        a.crashed
                            .map_or(String::new(), |t| format!(", KILLED at {}", self.ms(t))),
                        a.result
                    ),
                ));
            }
        });
        lines.sort_by_key(|(t, _)| *t);
        let mut out = String::new();
        for (t, line) in lines {
            let _ = writeln!(out, "  {:>6} ms  {line}", self.ms(t));
        }
        out
    }
}

/// How often each kind of fault strikes one runner's calls.
#[derive(Debug, Clone, Copy)]
pub struct Weather {
    /// Chance that a renewal or an outcome write is faulted; other calls half of it.
    pub rate: f64,
    /// The lease: a freeze holds a call past it.
    pub lease: Duration,
}

/// A stretch of time in which one node cannot reach the database: every call is refused
/// (`hold: false`), or held until the outage ends and then run (`hold: true`, a frozen
/// network), as a node cut off from its database would see it.
#[derive(Debug, Clone, Copy)]
pub struct Outage {
    pub from: Instant,
    pub until: Instant,
    pub hold: bool,
}

/// One node's faulty view of a real store: the store wrapped with [`Chaos`].
pub type ChaosStore = Wrapped<Chaos>;

/// The seeded schedule of one node's faults, and its journal.
pub struct Chaos {
    runner: usize,
    journal: Arc<Journal>,
    weather: Weather,
    outage: Option<Outage>,
    rng: Mutex<fastrand::Rng>,
    /// Faults are drawn only while this is set (the drain runs without them).
    on: AtomicBool,
    /// Set while the node is "killed": no call reaches the database.
    dead: AtomicBool,
}

impl Wrapped<Chaos> {
    pub fn new(
        inner: Arc<dyn Store>,
        runner: usize,
        seed: u64,
        weather: Weather,
        outage: Option<Outage>,
        journal: Arc<Journal>,
    ) -> Self {
        let chaos = Chaos {
            runner,
            journal,
            weather,
            outage,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            on: AtomicBool::new(true),
            dead: AtomicBool::new(false),
        };
        Wrapped::wrap(inner, chaos)
    }
}

impl Chaos {
    /// No more faults from now on.
    pub fn calm(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    /// The node dies: its calls from now on never reach the database (those already
    /// there may still land, as a SIGKILLed process's last statement may commit).
    pub fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    /// The node is started again.
    pub fn revive(&self) {
        self.dead.store(false, Ordering::SeqCst);
    }

    fn draw(&self, op: Op) -> Option<Fault> {
        if self.dead.load(Ordering::SeqCst) {
            return Some(Fault::Killed);
        }
        if !self.on.load(Ordering::SeqCst) || op == Op::Lookup {
            return None;
        }
        let now = Instant::now();
        if let Some(o) = self.outage.filter(|o| o.from <= now && now < o.until) {
            return Some(match o.hold {
                true => Fault::Freeze(o.until - now),
                false => Fault::Refuse("unavailable"),
            });
        }
        let mut rng = self.rng.lock().unwrap();
        let rate = match op {
            Op::Renew | Op::Complete | Op::Fail => self.weather.rate,
            _ => self.weather.rate / 2.0,
        };
        if rng.f64() >= rate {
            return None;
        }
        let lease = self.weather.lease;
        Some(match rng.u32(0..100) {
            0..=24 => Fault::Delay(Duration::from_millis(rng.u64(10..400))),
            25..=34 => Fault::Refuse("unavailable"),
            35..=44 => Fault::Refuse("transient"),
            45..=54 => Fault::Refuse("timed_out"),
            55..=64 => Fault::Refuse("query"),
            65..=84 => Fault::RunThenTimeOut,
            _ => Fault::Freeze(lease + lease.mul_f64(rng.f64() / 2.0)),
        })
    }
}

impl Hooks for Chaos {
    /// Runs the call under a drawn fault, journalled; `read` says what the answer was and
    /// whether it won or was applied (with the fencing token a take, claim or replay won).
    /// Pings pass untouched and unjournalled.
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: CallOf<'a>,
        run: impl FnOnce() -> StoreFuture<'a, T> + Send + 'a,
        read: Read<T>,
    ) -> StoreFuture<'a, T> {
        let CallOf { op, id, attempts } = call;
        if op == Op::Ping {
            return run();
        }
        let fault = self.draw(op);
        let journal = Arc::clone(&self.journal);
        let index = journal.begin_call(Call {
            runner: self.runner,
            op,
            key: id.map(|id| id.key.to_string()),
            attempts,
            fault: fault.clone(),
            issued: Instant::now(),
            reached: None,
            answered: None,
            ended: None,
            applied: false,
            said: "dropped".into(),
        });
        Box::pin(async move {
            let _ended = CallEnds(&journal, index);
            match fault {
                Some(Fault::Killed) => futures_util::future::pending::<()>().await,
                Some(Fault::Delay(d)) | Some(Fault::Freeze(d)) => tokio::time::sleep(d).await,
                Some(Fault::Refuse(kind)) => {
                    journal.update(index, |c| c.said = format!("refused: {kind}"));
                    return Err(error(kind));
                }
                Some(Fault::RunThenTimeOut) | None => {}
            }
            journal.update(index, |c| c.reached = Some(Instant::now()));
            let result = run().await;
            journal.update(index, |c| {
                c.answered = Some(Instant::now());
                match &result {
                    Ok(value) => {
                        let (said, applied, won) = read(value);
                        c.said = said;
                        c.applied = applied;
                        if won.is_some() {
                            c.attempts = won;
                        }
                    }
                    Err(e) => c.said = format!("error: {e}"),
                }
            });
            if fault == Some(Fault::RunThenTimeOut) {
                journal.update(index, |c| c.said.push_str(", told it timed out"));
                return Err(error("timed_out"));
            }
            result
        })
    }
}

/// Marks a call ended when its future finishes or is dropped.
struct CallEnds<'j>(&'j Journal, usize);

impl Drop for CallEnds<'_> {
    fn drop(&mut self) {
        self.0.update(self.1, |c| c.ended = Some(Instant::now()));
    }
}

fn error(kind: &str) -> StoreError {
    let cause = format!("injected fault ({kind})").into();
    match kind {
        "unavailable" => StoreError::Unavailable(cause),
        "transient" => StoreError::Transient(cause),
        "timed_out" => StoreError::TimedOut(cause),
        _ => StoreError::Query(cause),
    }
}
