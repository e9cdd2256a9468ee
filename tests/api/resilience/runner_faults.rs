//! A seeded random generator that drives the attempt runner (`Attempt::run`, the one home
//! of an attempt) under injected faults, on both stores. In each case two or three
//! *runners* — as two or three nodes would — contend for two to four keys: they take due
//! queue rows (`due` + `take`), claim sync keys (`claim`) and replay dead letters
//! (`replay`), and run every attempt they win as the shard and the command line do,
//! against a scripted target (2xx, 5xx, 429 with `Retry-After`, 400, sometimes slower
//! than the lease) and through a [`ChaosStore`] that delays, refuses, half-runs or freezes
//! their calls on a seeded schedule. Some runners are killed between the target's 2xx and
//! the recorded outcome (a SIGKILL's effect). Then the faults stop, the rows are made due
//! by hand and drained, and the journal is checked:
//!
//! 1. no two deliveries of one key overlap in time, and no fencing token is delivered
//!    twice;
//! 2. a key the target answered 2xx is not delivered again — unless its runner was killed
//!    between that answer and its recorded outcome, or the store refused or held every
//!    call that would have kept the attempt's lease (its renewals; in sync mode its
//!    outcome write, which is tried until the lease ends) from the answer until another
//!    attempt took the row: to the other nodes, a node cut off from the database for
//!    longer than a lease is a dead one;
//! 3. every row ends done or dead, and a done row holds the 2xx answer of the attempt
//!    that owns it (the target names the attempt in its body), never a stale one's.
//!
//! `HOOKGATE_FAULT_CASES=N` runs N cases per store instead of [`CASES`];
//! `HOOKGATE_FAULT_SEED=S` runs the case of seed S alone. A failing case prints its seed
//! and its schedule (faults, takes, deliveries, attempts). A seed fixes every runner's
//! draws, not the interleaving of their calls, so a replay is close, not identical.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use futures_util::StreamExt;
use hookgate::claim::{ClaimResult, Mode, StoredResult};
use hookgate::deadline::after;
use hookgate::key::EventId;
use hookgate::outcome::{DeliveryOutcome, Verdict};
use hookgate::provider::Target;
use hookgate::retry::RetryPolicy;
use hookgate::shard::{replay_attempt, Attempt, Event, Recorded};
use hookgate::store::{Fenced, QueueRow, Store, Taken};
use hookgate::worker::DeliveryRequest;
use tokio::sync::Notify;

use crate::helpers::{
    AttemptNote, Backend, Call, ChaosStore, Journal, Op, Outage, Span, TestDb, Weather, PROVIDER,
};

/// Cases per store in the normal suite: about two seconds each (three at a time), the
/// two stores at once.
const CASES: u64 = 12;

/// Cases run at once: a case mostly waits (on leases, deliveries, faults), so three at a
/// time cost little CPU and cut the suite's wall time by about as much.
const PARALLEL: usize = 3;

/// The lease. A delivery whose lease cannot be confirmed is dropped a margin before the
/// lease ends (a tenth of it, at most 1 s: 200 ms here), and that margin is the only slack
/// between a hung-up delivery and another runner's retake that the check allows. The
/// runners share one thread, so a hang-up is late by that thread's scheduling delay; 200
/// ms is far above what a loaded 2-core machine shows, while a lease of 2 s keeps a case
/// short enough to run many.
const LEASE: Duration = Duration::from_secs(2);

/// A sync target's timeout: shorter than the lease, as the config rules demand.
const SYNC_TIMEOUT: Duration = Duration::from_secs(1);

/// A queue target's timeout: longer than the lease, so long deliveries live on renewals.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the runners contend under faults before the drain.
const CHAOS: Duration = Duration::from_secs(4);

/// Longest pause between tries of an outcome write (`record.rs`'s `MAX_RETRY`).
const WRITE_PAUSE: Duration = Duration::from_secs(1);

/// How long a phase (runners finishing, the drain) may take before the case fails.
const PHASE_LIMIT: Duration = Duration::from_secs(40);

/// Replays per case: enough to meet the other faults, few enough for the case to end.
const REPLAYS: u32 = 8;

