//! hookgate's load benchmark: `cargo bench --bench load -- [--scenario NAME|all]
//! [--mode sync|queue] [--payload-bytes N] [--connections 64] [--duration 10s] [--requests N] [--store postgres|sqlite]
//! [--shards N] [--http-workers N] [--keep-alive 5s] [--url URL]`.
//!
//! Starts hookgate in-process (or drives a running one with `--url`, whose target must be
//! this bench's printed target), with the kit's target (`hookgate_kit::target`) counting
//! deliveries per `Idempotency-Key` and attempt. Prints one line per scenario: requests/s,
//! p50, p99, max, answers by status, deliveries and duplicates at the target — and exits non-zero if any scenario saw
//! a duplicate. Postgres runs need `HOOKGATE_BENCH_DATABASE_URL` (scripts/bench.sh starts a
//! durable throwaway cluster). Loopback only; every run is bounded in time and count.
//!
//! `--scenario soak [--prefill 100000] [--rate 500] [--retention 10m] [--sweep-interval D]
//! [--window 60s] [--duration 30m] [--mode sync|queue] [--store postgres|sqlite]
//! [--node-retention D] [--redeliver D] [--no-counts]` prefills
//! done rows spread over the last week, then ingests new keys at the rate with retention
//! running (the config's 72 h floor does not apply), prints one line a window (rows, rows
//! past retention, bytes, CPU per event, p50/p99/max, duplicates), then with `--redeliver D`
//! D of redeliveries of prefilled keys, and exits non-zero on a
//! duplicate, on expired prefill left or young prefill removed, on a redelivery not answered
//! from its row, and on unbounded growth; see `soak.rs`.
//!
//! `--scenario keepers [--store postgres] [--dead 300] [--dead-bytes 256KiB] [--rate 200]
//! [--duration 60s] [--window 5s] [--sweep-interval 1s] [--statement-timeout D]
//! [--sweep-batch N]`: an outage leaves N dead letters of B bytes (the target answers 400),
//! then new keys arrive at the rate while the clock moves a turn of the ring each window, so
//! the dead letters' slot is emptied and they are moved as keepers; a probe measures how
//! long a claim waits for the events' lock. One line a window (the ring's slots, where the
//! dead letters are, rows past retention, the probe's p99/max, ingest p99/max, answers by
//! status, duplicates); exits non-zero when the ring stops turning, rows past retention
//! exceed a turn's ingest, any ingest answer is not 2xx, a key is delivered twice, the probe
//! waits over 50 ms at p99 or 200 ms at worst, or a dead letter is lost or never moved; see
//! `keepers.rs`.
//!
//! `--scenario routes [--store postgres]`: one route, a provider with three routes, and three
//! providers of one route each, compared (events a second, the sender's p99, Postgres CPU
//! per delivered pair); see `routes.rs`.
//!
//! The fault runs (chaos, failover, crash) are `cargo bench --bench faults`; the queue
//! comparison with graphile-worker is `cargo bench --bench comparison`.

mod driver;
mod keepers;
mod keepers_db;
mod keepers_probe;
mod keepers_report;
mod routes;
mod scenario;
mod soak;
mod soak_db;
mod soak_ingest;
mod soak_report;
mod soak_target;

use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use clap::Parser;
use hookgate::config::{Config, StoreConfig};
use hookgate::startup::Application;
use hookgate::worker::HttpDelivery;
use hookgate_kit::target::{Behaviour, Setup, Target};

use scenario::{Scenario, DUPLICATE_KEYS};

