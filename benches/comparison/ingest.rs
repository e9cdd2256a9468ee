//! `--scenario ingest`: hookgate in queue mode taking new events while it delivers them.
//! `connections` closed-loop senders POST new keys to the release binary for `duration`;
//! the bench notes when each 202 came back, the target when each key first arrived. At
//! the end: the rates, the backlog (accepted, not yet at the target), then a bounded drain
//! and the 202→target latency of every accepted key. CPU and commits are measured from
//! before the node starts until its graceful stop after the drain, per accepted event.

use std::time::{Duration, Instant};

use crate::compare_hookgate::{self as hookgate, Sizing, PROVIDER};
use crate::compare_meter::Cost;
use crate::compare_meter::Meter;
use hookgate_kit::target::{Behaviour, Setup, Target};

use crate::PAUSE;

/// What an ingest run measured.
#[derive(Debug)]
pub struct Ingest {
    pub accepted: u64,
    pub refused: u64,
    pub errors: u64,
    pub accepted_per_s: f64,
    /// Keys first delivered while the senders ran, a second.
    pub delivered_per_s: f64,
    /// Accepted keys not at the target when the senders stopped.
    pub backlog: u64,
    /// From the senders' stop to the target's last new key.
    pub drained_s: f64,
    /// Accepted keys the target never had within the drain.
    pub never_delivered: u64,
    /// Pauses of the target's new keys longer than [`PAUSE`](crate::PAUSE), and their total length.
    pub pauses: (u64, Duration),
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The outcome-write p99, interpolated within its bucket (see
    /// [`hookgate_kit::node::outcome_write_p99_ms`]).
    pub write_p99_ms: Option<f64>,
    pub duplicates: u64,
    pub cost: Cost,
}

/// Longest wait, after the senders stop, for the target to have every accepted key.
const DRAIN: Duration = Duration::from_secs(300);

/// How often the bench looks at the target's count during the drain.
const POLL: Duration = Duration::from_millis(5);

/// What the senders saw.
#[derive(Default)]
struct Sent {
    /// Keys answered 202, with when the answer's head arrived.
    accepted: Vec<(String, Instant)>,
    /// Answers other than 202 (503 `overloaded` when a shard has no room).
    refused: u64,
    errors: u64,
}

/// Runs the ingest-and-deliver run on the cluster at `admin_url`, in database `database`.
pub async fn run(
    admin_url: &str,
    database: &str,
    sizing: Sizing,
    connections: usize,
    duration: Duration,
    rate: Option<f64>,
) -> Ingest {
    let meter = Meter::create(admin_url, database).await;
    let target = Target::start_with(Setup::bench("127.0.0.1:0"), Behaviour::Accept).await;
    let dir = hookgate::run_dir(database);
    let mut node = hookgate::prepare(&dir, &meter.url, &target.url, sizing);
    meter.settle().await;
    let before = meter.sample().await;
    node.start().await;
    let url = format!("http://127.0.0.1:{}/webhooks/{PROVIDER}", node.port);
    let started = Instant::now();
    let sent = actix_rt::task::spawn_blocking(move || {
        actix_rt::System::new().block_on(send(url, connections, duration, rate))
    })
    .await
    .expect("sender thread");
    let ended = Instant::now();
    let keys: Vec<String> = sent
        .accepted
        .iter()
        .map(|(k, _)| format!("{PROVIDER}:{k}"))
        .collect();
    let at_end = target.first_arrivals(keys.iter().map(String::as_str));
    let delivered_by_end = at_end.iter().flatten().filter(|&&t| t <= ended).count();

    let limit = ended + DRAIN;
    while target.keys() < keys.len() && Instant::now() < limit {
        actix_rt::time::sleep(POLL).await;
    }
    let drained = target
        .last_new()
        .map_or(0.0, |t| t.saturating_duration_since(ended).as_secs_f64());
    let arrivals = target.first_arrivals(keys.iter().map(String::as_str));
    let mut latencies: Vec<Duration> = sent
        .accepted
        .iter()
        .zip(&arrivals)
        .filter_map(|((_, accepted), arrived)| {
            Some(arrived.as_ref()?.saturating_duration_since(*accepted))
        })
        .collect();
    latencies.sort_unstable();
    let never = keys.len() - latencies.len();
    let write_p99_ms = hookgate_kit::node::outcome_write_p99_ms(node.port).await;
    node.terminate().await;
    meter.settle().await;
    let after = meter.sample().await;
    let duplicates = target.tally().duplicates;
    let elapsed = (ended - started).as_secs_f64();
    let percentile = |p: f64| {
        let i = ((latencies.len().max(1) - 1) as f64 * p).round() as usize;
        latencies.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    println!("# logs of {database}: {}", dir.display());
    Ingest {
        accepted: keys.len() as u64,
        refused: sent.refused,
        errors: sent.errors,
        accepted_per_s: keys.len() as f64 / elapsed,
        delivered_per_s: delivered_by_end as f64 / elapsed,
        backlog: (keys.len() - delivered_by_end) as u64,
        drained_s: drained,
        never_delivered: never as u64,
        pauses: target.pauses(PAUSE),
        p50_ms: percentile(0.50),
        p99_ms: percentile(0.99),
        write_p99_ms,
        duplicates,
        cost: after.cost_since(&before, keys.len() as u64),
    }
}

/// `connections` senders, each on its own keep-alive connection, posting new keys until
/// `duration` has passed: closed loop, or at `rate` events a second over all of them.
async fn send(url: String, connections: usize, duration: Duration, rate: Option<f64>) -> Sent {
    let start = Instant::now();
    let deadline = start + duration;
    // Each sender's gap between posts at the offered rate; the senders start staggered.
    let gap = rate.map(|r| Duration::from_secs_f64(connections as f64 / r.max(0.001)));
    let tasks: Vec<_> = (0..connections)
        .map(|conn| {
            let url = url.clone();
            actix_rt::spawn(async move {
                let client = awc::Client::builder()
                    .timeout(Duration::from_secs(60))
                    .finish();
                let mut sent = Sent::default();
                for i in 0u64.. {
                    if let Some(gap) = gap {
                        let offset = gap.mul_f64(conn as f64 / connections as f64);
                        let due = start + offset + gap.mul_f64(i as f64);
                        actix_rt::time::sleep_until(due.into()).await;
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                    let key = format!("i{conn}-{i}");
                    let body = format!(r#"{{"id":"{key}","type":"bench.event"}}"#);
                    let result = client
                        .post(&url)
                        .insert_header(("Content-Type", "application/json"))
                        .insert_header(("X-Idempotency-Key", key.as_str()))
                        .send_body(body)
                        .await;
                    match result {
                        Ok(mut response) => {
                            let at = Instant::now();
                            let _ = response.body().await;
                            if response.status().as_u16() == 202 {
                                sent.accepted.push((key, at));
                            } else {
                                sent.refused += 1;
                            }
                        }
                        Err(_) => sent.errors += 1,
                    }
                }
                sent
            })
        })
        .collect();
    let mut total = Sent::default();
    for task in tasks {
        let Ok(sent) = task.await else { continue };
        total.accepted.extend(sent.accepted);
        total.refused += sent.refused;
        total.errors += sent.errors;
    }
    total
}