fn margin() -> Duration {
    (LEASE / 10).min(Duration::from_secs(1))
}

/// What the scripted target does with one delivery.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Ok,
    Status(u16),
    Throttle(u64),
}

#[derive(Debug, Clone, Copy)]
struct Script {
    delay: Duration,
    reply: Reply,
}

impl Script {
    /// Under faults: mostly quick answers, sometimes slower than the lease; every kind of
    /// answer. While draining: quick, no throttling.
    fn draw(rng: &mut fastrand::Rng, chaos: bool) -> Self {
        if !chaos {
            let reply = match rng.u32(0..100) {
                0..=69 => Reply::Ok,
                70..=89 => Reply::Status(500),
                _ => Reply::Status(400),
            };
            let delay = Duration::from_millis(rng.u64(0..50));
            return Self { delay, reply };
        }
        let delay = if rng.u32(0..100) < 40 {
            LEASE.mul_f64(0.5 + rng.f64() * 2.0)
        } else {
            Duration::from_millis(rng.u64(0..150))
        };
        let reply = match rng.u32(0..100) {
            0..=34 => Reply::Ok,
            35..=64 => Reply::Status(500),
            65..=84 => Reply::Throttle(1),
            _ => Reply::Status(400),
        };
        Self { delay, reply }
    }

    /// The outcome for attempt `attempt`; a 2xx names the attempt in its body, so a done
    /// row shows whose answer it holds.
    fn outcome(self, attempt: i32) -> (DeliveryOutcome, String, bool) {
        match self.reply {
            Reply::Ok => (
                DeliveryOutcome::Delivered {
                    result: StoredResult {
                        status: 200,
                        content_type: Some("application/json".into()),
                        body: answer_body(attempt).into_bytes(),
                    },
                    excerpt: Some(answer_body(attempt)),
                },
                "200".into(),
                true,
            ),
            Reply::Status(status) => (
                DeliveryOutcome::Refused {
                    status,
                    retry_after: None,
                    excerpt: None,
                },
                status.to_string(),
                false,
            ),
            Reply::Throttle(secs) => (
                DeliveryOutcome::Refused {
                    status: 429,
                    retry_after: Some(secs),
                    excerpt: None,
                },
                format!("429 Retry-After: {secs}"),
                false,
            ),
        }
    }
}

fn answer_body(attempt: i32) -> String {
    format!(r#"{{"attempt":{attempt}}}"#)
}

/// Closes a delivery's span when its future is dropped before it answered: the runner hung
/// up on the target.
struct HangUp<'j>(&'j Journal, usize);

impl Drop for HangUp<'_> {
    fn drop(&mut self) {
        self.0.close_span(self.1, None);
    }
}

/// The scripted target: refuses to start past `start_by` (as a worker does), records the
/// delivery's span and answers as scripted; after a 2xx it kills the runner if asked to.
async fn deliver(
    journal: &Journal,
    runner: usize,
    key: &str,
    request: DeliveryRequest,
    start_by: Option<Instant>,
    script: Script,
    kill: Option<(&ChaosStore, &Notify)>,
) -> DeliveryOutcome {
    if start_by.is_some_and(|by| Instant::now() > by) {
        return DeliveryOutcome::NotStarted("the lease no longer covers the timeout".into());
    }
    let span = journal.open_span(runner, key, request.attempt);
    let _hang_up = HangUp(journal, span);
    if script.delay > request.timeout {
        tokio::time::sleep(request.timeout).await;
        journal.close_span(span, Some(("timed out".into(), false)));
        return DeliveryOutcome::Unreachable("timed out".into());
    }
    tokio::time::sleep(script.delay).await;
    let (outcome, said, delivered) = script.outcome(request.attempt);
    journal.close_span(span, Some((said, delivered)));
    if let (true, Some((store, killed))) = (delivered, kill) {
        store.kill();
        killed.notify_one();
    }
    outcome
}