#[derive(Debug, Clone, Parser)]
pub(crate) struct Args {
    /// unique, duplicate, mixed, hot, hot_fail, slow_target, bare, soak, keepers, routes, or
    /// all (the soak, keepers and routes are not part of all).
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// How long each scenario runs (default 10s; the soak, three times its retention).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Most requests per scenario.
    #[arg(long, default_value_t = 5_000_000)]
    requests: u64,
    /// postgres or sqlite (default sqlite; the keepers scenario runs on postgres only).
    #[arg(long)]
    store: Option<String>,
    /// Shard actors (default: hookgate's default).
    #[arg(long)]
    shards: Option<usize>,
    /// HTTP worker threads (default: hookgate's default).
    #[arg(long)]
    http_workers: Option<usize>,
    /// The node's `server.keep_alive` (default: hookgate's default, 5 s; 0s: off).
    #[arg(long, value_parser = humantime::parse_duration)]
    keep_alive: Option<Duration>,
    /// Drive a running hookgate at this `…/webhooks/{provider}` URL instead.
    #[arg(long)]
    url: Option<String>,
    /// Address the bench's target binds (give a fixed port with `--url`).
    #[arg(long, default_value = "127.0.0.1:0")]
    target_listen: String,
    /// Print the rate and the latency (p50, p99, max) of every window of this length while
    /// a scenario runs (long trend runs: do they hold as the table grows?); the soak's
    /// report interval (default 60s).
    #[arg(long, value_parser = humantime::parse_duration)]
    window: Option<Duration>,
    /// New events a second in the soak (default 500; 0: as fast as the connections go), or
    /// requests a second in `routes` and the other scenarios (default: as fast as the
    /// connections go; a fixed rate compares CPU per event at one throughput).
    #[arg(long)]
    rate: Option<u64>,
    /// Bytes of each event's JSON body (padded with a `pad` field; default: the bare
    /// `{"id","type"}` body, some 40 bytes).
    #[arg(long)]
    payload_bytes: Option<usize>,
    /// The soak's delivery mode: sync (senders redeliver) or queue (hookgate redelivers).
    #[arg(long, default_value = "sync")]
    mode: String,
    /// The soak's prefill: done rows written before the run, spread over the last week.
    #[arg(long, default_value_t = 100_000)]
    prefill: u64,
    /// The soak's `retention.done` (default 10m; the config's 72 h floor is the
    /// deployment's rule, not the bench's).
    #[arg(long, value_parser = humantime::parse_duration)]
    retention: Option<Duration>,
    /// The soak node's `retention.done` when it should differ from `--retention`, which
    /// the checks expect: a huge one (365d) shows that the growth checks fail.
    #[arg(long, value_parser = humantime::parse_duration)]
    node_retention: Option<Duration>,
    /// The soak's `retention.sweep_interval` (default a tenth of the retention, at most
    /// half a window, at least 1s).
    #[arg(long, value_parser = humantime::parse_duration)]
    sweep_interval: Option<Duration>,
    /// The soak's redelivery phase: after the first runs, this long at the same rate of
    /// redeliveries of prefilled keys within retention (duplicates the node's cache never
    /// saw, answered from their rows).
    #[arg(long, value_parser = humantime::parse_duration)]
    redeliver: Option<Duration>,
    /// The soak counts no rows each window (for runs on tens of millions of rows, where
    /// the counts' scans would take a core); the growth and prefill checks are then not
    /// judged, and the disk is the node's table bytes.
    #[arg(long)]
    no_counts: bool,
    /// The keepers scenario's dead letters, left by an outage before the run (default 300).
    #[arg(long)]
    dead: Option<u64>,
    /// Bytes of each of the keepers scenario's dead letters (`256KiB`, `1MiB`, or a number;
    /// default 256KiB).
    #[arg(long, value_parser = parse_bytes)]
    dead_bytes: Option<usize>,
    /// The keepers scenario: hold the clock while the emptying moves the dead letters
    /// (some in the keep slot, some still in their slot), so a window need not be long
    /// enough for the moves of an outage of gigabytes (by hand: 20 GiB).
    #[arg(long)]
    hold_while_moving: bool,
    /// The keepers scenario's `store.statement_timeout` (default: hookgate's, 5 s).
    #[arg(long, value_parser = humantime::parse_duration)]
    statement_timeout: Option<Duration>,
    /// The keepers scenario's `retention.sweep_batch` (default: hookgate's, 1000).
    #[arg(long)]
    sweep_batch: Option<u32>,
    /// cargo bench passes --bench; accepted and ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

impl Args {
    /// The store the scenario runs on: `--store`, or SQLite.
    pub(crate) fn store(&self) -> &str {
        self.store.as_deref().unwrap_or("sqlite")
    }
}

/// A byte size as `--dead-bytes` takes it: `256KiB`, `1MiB`, `1000`.
fn parse_bytes(text: &str) -> Result<usize, String> {
    let size: bytesize::ByteSize = text.parse()?;
    usize::try_from(size.as_u64()).map_err(|e| e.to_string())
}

/// How long a scenario runs unless `--duration` says otherwise.
pub(crate) const DURATION: Duration = Duration::from_secs(10);

/// The allocator hookgate's binary uses (src/main.rs), so the bench measures what ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args = Args::parse();
    if args.scenario == "soak" {
        if !soak::run(&args) {
            eprintln!("FAILED: the soak's checks (see the lines marked FAIL)");
            std::process::exit(1);
        }
        return;
    }
    if args.scenario == "keepers" {
        if !keepers::run(&args) {
            eprintln!("FAILED: the keepers scenario's checks (see the lines marked FAIL)");
            std::process::exit(1);
        }
        return;
    }
    if args.scenario == "routes" {
        if actix_rt::System::new().block_on(routes::run(&args)) > 0 {
            eprintln!("FAILED: the targets saw duplicate deliveries");
            std::process::exit(1);
        }
        return;
    }
    let scenarios: Vec<Scenario> = if args.scenario == "all" {
        Scenario::ALL.to_vec()
    } else {
        args.scenario
            .split(',')
            .map(|s| Scenario::parse(s).unwrap_or_else(|| panic!("unknown scenario {s}")))
            .collect()
    };
    println!(
        "# hookgate load bench: store={} connections={} duration={:?} cpus={}",
        args.store(),
        args.connections,
        args.duration.unwrap_or(DURATION),
        hookgate::config::cpus()
    );
    let mut duplicates = 0;
    for scenario in scenarios {
        duplicates += actix_rt::System::new().block_on(run(&args, scenario));
    }
    if duplicates > 0 {
        eprintln!("FAILED: the target saw {duplicates} duplicate deliveries");
        std::process::exit(1);
    }
}

