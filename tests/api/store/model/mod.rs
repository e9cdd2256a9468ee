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
//!
//! * `ops.rs` — the steps a sequence is made of, as text, and their seeded generator.
//! * `reference.rs` — the pure reference model.
//! * `check.rs` — a sequence run against a real store and compared step by step; shrinking.

mod check;
mod ops;
mod reference;

use std::time::Duration;

use hookgate::claim::{Path, Status};
use hookgate::store::{Fenced, Retention};

use crate::helpers::Backend;

use check::{run_case, shrink};
use ops::{generate, Op};
use reference::{Answer, Model};

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
/// The provider's other route: the model's keys from `KEYS.len()` on are the rows of
/// `KEYS` in this scope (written by routed claims and enqueues).
const ROUTE: &str = "m.r";
/// Every row the model knows: each key's, and each key's in [`ROUTE`].
const ROWS: usize = 2 * KEYS.len();
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

/// The sequences kept in `tests/api/store/model_regressions.txt`: blocks of steps separated by
/// blank lines, `#` comments.
fn regressions() -> Vec<(String, Vec<Op>)> {
    let text = include_str!("../model_regressions.txt");
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

/// A routed claim that is won writes the key's row in the other route, queued; one that is
/// not won, or a duplicate, writes none; the route's row is then a row like any other.
#[test]
fn the_model_writes_a_routes_row_with_a_won_claim_only() {
    let mut model = Model::default();
    let steps = [
        "claim k0 a h0 +r",
        "claim k1 a h1",
        "claim k1 a h2 +r",
        "take k4 h2",
        "complete h2 200",
    ];
    let answers: Vec<Answer> = steps
        .iter()
        .map(|s| model.apply(&s.parse().unwrap()))
        .collect();
    assert_eq!(answers[0], Answer::Won(1, Path::FirstRun));
    assert_eq!(model.rows[&KEYS.len()].status, Status::Done);
    assert!(matches!(answers[2], Answer::Existing(..)));
    assert!(
        !model.rows.contains_key(&(KEYS.len() + 1)),
        "k1's route row"
    );
    assert_eq!(answers[3], Answer::Taken(Some((1, Path::FirstRun, 1))));
    let generated: Vec<String> = generate(&mut fastrand::Rng::with_seed(7), 500)
        .iter()
        .map(Op::to_string)
        .collect();
    assert!(generated.iter().any(|s| s.ends_with("+r")));
    assert!(generated.iter().any(|s| s.starts_with("take k4")));
}

on_both_stores!(the_store_agrees_with_the_model);
