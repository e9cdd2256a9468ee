//! `--scenario routes [--mode sync|queue] [--rate EVENTS]`: what a route costs. Three shapes, each on a
//! fresh store, new keys for the run's duration, then until every (event, route) pair is
//! delivered:
//!
//! * `one_route` — one provider, one application;
//! * `three_routes` — one provider, its target and two more routes: the sender is answered
//!   by the target, the other two rows are written in the claim's commit and delivered by
//!   the scheduler;
//! * `three_providers` — three providers of one route each, the sender sending each event
//!   to all three (three requests an event);
//! * `past_main` — the provider of `three_routes` whose main route's filter refuses every
//!   event: the main route's row records it (`filtered`, answered 202) and the other two
//!   routes' rows, written with that claim, are delivered by the scheduler — what the
//!   event's record costs where the main route does not take the event.
//!
//! With `--rate`, events arrive at that pace (the sender's latency at one load for all three
//! shapes); without, as fast as the connections go (the most each shape delivers). One line
//! a shape: events a second, the sender's p50/p99, (event, route) pairs
//! delivered, the Postgres cluster's CPU per pair (Postgres runs), how long the queued pairs
//! took to drain after the load stopped, and duplicates at the targets.

use std::time::{Duration, Instant};

use hookgate::config::{Config, TargetConfig};
use hookgate_kit::proc_cpu::{self, TICKS_PER_SECOND};
use hookgate_kit::target::{Behaviour, Setup, Target};

use crate::scenario::Scenario;
use crate::{config, driver, Args, DURATION};

/// How a run's events reach their applications.
#[derive(Debug, Clone, Copy)]
enum Shape {
    OneRoute,
    ThreeRoutes,
    ThreeProviders,
    PastMain,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::OneRoute => "one_route",
            Shape::ThreeRoutes => "three_routes",
            Shape::ThreeProviders => "three_providers",
            Shape::PastMain => "past_main",
        }
    }

    /// Applications an event reaches.
    fn pairs(self) -> u64 {
        match self {
            Shape::OneRoute => 1,
            Shape::PastMain => 2,
            Shape::ThreeRoutes | Shape::ThreeProviders => 3,
        }
    }

    /// Targets it starts: one an application (the main route's, in `past_main`, is
    /// never sent anything).
    fn targets(self) -> u64 {
        match self {
            Shape::PastMain => 3,
            _ => self.pairs(),
        }
    }
}

/// Runs the three shapes; answers the duplicates seen.
pub async fn run(args: &Args) -> u64 {
    let mut duplicates = 0;
    let shapes = [
        Shape::OneRoute,
        Shape::ThreeRoutes,
        Shape::ThreeProviders,
        Shape::PastMain,
    ];
    for shape in shapes {
        duplicates += one(args, shape).await;
    }
    duplicates
}

/// The Postgres cluster's postmaster, when the run is on Postgres.
async fn postmaster(args: &Args) -> Option<u32> {
    if args.store() != "postgres" {
        return None;
    }
    let url = std::env::var("HOOKGATE_BENCH_DATABASE_URL").ok()?;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .ok()?;
    actix_rt::spawn(connection);
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .ok()?
        .get(0);
    proc_cpu::stat(backend as u32).map(|s| s.ppid)
}