/// Runs one scenario on a fresh store; answers the duplicates seen.
async fn run(args: &Args, scenario: Scenario) -> u64 {
    let behaviour = match scenario {
        Scenario::HotFail => Behaviour::Flaky(0.2),
        Scenario::SlowTarget | Scenario::Overload => Behaviour::Slow(Duration::from_millis(50)),
        _ => Behaviour::Accept,
    };
    let target = Target::start_with(Setup::bench(&args.target_listen), behaviour).await;
    let (url, node, sqlite_file) = match (&args.url, scenario) {
        (Some(url), _) => {
            println!("# driving {url}; its target must be {}", target.url);
            (url.clone(), None, None)
        }
        (None, Scenario::Bare) => (bare_handler(), None, None),
        (None, _) => {
            let (config, file) = config(args, scenario.name(), &target.url);
            let (port, handle) = start(&config).await;
            let url = format!("http://127.0.0.1:{port}/webhooks/bench");
            (url, Some(handle), file)
        }
    };
    if scenario == Scenario::Duplicate {
        // Deliver the repeated keys once, so the run measures duplicate_done only.
        let client = awc::Client::new();
        for k in 0..DUPLICATE_KEYS {
            let key = format!("dup-{k}");
            let _ = client
                .post(&url)
                .insert_header(("Content-Type", "application/json"))
                .insert_header(("X-Idempotency-Key", key.as_str()))
                .send_body(format!(r#"{{"id":"{key}","type":"bench.event"}}"#))
                .await;
        }
    }
    // Overload: four times the connections the node's workers can serve.
    let connections = match scenario {
        Scenario::Overload => 4 * args.connections,
        _ => args.connections,
    };
    let (duration, requests, window, rate, payload_bytes) = (
        args.duration.unwrap_or(DURATION),
        args.requests,
        args.window,
        args.rate,
        args.payload_bytes,
    );
    let drive_url = url.clone();
    let report = actix_rt::task::spawn_blocking(move || {
        actix_rt::System::new().block_on(driver::drive(
            vec![drive_url],
            scenario,
            connections,
            duration,
            window,
            driver::Requests {
                max: requests,
                rate,
                payload_bytes,
            },
        ))
    })
    .await
    .expect("driver thread");
    let tally = target.tally();
    let not_started = match &node {
        Some(_) => not_started(&url).await,
        None => 0,
    };
    let statuses: Vec<String> = report
        .statuses
        .iter()
        .map(|(s, n)| format!("{s}:{n}"))
        .collect();
    println!(
        "scenario={:<11} store={:<8} rps={:>8.0} p50={:>7.2}ms p99={:>7.2}ms max={:>8.2}ms \
         requests={} errors={} status={{{}}} deliveries={} duplicates={} not_started={} \
         rss={}MiB",
        scenario.name(),
        if scenario == Scenario::Bare {
            "-"
        } else {
            args.store()
        },
        report.rps(),
        report.p50_ms(),
        report.p99_ms(),
        report.max_ms(),
        report.requests,
        report.errors,
        statuses.join(","),
        tally.deliveries,
        tally.duplicates,
        not_started,
        rss_mib(),
    );
    if let Some(handle) = node {
        handle.stop().await;
    }
    if let Some(file) = sqlite_file {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{file}{suffix}"));
        }
    }
    tally.duplicates
}

/// hookgate in this process on `config`'s store, opened and migrated: its port and stopper.
pub(crate) async fn start(config: &Config) -> (u16, hookgate::startup::Stopper) {
    let store = hookgate::store::open(&config.store)
        .await
        .expect("open the store");
    store.migrate().await.expect("migrate");
    start_on(config, store).await
}

/// hookgate in this process on `store` (migrated): its port and stopper.
pub(crate) async fn start_on(
    config: &Config,
    store: Arc<dyn hookgate::store::Store>,
) -> (u16, hookgate::startup::Stopper) {
    let app = Application::build(
        config,
        store,
        Arc::new(HttpDelivery),
        hookgate::logging::discard(),
    )
    .await
    .expect("start hookgate");
    let port = app.port();
    let handle = app.stopper();
    actix_rt::spawn(app.run_until_stopped());
    (port, handle)
}

/// hookgate's config for one scenario: a provider `bench` keyed by header, on a fresh
/// Postgres schema or SQLite file. Answers the SQLite file to remove afterwards.
pub(crate) fn config(args: &Args, scenario: &str, target: &str) -> (Config, Option<String>) {
    let mut config = Config::from_toml(&format!(
        r#"
        [server]
        listen = "127.0.0.1:0"
        mailbox_capacity = 4096
        [[providers]]
        name = "bench"
        preset = "none"
        key = [{{ header = "X-Idempotency-Key" }}]
        target = {{ url = "{target}", timeout = "10s" }}
        "#
    ))
    .expect("bench config");
    config.server.shards = args.shards.or(config.server.shards);
    config.server.http_workers = args.http_workers.or(config.server.http_workers);
    config.server.keep_alive = args.keep_alive.unwrap_or(config.server.keep_alive);
    let unique = format!(
        "bench_{}_{}_{}",
        scenario,
        std::process::id(),
        fastrand::u32(..)
    );
    let mut sqlite_file = None;
    config.store = match args.store() {
        "postgres" => StoreConfig {
            url: std::env::var("HOOKGATE_BENCH_DATABASE_URL").expect(
                "--store postgres needs HOOKGATE_BENCH_DATABASE_URL (see scripts/bench.sh)",
            ),
            schema: unique,
            pool_size: 16,
            ..StoreConfig::default()
        },
        "sqlite" => {
            let file = std::env::temp_dir()
                .join(format!("{unique}.db"))
                .display()
                .to_string();
            sqlite_file = Some(file.clone());
            StoreConfig {
                url: format!("sqlite://{file}"),
                ..StoreConfig::default()
            }
        }
        other => panic!("--store must be postgres or sqlite, not {other}"),
    };
    (config, sqlite_file)
}

/// The reference: a bare actix-web handler answering a fixed body, as hookgate's duplicate
/// path does, on the same number of HTTP workers.
fn bare_handler() -> String {
    let server = HttpServer::new(|| {
        App::new().route(
            "/webhooks/bench",
            // Reads the body, as hookgate does; a handler that leaves it unread makes
            // actix-web close the connection, which would flatter hookgate.
            web::post().to(|_body: web::Bytes| async {
                HttpResponse::Ok()
                    .content_type("application/json")
                    .body(r#"{"ok":true}"#)
            }),
        )
    })
    .workers(hookgate::config::cpus())
    .disable_signals()
    .bind("127.0.0.1:0")
    .expect("bind the bare handler");
    let port = server.addrs()[0].port();
    actix_rt::spawn(server.run());
    format!("http://127.0.0.1:{port}/webhooks/bench")
}

/// Attempts the node released because they could not start inside their lease (its
/// `hookgate_deliveries_total{outcome="not_started"}`): 0 means admission held.
async fn not_started(url: &str) -> u64 {
    let metrics = url.replace("/webhooks/bench", "/metrics");
    let Ok(mut response) = awc::Client::new().get(&metrics).send().await else {
        return 0;
    };
    let body = response.body().limit(1 << 22).await.unwrap_or_default();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with("hookgate_deliveries_total") && l.contains("not_started"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// This process's resident memory.
fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}
