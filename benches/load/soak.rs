//! `--scenario soak`: does the store hold its size under a steady ingest with retention
//! running? The events table is prefilled with done rows spread over the last week (most
//! already past retention), then the node takes new keys at `--rate` while its sweeper
//! runs every `--sweep-interval` with `retention.done = --retention`, and every `--window`
//! one line says rows, rows past retention, bytes, CPU per event, latencies and duplicates.
//!
//! It fails (non-zero exit) when the target sees any key twice; when a prefill row already
//! past retention at the start is still there at the end, or one within retention is gone
//! (a run of seconds checks these); and on unbounded growth, judged on the steady part of
//! the run — the windows ending after its settling time, the retention plus a sweep
//! interval plus a window — by two rules:
//! * **the disk holds its size**: the largest disk size of the steady part's last third is
//!   at most 1.15 × that of its middle third. Largest, not last: Postgres's table grows
//!   between autovacuum runs, SQLite's WAL between checkpoints; thirds, so the first third
//!   absorbs a plateau still being reached.
//! * **retention keeps up**: the fewest rows past retention in the last third are at most
//!   what arrives in a sweep interval and a window. A prefill larger than the run's ingest
//!   hides growth from the size rule; this one sees it, since rows past retention are ~0
//!   while the sweeper keeps up and only grow when it does not.
//!
//! A run shorter than the settling time plus three windows is not judged for growth, and
//! cannot be: a store rightly grows for a whole retention period. The size rule sees growth
//! of more than 15 % across a third of the steady part, so slow growth needs a long run.
//! `--node-retention 365d` gives the node a retention other than the one the checks expect,
//! to see them fail.

use std::time::{Duration, Instant};

use hookgate::claim::Mode;

use crate::soak_db::{Counts, Db, Prefill, PREFILL_PREFIX};
use crate::soak_ingest::{Ingest, Keys, Window};
use crate::soak_report::{Check, Rules, Sample};
use crate::soak_target::SoakTarget;
use crate::Args;
use hookgate_kit::proc_cpu::{self, TICKS_PER_SECOND};

/// Defaults when the options are not given: a run of half an hour that keeps ten minutes
/// of events, reported every minute, at a rate the 2-core machine carries with room left
/// for retention.
const RETENTION: Duration = Duration::from_secs(600);
const WINDOW: Duration = Duration::from_secs(60);
const RATE: u64 = 500;

/// How long the last window waits for the senders' last answers after the deadline: a
/// request's own timeout (60 s) and some.
pub(crate) const LAST_ANSWERS: Duration = Duration::from_secs(70);

/// The run's options, defaults filled in.
#[derive(Debug, Clone, Copy)]
struct Options {
    prefill: u64,
    rate: u64,
    duration: Duration,
    /// The node's `retention.done`; the checks expect `rules.retention`.
    node_retention: Duration,
    rules: Rules,
    connections: usize,
    mode: Mode,
    /// How long the redelivery phase runs after the first runs (none: no such phase).
    redeliver: Option<Duration>,
    /// Whether each window counts the rows (a scan of the tables: off for cost runs on
    /// tens of millions of rows, where it would take a core for seconds each window).
    counts: bool,
}

impl Options {
    fn from_args(args: &Args) -> Self {
        let retention = args.retention.unwrap_or(RETENTION);
        let window = args.window.unwrap_or(WINDOW);
        let sweep_interval = args
            .sweep_interval
            .unwrap_or((retention / 10).min(window / 2))
            .max(Duration::from_secs(1));
        let mode = match args.mode.as_str() {
            "sync" => Mode::Sync,
            "queue" => Mode::Queue,
            other => panic!("--mode must be sync or queue, not {other}"),
        };
        Self {
            prefill: args.prefill,
            rate: args.rate.unwrap_or(RATE),
            duration: args.duration.unwrap_or(3 * retention),
            node_retention: args.node_retention.unwrap_or(retention),
            rules: Rules {
                retention,
                sweep_interval,
                window,
            },
            connections: args.connections,
            mode,
            redeliver: args.redeliver,
            counts: !args.no_counts,
        }
    }
}

