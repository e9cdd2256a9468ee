//! `--scenario keepers`: does the slot ring keep turning, and keep claims from waiting
//! behind it, when a slot it must empty holds many large dead letters (rows it must keep)?
//! Issue 56: after a target outage that left 1 100 dead letters of 256 KiB, each emptying
//! moved them under the tables' lock in batches that could not finish inside the store
//! deadline; every pass held all ingest for the whole deadline, failed, and the ring never
//! turned again, while the retention backlog read 0.
//!
//! On Postgres only (the ring is Postgres's). The node runs with hookgate's retention
//! defaults (`retention.done` 7 d, `retention.dead` 30 d, `sweep_batch` 1000, the store
//! deadline 5 s) but a sweep interval of `--sweep-interval` (1 s); `--statement-timeout`
//! and `--sweep-batch` change those two. Then:
//! 1. **The outage**, the honest way: the target answers 400 (a final refusal) to
//!    `--dead` events (300) of `--dead-bytes` each (256 KiB; by hand 2 000 of 1 MiB), sent
//!    through the node by a few connections, so each is a real dead letter with its payload
//!    and history in the current slot. The payload's padding is random letters, which
//!    Postgres's TOAST compression cannot shrink (repeated padding would store a few KiB
//!    and move for nothing). Then the target answers 200 again.
//! 2. **A week in a minute**: before each `--window` (5 s) the clock moves forward a turn of
//!    the ring (a quarter of `retention.done`, 42 h): the ring's slot times as the tests'
//!    `age_ring` moves them, and the final rows still inside their retention as
//!    `advance_clock` moves them (rows not yet final are seconds old; the history's times
//!    are not read by retention). Each window the ring turns once; the dead letters' slot
//!    is due at the fifth window (a turn after it opened plus `retention.done`), while
//!    they stay inside `retention.dead` for 17 windows, so they are keepers it must move.
//!    A healthy ring moves them again four windows after they were moved, unless it moves
//!    them where they need not move again.
//! 3. **Ingest** of new keys at `--rate` (200/s; the target answers 200) on `--connections`
//!    for `--duration` (12 windows), and a probe that every 10 ms takes the lock a claim
//!    takes on the events (`keepers_probe.rs`, whose samples count the moments it spent
//!    waiting) — how long a claim waits behind the ring, from the claim's side.
//!
//! One line per window: the clock's age, the ring (`current`, `sealed`, `empty`; `r`: a
//! slot emptied row by row), where the dead letters are (`slot:count`), done rows past
//! retention, the probe's p99 and longest wait, ingest p99 and max, answers by status,
//! deliveries and duplicates at the target, the node's retention backlog. Then a verdict.
//! It fails (non-zero exit) when the ring stops turning (a slot stays current over more
//! than two turns of aging), when rows past retention exceed a turn's and a sweep
//! interval's ingest, on any ingest answer other than 2xx or no answer, on any duplicate,
//! when the probe waited more than 50 ms at p99 or 200 ms at worst, when a dead letter
//! inside `retention.dead` is gone, and when the dead letters never moved (a run too short
//! to empty their slot, or a ring that cannot) — each check prints the numbers it compared.
//!
//! `--hold-while-moving` does not age the ring at a window that starts while the dead
//! letters are moving (some in the keep slot, some still in their slot): a move of 20 GiB
//! takes a quarter of an hour here, and windows that long would make the run last hours
//! (in the field a turn takes a day and more, so no turn waits for the moves). A held
//! window is no turn of aging for the ring-turning check, and the current slot gathers its
//! ingest as well, so the rows-past-retention check allows a window's more for each.
//!
//! CI runs `--dead 300 --window 4s --duration 36s` (scripts/bench-guard.sh, about 40 s): a window
//! must be long enough for the emptying to move its keepers (about 20 MiB/s here), since
//! each window ages the ring by a turn that in the field takes a day and more.
//! Measured on the 2-core machine before issue 56's fix: each move of those 300 held the
//! lock 1.9–2.7 s (claims waited as long); `--statement-timeout 1s` makes the same run the
//! wedge itself (every pass times out, 503s, the ring stops), as `--dead 1100` does at the
//! default deadline.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::keepers_db::RingDb;
use crate::keepers_probe::Probe;
use crate::keepers_report::{quantile_ms, Rules, Sample};
use crate::soak::{node_metrics, LAST_ANSWERS};
use crate::soak_ingest::{Ingest, Keys};
use crate::soak_target::SoakTarget;
use crate::Args;

/// Defaults when the options are not given: a run of a minute on CI-sized dead letters (75
/// MiB of payloads, written in two seconds on the 2-core machine), twelve windows so the
/// dead letters' slot is emptied (fifth window) and the slot they moved to comes due too
/// (ninth), at a rate that machine carries beside the moves.
const DEAD: u64 = 300;
const DEAD_BYTES: usize = 256 * 1024;
const RATE: u64 = 200;
const WINDOW: Duration = Duration::from_secs(5);
const WINDOWS: u32 = 12;
/// The node's `retention.sweep_interval`: a few passes each window, so each turn of aging
/// is acted on within the window.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Connections sending the outage's events: enough to keep the node and Postgres busy,
/// few enough that their bodies in flight stay far below `max_body_bytes_in_flight`.
const OUTAGE_CONNECTIONS: usize = 8;

