//! hookgate's fault runs: pass/fail programs that run the release binary as child
//! processes, inject faults while real-sender-like clients deliver, and judge the delivery
//! guarantee from the target's record, the nodes' logs and the rows. Postgres only.
//!
//! `cargo bench --bench faults -- --scenario chaos [--mode sync|queue] [--duration D]
//! [--rate N]`: faults (the store's network cut, frozen and slowed, nodes SIGKILLed and
//! restarted, operators' replays) under load; see `chaos.rs`, and `chaos_queue.rs` for
//! queue mode's two nodes. Needs `HOOKGATE_BENCH_DATABASE_URL`.
//!
//! `cargo bench --bench faults -- --scenario failover [--mode sync|queue]`: starts its own
//! primary + synchronous standby pair (scripts/pg-ha.sh), runs the binary on it through a
//! multi-host URL, and kills the primary and promotes the standby mid-run; see
//! `failover.rs`.
//!
//! `cargo bench --bench faults -- --scenario patroni --case kill|switchover|rejoin|lose-sync
//! [--replication sync|strict|async] [--mode sync|queue]`: the same run on a three-member Patroni cluster on etcd
//! (scripts/pg-patroni.sh, installing what it needs), Patroni promoting; see `patroni.rs`.
//!
//! `cargo bench --bench faults -- --scenario crash [--events 300] [--target-ms 50]`:
//! queue mode's crash window, two nodes, a burst of events, one node SIGKILLed mid-burst;
//! see `crash_window.rs`. Needs `HOOKGATE_BENCH_DATABASE_URL`.
//!
//! Each run exits non-zero on any violation, and prints what it saw.

mod chaos;
mod chaos_attempts;
mod chaos_logs;
mod chaos_operator;
mod chaos_queue;
mod chaos_report;
mod chaos_rows;
mod chaos_senders;
mod chaos_target;
mod crash_window;
mod failover;
mod failover_report;
mod patroni;

use std::time::Duration;

use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    /// chaos, failover or crash.
    #[arg(long)]
    scenario: String,
    /// The delivery mode: sync (senders redeliver) or queue (hookgate redelivers; the chaos
    /// run with two nodes). Not the crash run's, which is queue mode's.
    #[arg(long, default_value = "sync")]
    mode: String,
    /// How long the senders send (default: the chaos run 10s, in queue mode 45s plus its
    /// drain; the failover run 20s).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// New events a second (default: the chaos run 100, in queue mode 40, which two nodes
    /// on two shared cores carry with room for the slow answers; the failover run 50).
    #[arg(long)]
    rate: Option<u64>,
    /// Events posted at once in the crash run.
    #[arg(long, default_value_t = 300)]
    events: u64,
    /// How long the crash run's target takes to answer, in ms.
    #[arg(long, default_value_t = 50)]
    target_ms: u64,
    /// The Patroni run's fault: kill (the leader SIGKILLed), switchover (planned), rejoin
    /// (the killed leader back as a replica), lose-sync (the synchronous standby lost, then
    /// the leader).
    #[arg(long, default_value = "kill")]
    case: String,
    /// The Patroni run's replication: sync (`synchronous_mode`), strict
    /// (`synchronous_mode_strict`) or async (no synchronous standby: what a failover loses).
    #[arg(long, default_value = "sync")]
    replication: String,
    /// cargo bench passes --bench; accepted and ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The binary every run starts.
const BINARY: &str = env!("CARGO_BIN_EXE_hookgate");

fn main() {
    let args = Args::parse();
    let queue = match args.mode.as_str() {
        "sync" => false,
        "queue" => true,
        other => panic!("--mode must be sync or queue, not {other}"),
    };
    let system = actix_rt::System::new();
    let (violations, what) = match args.scenario.as_str() {
        "failover" | "patroni" => {
            let case = match args.scenario.as_str() {
                "failover" => patroni::Case::Promote,
                _ => patroni::Case::parse(&args.case).unwrap_or_else(|| {
                    panic!("--case must be kill, switchover, rejoin or lose-sync")
                }),
            };
            (
                system.block_on(failover::run(
                    queue,
                    args.duration.unwrap_or(Duration::from_secs(20)),
                    args.rate.unwrap_or(50),
                    case,
                    &args.replication,
                )),
                "across the failover",
            )
        }
        "crash" => (
            system.block_on(crash_window::run(
                database_url("crash"),
                args.events,
                args.target_ms,
            )),
            "around the crash",
        ),
        "chaos" if queue => (
            system.block_on(chaos_queue::run(
                database_url("chaos"),
                args.duration.unwrap_or(Duration::from_secs(45)),
                args.rate.unwrap_or(40),
            )),
            "of the delivery guarantee",
        ),
        "chaos" => (
            system.block_on(chaos::run(
                database_url("chaos"),
                args.duration.unwrap_or(Duration::from_secs(10)),
                args.rate.unwrap_or(100),
            )),
            "of the delivery guarantee",
        ),
        other => panic!("--scenario must be chaos, failover, patroni or crash, not {other}"),
    };
    if violations > 0 {
        eprintln!("FAILED: {violations} violation(s) {what}");
        std::process::exit(1);
    }
}

/// The cluster a run uses.
fn database_url(scenario: &str) -> String {
    std::env::var("HOOKGATE_BENCH_DATABASE_URL").unwrap_or_else(|_| {
        panic!("--scenario {scenario} runs on Postgres: set HOOKGATE_BENCH_DATABASE_URL")
    })
}