/// Runs the soak; answers whether every check passed.
pub fn run(args: &Args) -> bool {
    let options = Options::from_args(args);
    actix_rt::System::new().block_on(soak(args, options))
}

async fn soak(args: &Args, o: Options) -> bool {
    let target = SoakTarget::start();
    let (mut config, sqlite_file) = crate::config(args, "soak", &target.url);
    config.retention.done = o.node_retention;
    config.retention.sweep_interval = o.rules.sweep_interval;
    config.providers[0].mode = Some(o.mode);
    println!(
        "# soak: store={} mode={} prefill={} rate={} retention={}{} sweep_interval={} \
         window={} duration={} redeliver={} counts={} connections={} cpus={}",
        args.store(),
        o.mode.as_str(),
        o.prefill,
        o.rate,
        humantime::format_duration(o.rules.retention),
        match o.node_retention == o.rules.retention {
            true => String::new(),
            false => format!(
                " (the node's: {})",
                humantime::format_duration(o.node_retention)
            ),
        },
        humantime::format_duration(o.rules.sweep_interval),
        humantime::format_duration(o.rules.window),
        humantime::format_duration(o.duration),
        o.redeliver
            .map_or("none".into(), |d| humantime::format_duration(d).to_string()),
        o.counts,
        o.connections,
        hookgate::config::cpus()
    );
    let store = hookgate::store::open(&config.store)
        .await
        .expect("open the store");
    store.migrate().await.expect("migrate");
    let db = match &sqlite_file {
        Some(file) => Db::sqlite(file),
        None => Db::postgres(&config.store.url, &config.store.schema).await,
    };
    let prefill = if o.prefill > 0 {
        let t = Instant::now();
        let prefill = db
            .prefill(o.prefill, o.mode.as_str(), o.node_retention)
            .await;
        let counts = db.counts(o.rules.retention).await;
        println!(
            "# prefill: {} rows in {:.1}s, {} past retention, {:.1}MiB on disk",
            o.prefill,
            t.elapsed().as_secs_f64(),
            counts.past_retention,
            counts.disk as f64 / (1024.0 * 1024.0)
        );
        prefill
    } else {
        Prefill::default()
    };
    let (port, node) = crate::start_on(&config, store).await;
    let base = format!("http://127.0.0.1:{port}");

    let client = awc::Client::new();
    let watch = Watch {
        db: &db,
        target: &target,
        client: &client,
        base: &base,
        o: &o,
    };
    let samples = watch.phase("", Keys::New, o.duration).await;
    // Redeliveries of the prefill's rows within retention (the newest first in the
    // prefill's order): duplicates the node's cache never saw, answered from the row.
    let within = prefill
        .rows
        .min((o.rules.retention.as_secs_f64() / prefill.step) as u64);
    let redelivered = match o.redeliver {
        Some(duration) if within > 0 => {
            let keys = Keys::Prefilled {
                prefix: PREFILL_PREFIX,
                rows: within,
            };
            watch.phase("redeliver ", keys, duration).await
        }
        Some(_) => panic!("--redeliver needs prefilled rows within retention"),
        None => Vec::new(),
    };

    let left = match prefill.rows {
        0 => None,
        _ if !o.counts => None,
        _ => Some(db.prefill_left(&prefill, o.rules.retention).await),
    };
    let tally = target.tally();
    let mut checks = match o.counts {
        true => o.rules.checks(&samples, tally, left),
        false => o
            .rules
            .checks(&[], tally, None)
            .into_iter()
            .map(|mut c| {
                if c.passed.is_none() {
                    c.detail = "not judged: --no-counts".into();
                }
                c
            })
            .collect(),
    };
    if o.redeliver.is_some() {
        checks.push(redelivery_check(&redelivered));
    }
    let accepted: u64 = samples.iter().map(|s| s.accepted).sum();
    let refused: u64 = samples.iter().map(|s| s.refused).sum();
    let errors: u64 = samples.iter().map(|s| s.errors).sum();
    let mut refused_by = std::collections::BTreeMap::<&str, u64>::new();
    for (answer, n) in samples.iter().flat_map(|s| &s.refused_by) {
        *refused_by.entry(answer).or_default() += n;
    }
    let refused_as: String = refused_by
        .iter()
        .map(|(k, n)| format!(" {k}:{n}"))
        .collect();
    let worst_p99 = samples.iter().map(|s| s.p99_ms).fold(0.0, f64::max);
    let max = samples.iter().map(|s| s.max_ms).fold(0.0, f64::max);
    println!(
        "scenario=soak store={} mode={} events={accepted} refused={refused}{refused_as} \
         errors={errors} deliveries={} duplicates={} worst_window_p99={worst_p99:.1}ms \
         max={max:.0}ms",
        args.store(),
        o.mode.as_str(),
        tally.deliveries,
        tally.duplicates
    );
    if !redelivered.is_empty() {
        let answered: u64 = redelivered.iter().map(|s| s.accepted).sum();
        let worst_p99 = redelivered.iter().map(|s| s.p99_ms).fold(0.0, f64::max);
        println!(
            "scenario=soak phase=redeliver redeliveries={answered} worst_window_p99={worst_p99:.1}ms"
        );
    }
    for check in &checks {
        println!("{}", check.line());
    }
    node.stop().await;
    db.drop_schema().await;
    if let Some(file) = sqlite_file {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{file}{suffix}"));
        }
    }
    checks.iter().all(|c| c.passed != Some(false))
}