/// One case's parameters and what its runners share.
struct Case {
    seed: u64,
    backend: Backend,
    /// Key names, and whether each is a queue key (else sync).
    keys: Vec<(String, bool)>,
    weather: Weather,
    crash_percent: u32,
    policy: RetryPolicy,
    journal: Arc<Journal>,
    queue_target: Arc<Target>,
    sync_target: Arc<Target>,
    chaos: Cell<bool>,
    replays_left: Cell<u32>,
    log: slog::Logger,
}

struct Runner {
    index: usize,
    store: Arc<ChaosStore>,
    rng: fastrand::Rng,
}

fn target(timeout: Duration) -> Arc<Target> {
    Arc::new(Target {
        url: "http://target.invalid/".into(),
        timeout,
        keep_headers: Vec::new(),
        signing_key: None,
        tls: None,
        horizon: Duration::from_secs(3600),
        keep_payload: false,
    })
}

impl Case {
    fn new(backend: Backend, seed: u64) -> (Self, usize) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let n = rng.usize(2..=4);
        let mut keys: Vec<(String, bool)> = (0..n)
            .map(|i| (format!("k{i}"), rng.u32(0..100) < 70))
            .collect();
        keys[0].1 = true;
        let runners = rng.usize(2..=3);
        let case = Self {
            seed,
            backend,
            keys,
            weather: Weather {
                rate: 0.1 + rng.f64() * 0.35,
                lease: LEASE,
            },
            crash_percent: rng.u32(0..=35),
            policy: RetryPolicy::new(Duration::from_secs(1), 1.0, Duration::from_secs(2), 0.0, 4),
            journal: Arc::new(Journal::default()),
            queue_target: target(QUEUE_TIMEOUT),
            sync_target: target(SYNC_TIMEOUT),
            chaos: Cell::new(true),
            replays_left: Cell::new(REPLAYS),
            log: hookgate::logging::discard(),
        };
        (case, runners)
    }

    fn describe(&self, runners: usize) -> String {
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|(k, q)| format!("{k} {}", if *q { "queue" } else { "sync" }))
            .collect();
        format!(
            "{:?}, seed {}: keys [{}], {runners} runners, fault rate {:.2}, kills after {} % \
             of 2xx, lease {} ms",
            self.backend,
            self.seed,
            keys.join(", "),
            self.weather.rate,
            self.crash_percent,
            LEASE.as_millis()
        )
    }

    /// A runner's outage, if it has one (four runners in five): somewhere in the contention, between 0.6 and 1.6
    /// leases long, its calls refused or held throughout.
    fn outage(&self, rng: &mut fastrand::Rng) -> Option<Outage> {
        if rng.u32(0..100) >= 80 {
            return None;
        }
        let from = self.journal.start + CHAOS.mul_f64(rng.f64() * 0.9);
        let until = from + LEASE.mul_f64(0.6 + rng.f64());
        let hold = rng.bool();
        let ms = |t: Instant| self.journal.ms(t);
        let kind = if hold { "held" } else { "refused" };
        self.journal.note(format!(
            "outage planned: {} .. {} ms, calls {kind}",
            ms(from),
            ms(until)
        ));
        Some(Outage { from, until, hold })
    }

    fn event(&self, id: EventId, body: Bytes, content_type: Option<String>, mode: Mode) -> Event {
        let target = match mode {
            Mode::Queue => &self.queue_target,
            Mode::Sync => &self.sync_target,
        };
        Event {
            id,
            body,
            content_type,
            fingerprint: None,
            target: Arc::clone(target),
            headers: Default::default(),
            mode,
        }
    }

    /// One action of a runner: take a due queue row, claim a sync key, or replay a key
    /// that may be a dead letter (while faults last).
    async fn step(&self, r: &mut Runner) {
        let roll = r.rng.u32(0..100);
        let sync: Vec<&String> = self.keys.iter().filter(|k| !k.1).map(|k| &k.0).collect();
        if roll >= 75 && self.chaos.get() && self.replays_left.get() > 0 {
            let key = self.keys[r.rng.usize(..self.keys.len())].0.clone();
            self.replay(r, &key).await;
        } else if roll >= 60 && !sync.is_empty() {
            let key = sync[r.rng.usize(..sync.len())].clone();
            self.claim(r, &key).await;
        } else if r.rng.bool() {
            // As a node's scheduler takes rows: the due ones, in one statement.
            let sent = Instant::now();
            let Ok(taken) = r.store.take_due(PROVIDER, 1, LEASE, &[]).await else {
                return;
            };
            if let Some(taken) = taken.into_iter().next() {
                self.run_taken(r, taken, sent).await;
            }
        } else {
            let Ok(due) = r.store.due(PROVIDER, 10).await else {
                return;
            };
            if !due.is_empty() {
                let id = due[r.rng.usize(..due.len())].clone();
                self.take(r, id).await;
            }
        }
    }

    /// Takes a due queue row and runs its attempt, as a shard's `answer_take` builds it.
    async fn take(&self, r: &mut Runner, id: EventId) {
        let sent = Instant::now();
        let Ok(Some(taken)) = r.store.take(&id, LEASE).await else {
            return;
        };
        self.run_taken(r, taken, sent).await;
    }

    /// Runs the attempt of a taken row, as a shard builds it.
    async fn run_taken(&self, r: &mut Runner, taken: Taken, sent: Instant) {
        let event = self.event(taken.id, taken.payload, taken.content_type, Mode::Queue);
        let horizon_left = event.target.horizon.saturating_sub(taken.age);
        let attempt = Attempt::held(
            Arc::new(event),
            taken.attempts,
            taken.path,
            after(sent, LEASE),
        )
        .renewed(LEASE, taken.tries, horizon_left);
        self.run(r, attempt, true).await;
    }

    /// Claims a sync key (a sender's delivery) and runs its attempt if won.
    async fn claim(&self, r: &mut Runner, key: &str) {
        let id = EventId::new(PROVIDER, key);
        let sent = Instant::now();
        let Ok(ClaimResult::Won { attempts, path }) = r.store.claim(&id, None, LEASE, None).await
        else {
            return;
        };
        let body = Bytes::from(format!(r#"{{"id":"{key}"}}"#));
        let event = self.event(id, body, Some("application/json".into()), Mode::Sync);
        let attempt = Attempt::held(Arc::new(event), attempts, path, after(sent, LEASE));
        self.run(r, attempt, true).await;
    }

    /// Replays a key if it is a dead letter: half the time as the command line does (no
    /// worker, so no late-start check), half as the admin API does (through a worker).
    async fn replay(&self, r: &mut Runner, key: &str) {
        let id = EventId::new(PROVIDER, key);
        let sent = Instant::now();
        let Ok(Some(row)) = r.store.replay(&id, LEASE).await else {
            return;
        };
        self.replays_left
            .set(self.replays_left.get().saturating_sub(1));
        let event = self.event(id, row.payload, row.content_type, row.mode);
        let attempt = replay_attempt(Arc::new(event), row.attempts, sent, LEASE);
        let through_a_worker = r.rng.bool();
        self.run(r, attempt, through_a_worker).await;
    }

    /// Runs one won attempt through `Attempt::run` with a scripted delivery; kills the
    /// runner after the target's 2xx when the dice say so.
    async fn run(&self, r: &mut Runner, attempt: Attempt, through_a_worker: bool) {
        let chaos = self.chaos.get();
        let script = Script::draw(&mut r.rng, chaos);
        let kill =
            chaos && matches!(script.reply, Reply::Ok) && r.rng.u32(0..100) < self.crash_percent;
        let restart = Duration::from_millis(r.rng.u64(0..300));
        let note = self.journal.began(AttemptNote {
            runner: r.index,
            key: attempt.event.id.key.to_string(),
            attempts: attempt.attempts,
            queue: attempt.renew.is_some(),
            path: attempt.path.as_str(),
            began: Instant::now(),
            lease_ends: attempt.lease_ends,
            ended: None,
            crashed: None,
            result: "running".into(),
        });
        let killed = Notify::new();
        let delivery = deliver(
            &self.journal,
            r.index,
            &attempt.event.id.key,
            attempt.request(),
            through_a_worker.then(|| attempt.start_by()),
            script,
            kill.then_some((&*r.store, &killed)),
        );
        let run = attempt.run(delivery, &*r.store, &self.policy, &self.log);
        tokio::select! {
            biased;
            () = killed.notified() => {
                self.journal.crashed(note);
                tokio::time::sleep(restart).await;
                r.store.revive();
            }
            recorded = run => self.journal.ended(note, recorded_text(&recorded)),
        }
    }
}

fn recorded_text(recorded: &Recorded) -> String {
    let verdict = match &recorded.verdict {
        Verdict::Done(_) => "done".to_owned(),
        Verdict::Retry { error, .. } => format!("retry ({error})"),
        Verdict::Dead { reason, .. } => format!("dead ({})", reason.as_str()),
        Verdict::Throttled { .. } => "throttled".to_owned(),
        Verdict::Release { error } => format!("release ({error})"),
        Verdict::Unknown { error } => format!("unknown ({error})"),
    };
    let written = match &recorded.written {
        None => "nothing written".to_owned(),
        Some(Ok(Fenced::Applied)) => "written".to_owned(),
        Some(Ok(Fenced::Stale)) => "stale".to_owned(),
        Some(Err(e)) => format!("NOT written: {e}"),
    };
    format!("{verdict}, {written}")
}

/// What one case found.
struct Found {
    violations: Vec<String>,
    /// The case's parameters, findings and schedule.
    report: String,
    excused: Vec<String>,
    stats: Stats,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    deliveries: usize,
    delivered: usize,
    hung_up: usize,
    faults: usize,
    kills: usize,
    replays: usize,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Self) {
        self.deliveries += o.deliveries;
        self.delivered += o.delivered;
        self.hung_up += o.hung_up;
        self.faults += o.faults;
        self.kills += o.kills;
        self.replays += o.replays;
    }
}

