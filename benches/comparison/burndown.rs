//! `--scenario burndown`: the queue comparison's burn-down (50,000 events already durable,
//! then the workers start, until the target has them all; CPU from /proc), for hookgate or graphile-worker on the
//! same cluster and target. The events are written first (hookgate: queue rows as an
//! accepted request leaves them; graphile-worker: jobs through its `addJobs`), vacuumed,
//! analyzed and checkpointed; then the meter samples, the worker starts, and the run ends
//! when the target has every key — the rate's end. The worker is then SIGTERMed, its
//! sessions end, and the meter samples again: the CPU and commits are the worker's whole
//! life, its start and graceful stop included.

use std::process::Child;
use std::time::{Duration, Instant};

use crate::compare_graphile as graphile;
use crate::compare_hookgate as hookgate;
use crate::compare_meter::Cost;
use crate::compare_meter::Meter;
use hookgate_kit::target::{Behaviour, Setup, Target};

use crate::PAUSE;
use hookgate_kit::node::Node;

/// Which worker a burn-down runs, and how.
#[derive(Debug, Clone, Copy)]
pub enum System {
    Hookgate(hookgate::Sizing),
    Graphile(graphile::Sizing),
}

/// What a burn-down measured.
#[derive(Debug)]
pub struct Burndown {
    /// hookgate: the p99 of the target's answer → the outcome written, ms.
    pub write_p99_ms: Option<f64>,
    pub events: u64,
    /// Distinct keys the target had at the end.
    pub delivered: u64,
    pub deliveries: u64,
    /// Keys the target received more than once.
    pub duplicates: u64,
    /// Rows (hookgate) or jobs (graphile-worker) not finished after the worker stopped.
    pub unfinished: i64,
    /// From starting the worker to the target's last new key.
    pub seconds: f64,
    /// From starting the worker to the target's first key (its start-up).
    pub first_s: f64,
    /// Pauses of the target's new keys longer than [`PAUSE`](crate::PAUSE), and their total length.
    pub pauses: (u64, Duration),
    pub cost: Cost,
}

/// Longest wait for the target to have every key.
const BOUND: Duration = Duration::from_secs(600);

/// How often the bench looks at the target's count (in-process; no query).
const POLL: Duration = Duration::from_millis(5);

/// The worker of a run: hookgate's node, or graphile-worker's process once started.
enum Worker {
    Hookgate(Node),
    Graphile(graphile::Sizing, Option<Child>),
}

/// Runs one burn-down of `events` on the cluster at `admin_url`, in database `database`.
pub async fn run(admin_url: &str, database: &str, events: u64, system: System) -> Burndown {
    let meter = Meter::create(admin_url, database).await;
    let target = Target::start_with(Setup::bench("127.0.0.1:0"), Behaviour::Accept).await;
    let dir = hookgate::run_dir(database);
    let mut worker = match system {
        System::Hookgate(sizing) => {
            let node = hookgate::prepare(&dir, &meter.url, &target.url, sizing);
            hookgate::preload(&meter.url, events).await;
            meter.quiesce(&hookgate::table()).await;
            Worker::Hookgate(node)
        }
        System::Graphile(sizing) => {
            graphile::prepare(&meter.url, events);
            meter.quiesce(graphile::TABLE).await;
            Worker::Graphile(sizing, None)
        }
    };

    let before = meter.sample().await;
    let started = Instant::now();
    match &mut worker {
        Worker::Hookgate(node) => node.start().await,
        Worker::Graphile(sizing, child) => {
            *child = Some(graphile::start(&dir, &meter.url, &target.url, *sizing));
        }
    }
    let limit = started + BOUND;
    while (target.keys() as u64) < events && Instant::now() < limit {
        actix_rt::time::sleep(POLL).await;
    }
    let until_all = target.last_new().unwrap_or_else(Instant::now) - started;
    let until_first = target.first().unwrap_or_else(Instant::now) - started;
    let delivered = target.keys() as u64;
    let mut write_p99_ms = None;
    match worker {
        Worker::Hookgate(mut node) => {
            write_p99_ms = hookgate_kit::node::outcome_write_p99_ms(node.port).await;
            node.terminate().await;
        }
        Worker::Graphile(_, Some(child)) => graphile::stop(child).await,
        Worker::Graphile(_, None) => {}
    }
    meter.settle().await;
    let after = meter.sample().await;
    let hookgate_kit::target::Tally {
        deliveries,
        duplicates,
    } = target.tally();
    let unfinished = match system {
        System::Hookgate(_) => hookgate::unfinished(&meter.url).await,
        System::Graphile(_) => graphile::unfinished(&meter.url).await,
    };
    println!("# logs of {database}: {}", dir.display());
    Burndown {
        events,
        delivered,
        deliveries,
        duplicates,
        unfinished,
        seconds: until_all.as_secs_f64(),
        first_s: until_first.as_secs_f64(),
        pauses: target.pauses(PAUSE),
        cost: after.cost_since(&before, events),
        write_p99_ms,
    }
}