/// What a phase of the run needs to watch it, window by window.
struct Watch<'a> {
    db: &'a Db,
    target: &'a SoakTarget,
    client: &'a awc::Client,
    base: &'a str,
    o: &'a Options,
}

impl Watch<'_> {
    /// Sends `keys` at the run's rate for `duration` and prints one line (after `label`)
    /// per window; answers the windows.
    async fn phase(&self, label: &str, keys: Keys, duration: Duration) -> Vec<Sample> {
        let o = self.o;
        let started = Instant::now();
        let deadline = started + duration;
        let url = format!("{}/webhooks/bench", self.base);
        let ingest = Ingest::start(url, keys, o.connections, o.rate, deadline);
        let mut meter = Meter::read(self.db, &ingest);
        let mut swept_before = node_metrics(self.client, self.base).await.swept_done;
        let mut samples: Vec<Sample> = Vec::new();
        for k in 1u32.. {
            let end = (started + o.rules.window * k).min(deadline);
            actix_rt::time::sleep_until(end.into()).await;
            if end == deadline {
                let waited = Instant::now();
                while !ingest.finished() && waited.elapsed() < LAST_ANSWERS {
                    actix_rt::time::sleep(Duration::from_millis(20)).await;
                }
            }
            let at = started.elapsed();
            let length = at - samples.last().map_or(Duration::ZERO, |s| s.at);
            let window = ingest.take_window();
            let node = node_metrics(self.client, self.base).await;
            let (events_bytes, attempts_bytes) = (node.events_bytes, node.attempts_bytes);
            let swept = node.swept_done.saturating_sub(swept_before);
            swept_before = node.swept_done;
            let counts = match o.counts {
                true => self.db.counts(o.rules.retention).await,
                false => Counts {
                    disk: events_bytes + attempts_bytes,
                    ..Counts::default()
                },
            };
            let now = Meter::read(self.db, &ingest);
            let (node_us, postgres_us) = now.per_event(&meter, window.accepted);
            meter = now;
            let sample = Sample {
                at,
                length,
                counts,
                events_bytes,
                attempts_bytes,
                backlog_s: node.backlog_s,
                swept,
                node_us,
                postgres_us,
                tally: self.target.tally(),
                rss_mib: crate::rss_mib(),
                ..latencies(window)
            };
            println!("{label}{}", sample.line());
            samples.push(sample);
            if end >= deadline {
                break;
            }
        }
        samples
    }
}