/// Turns of the ring in one `retention.done` (the ring's own rule, ring.rs's
/// `TURNS_PER_RETENTION`, which is private to the store): one turn of aging a window.
const TURNS_PER_RETENTION: u32 = 4;

/// The run's options, defaults filled in.
#[derive(Debug, Clone, Copy)]
struct Options {
    dead: u64,
    dead_bytes: usize,
    rate: u64,
    window: Duration,
    windows: u32,
    sweep_interval: Duration,
    connections: usize,
}

impl Options {
    fn from_args(args: &Args) -> Self {
        let window = args.window.unwrap_or(WINDOW);
        let windows = match args.duration {
            Some(d) => (d.as_secs_f64() / window.as_secs_f64()).ceil().max(1.0) as u32,
            None => WINDOWS,
        };
        Self {
            dead: args.dead.unwrap_or(DEAD),
            dead_bytes: args.dead_bytes.unwrap_or(DEAD_BYTES),
            rate: args.rate.unwrap_or(RATE),
            window,
            windows,
            sweep_interval: args.sweep_interval.unwrap_or(SWEEP_INTERVAL),
            connections: args.connections,
        }
    }
}

/// Runs the scenario; answers whether every check passed.
pub fn run(args: &Args) -> bool {
    if let Some(store) = args.store.as_deref().filter(|s| *s != "postgres") {
        panic!("--scenario keepers runs on postgres (the slot ring is Postgres's), not {store}");
    }
    let options = Options::from_args(args);
    actix_rt::System::new().block_on(keepers(args, options))
}