/// Runs one case: contention under faults, then the drain, then the checks. `Err` holds
/// the report of a failing case.
async fn run_case(backend: Backend, seed: u64) -> Result<Found, String> {
    let (mut case, runner_count) = Case::new(backend, seed);
    let db = TestDb::on(backend).await;
    let mut config = db.store_config();
    config.pool_size = 4;
    // As a node derives it from the lease: a third of it.
    config.statement_timeout = Some(LEASE / 3);
    let base = db.store_with(config.clone()).await;
    for (key, queue) in &case.keys {
        if *queue {
            let row = QueueRow {
                id: EventId::new(PROVIDER, key.as_str()),
                fingerprint: None,
                payload: Bytes::from(format!(r#"{{"id":"{key}"}}"#)),
                content_type: Some("application/json".into()),
                headers: None,
                keep_payload: false,
                start: None,
            };
            base.enqueue(&row).await.expect("enqueue");
        }
    }
    let mut nodes = Vec::new();
    for _ in 0..runner_count {
        nodes.push(db.store_with(config.clone()).await);
    }
    // The case's clock starts once its stores are open.
    case.journal = Arc::new(Journal::default());
    let journal = Arc::clone(&case.journal);
    journal.note(case.describe(runner_count));
    let mut runners = Vec::new();
    for (index, store) in nodes.into_iter().enumerate() {
        let salt = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(index as u64);
        let outage = case.outage(&mut fastrand::Rng::with_seed(salt ^ 0x07a6e));
        let journal = Arc::clone(&journal);
        let store = ChaosStore::new(store, index, salt, case.weather, outage, journal);
        runners.push(Runner {
            index,
            store: Arc::new(store),
            rng: fastrand::Rng::with_seed(salt ^ 0x5151),
        });
    }
    let stores: Vec<Arc<ChaosStore>> = runners.iter().map(|r| Arc::clone(&r.store)).collect();
    let mut violations = Vec::new();

    // Contention under faults; at its end the faults stop and each runner finishes the
    // attempt it is in.
    let until = Instant::now() + CHAOS;
    let contend = futures_util::future::join_all(runners.iter_mut().map(|r| {
        let case = &case;
        async move {
            while Instant::now() < until {
                case.step(r).await;
                let pause = Duration::from_millis(r.rng.u64(0..30));
                tokio::time::sleep(pause).await;
            }
        }
    }));
    let calm = async {
        tokio::time::sleep_until(until.into()).await;
        journal.note("faults stop");
        case.chaos.set(false);
        for store in &stores {
            store.calm();
        }
    };
    let finished = tokio::time::timeout(PHASE_LIMIT, async {
        futures_util::join!(contend, calm);
    })
    .await;
    if finished.is_err() {
        violations.push(format!(
            "a runner was still in its attempt {} s after the faults stopped",
            PHASE_LIMIT.as_secs()
        ));
    } else {
        journal.note("drain: every unfinished row made due by hand");
        let stranded = drain(&case, &db, &mut runners).await;
        violations.extend(stranded);
    }

    let mut rows = Vec::new();
    for (key, _) in &case.keys {
        let row = base.lookup(&EventId::new(PROVIDER, key.as_str())).await;
        let row = row.expect("lookup");
        rows.push((
            key.clone(),
            row.map(|r| {
                let body = r
                    .result
                    .map(|r| String::from_utf8_lossy(&r.body).into_owned());
                (r.status.as_str().to_owned(), r.attempts, body)
            }),
        ));
    }
    let mut found = check(&case, &rows);
    violations.append(&mut found.violations);
    found.violations = violations;
    let mut report = format!(
        "runner_faults: {} — {} violation(s)\n",
        case.describe(runner_count),
        found.violations.len()
    );
    for v in &found.violations {
        report.push_str(&format!("  VIOLATION {v}\n"));
    }
    for e in &found.excused {
        report.push_str(&format!("  excused: {e}\n"));
    }
    report.push_str(&format!("  rows at the end: {rows:?}\n"));
    report.push_str(&format!(
        "  replay: HOOKGATE_FAULT_SEED={seed} scripts/test.sh runner_faults\n  schedule:\n"
    ));
    report.push_str(&journal.schedule());
    if found.violations.is_empty() {
        found.report = report;
        return Ok(found);
    }
    Err(report)
}

/// Drives every unfinished row to done or dead with the faults off: made due by hand (its
/// backoff and any lease moved into the past — no attempt runs now), then taken or
/// claimed by a runner, until none is left or the phase's limit passes.
async fn drain(case: &Case, db: &TestDb, runners: &mut [Runner]) -> Vec<String> {
    let deadline = Instant::now() + PHASE_LIMIT;
    let mut rng = fastrand::Rng::with_seed(case.seed ^ 0xD8A1);
    loop {
        let mut open = Vec::new();
        for (key, queue) in &case.keys {
            let status = db.status(PROVIDER, key).await;
            if !matches!(status.as_deref(), Some("done" | "dead")) {
                open.push((key.clone(), *queue, status));
            }
        }
        if open.is_empty() {
            return Vec::new();
        }
        if Instant::now() > deadline {
            return vec![format!(
                "rows still unfinished {} s into the drain: {open:?}",
                PHASE_LIMIT.as_secs()
            )];
        }
        for (key, queue, status) in open {
            if status.is_some() {
                db.make_due(PROVIDER, &key).await;
            }
            let r = &mut runners[rng.usize(..runners.len())];
            if queue {
                case.take(r, EventId::new(PROVIDER, key.as_str())).await;
            } else {
                case.claim(r, &key).await;
            }
        }
    }
}

/// Whether `[from, to]` is covered by the union of `intervals`.
fn covered(from: Instant, to: Instant, mut intervals: Vec<(Instant, Instant)>) -> bool {
    intervals.sort();
    let mut reach = from;
    for (start, end) in intervals {
        if reach >= to {
            break;
        }
        if start > reach {
            return false;
        }
        reach = reach.max(end);
    }
    reach >= to
}

/// Why a delivery of `key` after attempt `n`'s 2xx (which ended at `answered`) may happen,
/// if it may: the runner was killed before the outcome landed, or every call that would
/// have kept the lease was refused or held from the answer until the row was retaken.
fn excuse(
    key: &str,
    n: i32,
    answered: Instant,
    next: &Span,
    calls: &[Call],
    attempts: &[AttemptNote],
) -> Option<String> {
    let note = attempts.iter().find(|a| a.key == key && a.attempts == n)?;
    if note.crashed.is_some() {
        return Some(format!(
            "{key} #{n}: killed between its 2xx and its outcome; delivered again as #{}",
            next.attempts
        ));
    }
    let ours = |c: &&Call| c.key.as_deref() == Some(key);
    // The first call after the answer is made a moment after it.
    let answered = answered + margin();
    let far = answered + Duration::from_secs(3600);
    // The take, claim or replay that reopened the row after attempt n.
    let retake = calls
        .iter()
        .filter(ours)
        .filter(|c| matches!(c.op, Op::Take | Op::Claim | Op::Replay))
        .filter(|c| c.applied && c.attempts == Some(n + 1))
        .filter_map(|c| c.reached)
        .min()
        .unwrap_or(next.start);
    if note.queue {
        // Renewals (and the take itself) keep the lease: the next is due a third of a
        // lease after the last, later by at most the hang-up margin's worth of slack.
        let keep = LEASE / 3 + margin();
        let intervals = calls
            .iter()
            .filter(ours)
            .filter(|c| {
                (c.op == Op::Renew && c.attempts == Some(n))
                    || (matches!(c.op, Op::Take | Op::Replay) && c.attempts == Some(n))
            })
            .map(|c| (c.issued, c.ended.map_or(far, |e| e + keep)))
            .collect();
        covered(answered, retake, intervals).then(|| {
            format!(
                "{key} #{n}: every renewal refused or held from its 2xx until #{} took the row",
                n + 1
            )
        })
    } else {
        // The outcome write is tried until the lease ends, pausing at most WRITE_PAUSE; a
        // query error ends it at once (it will not heal).
        let keep = WRITE_PAUSE + margin();
        let intervals = calls
            .iter()
            .filter(ours)
            .filter(|c| matches!(c.op, Op::Complete | Op::Fail) && c.attempts == Some(n))
            .filter(|c| !c.applied)
            .map(|c| {
                let query = c.said.contains("query");
                let end = c.ended.map_or(far, |e| if query { far } else { e + keep });
                (c.issued, end)
            })
            .collect();
        covered(answered, retake.min(note.lease_ends), intervals).then(|| {
            format!("{key} #{n}: sync outcome write refused or held until its lease ended")
        })
    }
}

/// A key and its row at the end: status, attempts and the stored answer's body.
type Row = (String, Option<(String, i32, Option<String>)>);

/// The invariants over one case's journal and final rows.
fn check(case: &Case, rows: &[Row]) -> Found {
    let spans = case.journal.spans();
    let calls = case.journal.calls();
    let attempts = case.journal.attempts();
    let mut violations = Vec::new();
    let mut excused = Vec::new();
    let ms = |t: Instant| case.journal.ms(t);
    for (key, _) in &case.keys {
        let mut ours: Vec<&Span> = spans.iter().filter(|s| &s.key == key).collect();
        ours.sort_by_key(|s| s.start);
        for s in &ours {
            if s.end.is_none() {
                violations.push(format!("{key} #{}: delivery never ended", s.attempts));
            }
        }
        // 1. No two deliveries of one key open at once; no fencing token delivered twice.
        for (i, a) in ours.iter().enumerate() {
            for b in &ours[i + 1..] {
                let a_end = a.end.unwrap_or(b.start + Duration::from_secs(3600));
                if b.start < a_end {
                    violations.push(format!(
                        "{key}: deliveries overlap: #{} (r{}) {}..{} ms and #{} (r{}) from {} ms",
                        a.attempts,
                        a.runner,
                        ms(a.start),
                        ms(a_end),
                        b.attempts,
                        b.runner,
                        ms(b.start)
                    ));
                }
                if a.attempts == b.attempts {
                    violations.push(format!(
                        "{key}: fencing token #{} delivered twice",
                        a.attempts
                    ));
                }
            }
        }
        // 2. After a 2xx, no further delivery unless excused.
        for a in ours.iter().filter(|s| s.delivered) {
            let Some(answered) = a.end else { continue };
            let Some(next) = ours
                .iter()
                .find(|b| b.attempts != a.attempts && b.start >= answered)
            else {
                continue;
            };
            match excuse(key, a.attempts, answered, next, &calls, &attempts) {
                Some(why) => excused.push(why),
                None => violations.push(format!(
                    "{key}: answered 2xx to #{} (r{}) at {} ms, delivered again as #{} (r{}) at \
                     {} ms",
                    a.attempts,
                    a.runner,
                    ms(answered),
                    next.attempts,
                    next.runner,
                    ms(next.start)
                )),
            }
        }
    }
    // 3. Every row done or dead; a done row's attempt answered 2xx, and the row holds
    // that answer (not another attempt's, written stale).
    for (key, row) in rows {
        match row {
            Some((status, n, body)) if status == "done" => {
                let ok = spans
                    .iter()
                    .any(|s| &s.key == key && s.attempts == *n && s.delivered);
                if !ok {
                    violations.push(format!(
                        "{key}: the row is done by attempt #{n}, which the target never answered \
                         2xx"
                    ));
                }
                if body.as_deref() != Some(answer_body(*n).as_str()) {
                    violations.push(format!(
                        "{key}: the row is done by attempt #{n} but holds the answer {body:?}"
                    ));
                }
            }
            Some((status, _, _)) if status == "dead" => {}
            other => violations.push(format!("{key}: ends {other:?}, not done or dead")),
        }
    }
    let stats = Stats {
        deliveries: spans.len(),
        delivered: spans.iter().filter(|s| s.delivered).count(),
        hung_up: spans.iter().filter(|s| s.answer.is_none()).count(),
        faults: calls.iter().filter(|c| c.fault.is_some()).count(),
        kills: attempts.iter().filter(|a| a.crashed.is_some()).count(),
        replays: calls
            .iter()
            .filter(|c| c.op == Op::Replay && c.applied)
            .count(),
    };
    Found {
        violations,
        report: String::new(),
        excused,
        stats,
    }
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| {
        panic!("{name} must be a number, not {value:?}");
    }))
}