/// Every redelivery of a prefilled key was answered with a 2xx (from its row: the
/// target's count of keys never sent, checked apart, stays 0).
fn redelivery_check(samples: &[Sample]) -> Check {
    let answered: u64 = samples.iter().map(|s| s.accepted).sum();
    let other: u64 = samples.iter().map(|s| s.refused + s.errors).sum();
    Check {
        name: "every redelivery is answered from its row",
        passed: Some(answered > 0 && other == 0),
        detail: format!("{answered} answered 2xx, {other} otherwise or not at all"),
    }
}

/// A window's latencies and answers, as the sample's.
fn latencies(mut window: Window) -> Sample {
    window.latencies_us.sort_unstable();
    let at = |p: f64| {
        let n = window.latencies_us.len();
        match n {
            0 => 0.0,
            _ => f64::from(window.latencies_us[((n - 1) as f64 * p).round() as usize]) / 1000.0,
        }
    };
    Sample {
        accepted: window.accepted,
        refused: window.refused,
        refused_by: window.refused_by,
        errors: window.errors,
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        ..Sample::default()
    }
}

/// What the soak reads of the node's `/metrics` each window.
#[derive(Default)]
pub(crate) struct NodeMetrics {
    /// `hookgate_table_bytes` of the events and of their history.
    events_bytes: u64,
    attempts_bytes: u64,
    /// `hookgate_retention_backlog_seconds`.
    pub(crate) backlog_s: f64,
    /// `hookgate_swept_rows_total` of done rows, since the node started.
    swept_done: u64,
}

/// The node's metrics the soak prints (zeros if `/metrics` does not answer).
pub(crate) async fn node_metrics(client: &awc::Client, base: &str) -> NodeMetrics {
    let Ok(mut response) = client.get(format!("{base}/metrics")).send().await else {
        return NodeMetrics::default();
    };
    let body = response.body().limit(1 << 22).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let value = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    NodeMetrics {
        events_bytes: value(r#"hookgate_table_bytes{table="webhook_events"}"#) as u64,
        attempts_bytes: value(r#"hookgate_table_bytes{table="webhook_attempts"}"#) as u64,
        backlog_s: value("hookgate_retention_backlog_seconds "),
        swept_done: value(r#"hookgate_swept_rows_total{kind="done"}"#) as u64,
    }
}

/// CPU ticks at one moment: the bench's process, the part of it that is not the node
/// (its senders' thread, its own SQLite reads), and the Postgres cluster without the
/// bench's backend.
struct Meter {
    process: u64,
    bench: u64,
    cluster: Option<u64>,
}

impl Meter {
    fn read(db: &Db, ingest: &Ingest) -> Self {
        let own = proc_cpu::stat(std::process::id()).map_or(0, |s| s.utime + s.stime);
        Self {
            process: own,
            bench: ingest.ticks() + db.own_process_ticks(),
            cluster: db.cluster_ticks(),
        }
    }

    /// The node's and the cluster's CPU per event since `before`, in µs.
    fn per_event(&self, before: &Meter, events: u64) -> (f64, Option<f64>) {
        let us = |ticks: u64| ticks as f64 / TICKS_PER_SECOND * 1e6 / events.max(1) as f64;
        let node = (self.process.saturating_sub(before.process))
            .saturating_sub(self.bench.saturating_sub(before.bench));
        let cluster = match (self.cluster, before.cluster) {
            (Some(now), Some(then)) => Some(us(now.saturating_sub(then))),
            _ => None,
        };
        (us(node), cluster)
    }
}
