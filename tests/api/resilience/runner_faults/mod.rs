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
//!
//! * `script.rs` — the scripted target.
//! * `case.rs` — a case's parameters and its runners' actions.
//! * `check.rs` — the checks over a case's journal and final rows.

mod case;
mod check;
mod script;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use futures_util::StreamExt;
use hookgate::key::EventId;
use hookgate::store::QueueRow;

use crate::helpers::{Backend, ChaosStore, Journal, TestDb, PROVIDER};

use case::{Case, Runner};
use check::{check, Found, Stats};

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