async fn attempts_under_seeded_store_faults_never_overlap_never_resend_a_2xx_and_all_finish(
    backend: Backend,
) {
    let seeds: Vec<u64> = match env_number("HOOKGATE_FAULT_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env_number("HOOKGATE_FAULT_CASES").unwrap_or(CASES)).collect(),
    };
    let began = Instant::now();
    let mut failed = Vec::new();
    let mut first_report = None;
    let mut totals = Stats::default();
    let mut excused = Vec::new();
    let cases = futures_util::stream::iter(
        seeds
            .iter()
            .map(|&seed| async move { (seed, run_case(backend, seed).await) }),
    )
    .buffer_unordered(PARALLEL)
    .collect::<Vec<_>>();
    let mut results = cases.await;
    results.sort_by_key(|(seed, _)| *seed);
    for (seed, result) in results {
        match result {
            Ok(found) => {
                totals += found.stats;
                excused.extend(found.excused.iter().map(|e| format!("seed {seed}: {e}")));
                if seeds.len() == 1 {
                    eprintln!("{}", found.report);
                }
            }
            Err(report) => {
                eprintln!("{report}");
                failed.push(seed);
                first_report.get_or_insert(report);
            }
        }
    }
    eprintln!(
        "runner_faults {backend:?}: {} cases in {:.1} s, {} failed {failed:?}; passing cases: \
         {totals:?}; second deliveries excused: {}",
        seeds.len(),
        began.elapsed().as_secs_f64(),
        failed.len(),
        excused.len()
    );
    for e in &excused {
        eprintln!("  excused: {e}");
    }
    if let Some(report) = first_report {
        panic!(
            "{} of {} cases failed (seeds {failed:?}); the first:\n{report}",
            failed.len(),
            seeds.len()
        );
    }
    assert!(
        totals.deliveries > 0 && totals.faults > 0,
        "the generator delivered and faulted nothing: {totals:?}"
    );
}

on_both_stores!(attempts_under_seeded_store_faults_never_overlap_never_resend_a_2xx_and_all_finish);
