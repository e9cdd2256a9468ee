//! The queue comparison, hookgate's queue mode beside graphile-worker on one Postgres
//! cluster and one target: `--scenario burndown` (see `burndown.rs`) and `--scenario
//! ingest` (hookgate only; see `ingest.rs`). One result line a run, `QC key=value …`, which scripts/queue-compare.sh turns
//! into a table. Postgres only: `HOOKGATE_BENCH_DATABASE_URL` names the cluster (the
//! bench connects as a superuser to its maintenance database and makes a database a run).
//!
//! `cargo bench --bench comparison -- --scenario burndown --system hookgate|graphile
//! [--events 50000] [--shards N] [--workers-per-shard N] [--pool-size N] [--poll-interval D]
//! [--concurrency 32] [--local-queue 500] [--label NAME]`;
//! `cargo bench --bench comparison -- --scenario ingest [--connections 64] [--duration 60s] …`.

mod burndown;
mod compare_graphile;
mod compare_hookgate;
mod compare_meter;
mod ingest;

use std::time::Duration;

use clap::Parser;

use crate::burndown::{Burndown, System};
use crate::compare_graphile::Sizing as GraphileSizing;
use crate::compare_hookgate::Sizing as HookgateSizing;
use crate::ingest::Ingest;

/// The binary hookgate's runs start.
const BINARY: &str = env!("CARGO_BIN_EXE_hookgate");

/// A gap between two new keys at the target longer than this is reported as a pause: at
/// a thousand deliveries a second and more, a quarter second without one is no accident.
const PAUSE: Duration = Duration::from_millis(250);

/// The allocator hookgate's binary uses (src/main.rs), as the load bench does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
struct Args {
    /// burndown or ingest.
    #[arg(long)]
    scenario: String,
    /// burndown: hookgate or graphile.
    #[arg(long, default_value = "hookgate")]
    system: String,
    /// Names the run in the result line and its database (`qc_<label>`).
    #[arg(long)]
    label: Option<String>,
    /// burndown: events written before the workers start.
    #[arg(long, default_value_t = 50_000)]
    events: u64,
    /// hookgate: `server.shards` (default: hookgate's).
    #[arg(long)]
    shards: Option<usize>,
    /// hookgate: `server.workers_per_shard` (default: hookgate's).
    #[arg(long)]
    workers_per_shard: Option<usize>,
    /// hookgate: `store.pool_size` (default: hookgate's).
    #[arg(long)]
    pool_size: Option<usize>,
    /// hookgate: `queue.poll_interval` (default: hookgate's).
    #[arg(long, value_parser = humantime::parse_duration)]
    poll_interval: Option<Duration>,
    /// graphile-worker: jobs at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// graphile-worker: `localQueue.size`.
    #[arg(long, default_value_t = 500)]
    local_queue: usize,
    /// ingest: concurrent senders.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// ingest: events a second offered over all senders (open loop: each sender posts on
    /// its own schedule, later when an answer is slow); none: as fast as answers come.
    #[arg(long)]
    rate: Option<f64>,
    /// ingest: how long the senders post.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// cargo bench passes --bench; accepted and ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Runs one comparison; exits non-zero on a duplicate or an event not finished.
fn main() {
    let args = Args::parse();
    let admin_url = std::env::var("HOOKGATE_BENCH_DATABASE_URL")
        .expect("the queue comparison runs on Postgres: set HOOKGATE_BENCH_DATABASE_URL");
    let hookgate = HookgateSizing {
        shards: args.shards,
        workers_per_shard: args.workers_per_shard,
        pool_size: args.pool_size,
        poll_interval: args.poll_interval,
    };
    let label = args.label.clone().unwrap_or_else(|| args.system.clone());
    let database = format!("qc_{label}");
    let system = actix_rt::System::new();
    let failed = if args.scenario == "ingest" {
        let run = system.block_on(ingest::run(
            &admin_url,
            &database,
            hookgate,
            args.connections,
            args.duration,
            args.rate,
        ));
        print_ingest(&label, &run);
        run.duplicates > 0 || run.never_delivered > 0
    } else {
        let worker = match args.system.as_str() {
            "hookgate" => System::Hookgate(hookgate),
            "graphile" => System::Graphile(GraphileSizing {
                concurrency: args.concurrency,
                local_queue: args.local_queue,
            }),
            other => panic!("--system must be hookgate or graphile, not {other}"),
        };
        let run = system.block_on(burndown::run(&admin_url, &database, args.events, worker));
        print_burndown(&label, &args.system, &run);
        run.duplicates > 0 || run.unfinished > 0 || run.delivered < run.events
    };
    if failed {
        std::process::exit(1);
    }
}

fn print_burndown(label: &str, system: &str, run: &Burndown) {
    println!(
        "QC scenario=burndown label={label} system={system} events={} delivered={} \
         deliveries={} duplicates={} unfinished={} seconds={:.2} first_s={:.3} pauses={} paused_s={:.2} rate={:.0} \
         pg_us={:.1} worker_us={:.1} commits={:.3} write_p99_ms={}",
        run.events,
        run.delivered,
        run.deliveries,
        run.duplicates,
        run.unfinished,
        run.seconds,
        run.first_s,
        run.pauses.0,
        run.pauses.1.as_secs_f64(),
        run.delivered as f64 / run.seconds,
        run.cost.postgres_us,
        run.cost.worker_us,
        run.cost.commits,
        run.write_p99_ms.map_or("-".into(), |ms| format!("{ms:.1}")),
    );
}

fn print_ingest(label: &str, run: &Ingest) {
    println!(
        "QC scenario=ingest label={label} system=hookgate accepted={} refused={} errors={} \
         accepted_rate={:.0} delivered_rate={:.0} backlog={} drained_s={:.2} never={} \
         pauses={} paused_s={:.2} \
         p50_ms={:.2} p99_ms={:.2} write_p99_ms={} duplicates={} pg_us={:.1} worker_us={:.1} \
         commits={:.3}",
        run.accepted,
        run.refused,
        run.errors,
        run.accepted_per_s,
        run.delivered_per_s,
        run.backlog,
        run.drained_s,
        run.never_delivered,
        run.pauses.0,
        run.pauses.1.as_secs_f64(),
        run.p50_ms,
        run.p99_ms,
        run.write_p99_ms.map_or("-".into(), |ms| format!("{ms:.1}")),
        run.duplicates,
        run.cost.postgres_us,
        run.cost.worker_us,
        run.cost.commits,
    );
}