async fn keepers(args: &Args, o: Options) -> bool {
    let target = SoakTarget::start();
    let on_postgres = Args {
        store: Some("postgres".into()),
        ..args.clone()
    };
    let (mut config, _) = crate::config(&on_postgres, "keepers", &target.url);
    config.retention.sweep_interval = o.sweep_interval;
    config.retention.sweep_batch = args.sweep_batch.unwrap_or(config.retention.sweep_batch);
    config.store.statement_timeout = args.statement_timeout.or(config.store.statement_timeout);
    // Room for the outage's bodies and their JSON around them.
    config.server.max_body_bytes = config.server.max_body_bytes.max(o.dead_bytes + 1024);
    let retention = config.retention.clone();
    let turn = retention.done / TURNS_PER_RETENTION;
    println!(
        "# keepers: store=postgres dead={} dead_bytes={} rate={} window={} windows={} \
         turn={} (of retention.done {}) retention.dead={} sweep_interval={} sweep_batch={} \
         deadline={} connections={} cpus={}",
        o.dead,
        o.dead_bytes,
        o.rate,
        humantime::format_duration(o.window),
        o.windows,
        humantime::format_duration(turn),
        humantime::format_duration(retention.done),
        humantime::format_duration(retention.dead),
        humantime::format_duration(retention.sweep_interval),
        retention.sweep_batch,
        humantime::format_duration(config.store.deadline()),
        o.connections,
        hookgate::config::cpus()
    );
    let store = hookgate::store::open(&config.store)
        .await
        .expect("open the store");
    store.migrate().await.expect("migrate");
    let mut db = RingDb::connect(&config.store.url, &config.store.schema).await;
    let (port, node) = crate::start_on(&config, store).await;
    let base = format!("http://127.0.0.1:{port}");
    let client = awc::Client::new();

    let t = Instant::now();
    let answers = outage(&base, &target, &o).await;
    let (dead, dead_bytes) = db.dead_letters().await;
    let before = db.look(retention.done).await;
    println!(
        "# outage: {} events of {} bytes in {:.1}s, answered {{{}}}, refused by the target {}; \
         {dead} dead letters in slot(s) {}, their payloads {:.1}MiB in the table",
        o.dead,
        o.dead_bytes,
        t.elapsed().as_secs_f64(),
        answers
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(","),
        target.tally().refused,
        before.dead_line(),
        dead_bytes as f64 / (1024.0 * 1024.0)
    );

    let started = Instant::now();
    let deadline = started + o.window * o.windows;
    let url = format!("{base}/webhooks/bench");
    let ingest = Ingest::start(url, Keys::New, o.connections, o.rate, deadline);
    let probe = Probe::start(&config.store.url, &config.store.schema);
    let mut samples = Vec::new();
    let mut aged = Duration::ZERO;
    let mut held = 0;
    for k in 1..=o.windows {
        if args.hold_while_moving && db.look(retention.done).await.moving() {
            held += 1;
        } else {
            db.age(turn, retention.done, retention.dead).await;
            aged += turn;
        }
        let end = started + o.window * k;
        actix_rt::time::sleep_until(end.into()).await;
        if k == o.windows {
            let waited = Instant::now();
            while !ingest.finished() && waited.elapsed() < LAST_ANSWERS {
                actix_rt::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let look = db.look(retention.done).await;
        let mut waits = probe.take_window();
        let mut window = ingest.take_window();
        let sample = Sample {
            at: started.elapsed(),
            aged,
            look,
            lock_p99: quantile_ms(&mut waits, 0.99),
            lock_max: quantile_ms(&mut waits, 1.0),
            p99: quantile_ms(&mut window.latencies_us, 0.99),
            max: quantile_ms(&mut window.latencies_us, 1.0),
            accepted: window.accepted,
            refused_by: std::mem::take(&mut window.refused_by),
            errors: window.errors,
            tally: target.tally(),
            backlog_s: node_metrics(&client, &base).await.backlog_s,
        };
        println!("{}", sample.line());
        samples.push((sample, waits));
    }
    probe.stop();
    node.stop().await;
    db.drop_schema().await;
    if args.hold_while_moving {
        println!("# the clock held for {held} window(s) while the dead letters moved");
    }

    let mut waits: Vec<u32> = samples.iter().flat_map(|(_, w)| w).copied().collect();
    let samples: Vec<Sample> = samples.into_iter().map(|(s, _)| s).collect();
    let rules = Rules {
        dead: o.dead,
        rate: o.rate,
        window: o.window,
        sweep_interval: o.sweep_interval,
        dead_retention: retention.dead,
        held,
    };
    let checks = rules.checks(&before, &samples, &mut waits, target.tally());
    let tally = target.tally();
    println!(
        "scenario=keepers store=postgres dead={} events={} refused={} errors={} \
         deliveries={} duplicates={} lock_wait_p99={:.1}ms lock_wait_max={:.0}ms \
         worst_window_p99={:.1}ms max={:.0}ms",
        o.dead,
        samples.iter().map(|s| s.accepted).sum::<u64>(),
        samples
            .iter()
            .flat_map(|s| s.refused_by.values())
            .sum::<u64>(),
        samples.iter().map(|s| s.errors).sum::<u64>(),
        tally.deliveries,
        tally.duplicates,
        quantile_ms(&mut waits, 0.99),
        quantile_ms(&mut waits, 1.0),
        samples.iter().map(|s| s.p99).fold(0.0, f64::max),
        samples.iter().map(|s| s.max).fold(0.0, f64::max),
    );
    for check in &checks {
        println!("{}", check.line());
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.passed == Some(false))
        .map(|c| c.name)
        .collect();
    match failed.is_empty() {
        true => println!("# verdict: ok"),
        false => println!("# verdict: FAIL ({})", failed.join("; ")),
    }
    failed.is_empty()
}

/// The outage: the target refuses every delivery while `o.dead` events of `o.dead_bytes`
/// go through the node, each becoming a dead letter at once. Answers
/// how the senders were answered, by status (`none`: no answer).
async fn outage(base: &str, target: &SoakTarget, o: &Options) -> BTreeMap<String, u64> {
    target.refuse(true);
    // Random letters: incompressible for TOAST (pglz finds no repeats to take out).
    let shell = r#"{"id":"outage-","type":"bench.outage","pad":""}"#.len() + 20;
    let mut pad = vec![0u8; o.dead_bytes.saturating_sub(shell)];
    fastrand::fill(&mut pad);
    let pad: String = pad.iter().map(|b| char::from(b'a' + b % 26)).collect();
    let pad = std::rc::Rc::new(pad);
    let next = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let answers = std::rc::Rc::new(std::cell::RefCell::new(BTreeMap::<String, u64>::new()));
    let url = format!("{base}/webhooks/bench");
    let mut senders = Vec::new();
    for _ in 0..OUTAGE_CONNECTIONS {
        let (url, pad, next, answers) = (
            url.clone(),
            std::rc::Rc::clone(&pad),
            std::rc::Rc::clone(&next),
            std::rc::Rc::clone(&answers),
        );
        let dead = o.dead;
        senders.push(actix_rt::spawn(async move {
            let client = awc::Client::builder()
                .timeout(Duration::from_secs(60))
                .finish();
            loop {
                let n = next.get();
                if n >= dead {
                    break;
                }
                next.set(n + 1);
                let key = format!("outage-{n}");
                let body = format!(r#"{{"id":"{key}","type":"bench.outage","pad":"{pad}"}}"#);
                let answer = match client
                    .post(&url)
                    .insert_header(("Content-Type", "application/json"))
                    .insert_header(("X-Idempotency-Key", key.as_str()))
                    .send_body(body)
                    .await
                {
                    Ok(mut response) => {
                        let _ = response.body().await;
                        response.status().as_u16().to_string()
                    }
                    Err(_) => "none".to_owned(),
                };
                *answers.borrow_mut().entry(answer).or_default() += 1;
            }
        }));
    }
    for sender in senders {
        let _ = sender.await;
    }
    target.refuse(false);
    let answers = answers.borrow().clone();
    answers
}