async fn one(args: &Args, shape: Shape) -> u64 {
    let mut targets = Vec::new();
    for _ in 0..shape.targets() {
        targets.push(Target::start_with(Setup::bench("127.0.0.1:0"), Behaviour::Accept).await);
    }
    let (mut config, sqlite_file) = config(args, shape.name(), &targets[0].url);
    config.providers[0].mode = Some(match args.mode.as_str() {
        "queue" => hookgate::claim::Mode::Queue,
        _ => hookgate::claim::Mode::Sync,
    });
    shape_config(&mut config, shape, &targets);
    let (port, handle) = crate::start(&config).await;
    let urls: Vec<String> = config
        .providers
        .iter()
        .map(|p| format!("http://127.0.0.1:{port}/webhooks/{}", p.name))
        .collect();

    let postmaster = postmaster(args).await;
    let cpu_before = postmaster.map(proc_cpu::cluster_ticks);
    let (connections, duration, requests, rate) = (
        args.connections,
        args.duration.unwrap_or(DURATION),
        args.requests,
        args.rate,
    );
    // Requests an event takes: one, or one to each provider.
    let pairs_sent = match shape {
        Shape::ThreeProviders => 3,
        _ => 1,
    };
    let report = actix_rt::task::spawn_blocking(move || {
        actix_rt::System::new().block_on(driver::drive(
            urls,
            Scenario::Unique,
            connections,
            duration,
            None,
            driver::Requests {
                max: requests,
                rate: rate.map(|r| r * pairs_sent),
                payload_bytes: None,
            },
        ))
    })
    .await
    .expect("driver thread");
    // The queued routes' pairs are delivered after the load stops: the run ends when every
    // pair of every answered event has arrived (or a minute has passed).
    let answered_events = match shape {
        Shape::ThreeProviders => report.requests / 3,
        _ => report.requests,
    };
    let wanted = answered_events * shape.pairs();
    let stopped = Instant::now();
    let delivered = || targets.iter().map(|t| t.tally().deliveries).sum::<u64>();
    while delivered() < wanted && stopped.elapsed() < Duration::from_secs(60) {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = stopped.elapsed();
    let pairs = delivered();
    let cpu = match (postmaster, cpu_before) {
        (Some(pm), Some(before)) => {
            let ticks = proc_cpu::cluster_ticks(pm).saturating_sub(before);
            let us = ticks as f64 * 1e6 / TICKS_PER_SECOND;
            format!("{:.0}us", us / pairs.max(1) as f64)
        }
        _ => "-".into(),
    };
    let duplicates: u64 = targets.iter().map(|t| t.tally().duplicates).sum();
    let polls = metric(port, "hookgate_scheduler_polls_total").await;
    let taken = metric(port, "hookgate_queue_taken_total").await;
    println!(
        "scenario=routes:{:<15} store={:<8} mode={:<5} events/s={:>7.0} p50={:>6.2}ms p99={:>7.2}ms \
         requests={} pairs={} pg_cpu/pair={} drained_in={:.1}s scheduler_passes={} queue_taken={} \
         errors={} duplicates={}",
        shape.name(),
        args.store(),
        args.mode,
        answered_events as f64 / report.elapsed.as_secs_f64(),
        report.p50_ms(),
        report.p99_ms(),
        report.requests,
        pairs,
        cpu,
        drained.as_secs_f64(),
        polls,
        taken,
        report.errors,
        duplicates,
    );
    handle.stop().await;
    if let Some(file) = sqlite_file {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{file}{suffix}"));
        }
    }
    duplicates
}

/// The sum of a metric family's series on the node at `port`.
async fn metric(port: u16, family: &str) -> u64 {
    let url = format!("http://127.0.0.1:{port}/metrics");
    let Ok(mut response) = awc::Client::new().get(&url).send().await else {
        return 0;
    };
    let body = response.body().limit(1 << 22).await.unwrap_or_default();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with(family))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The bench's one provider as the shape wants it: as it is, with two more routes, or as
/// three providers of one route each.
fn shape_config(config: &mut Config, shape: Shape, targets: &[Target]) {
    let route = |name: &str, target: &Target, main: &TargetConfig| TargetConfig {
        name: Some(name.into()),
        url: target.url.clone(),
        ..main.clone()
    };
    let provider = config.providers[0].clone();
    match shape {
        Shape::OneRoute => {}
        Shape::ThreeRoutes => {
            let main = &provider.target;
            config.providers[0].routes =
                vec![route("b", &targets[1], main), route("c", &targets[2], main)];
        }
        Shape::PastMain => {
            let main = &provider.target;
            config.providers[0].routes =
                vec![route("b", &targets[1], main), route("c", &targets[2], main)];
            // The bench's bodies have no `/never`: the main route takes none of them.
            config.providers[0].target.filter = Some(hookgate::filter::Filter {
                all: vec![hookgate::filter::Condition {
                    json: Some("/never".into()),
                    exists: Some(true),
                    ..Default::default()
                }],
            });
        }
        Shape::ThreeProviders => {
            config.providers = targets
                .iter()
                .enumerate()
                .map(|(n, target)| {
                    let mut p = provider.clone();
                    p.name = format!("bench{n}");
                    p.target.url = target.url.clone();
                    p
                })
                .collect();
        }
    }
}
