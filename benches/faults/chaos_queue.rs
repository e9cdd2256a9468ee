//! `--scenario chaos --mode queue`: two nodes of the release binary on one Postgres schema
//! with the provider in queue mode — node A reaching Postgres directly, node B through the
//! bench's [`StoreProxy`] — while senders POST events, the target answers a mix of fast,
//! slow, throttling and failing answers, and the bench freezes B's database for longer
//! than the lease, SIGKILLs and restarts A, SIGTERMs and restarts B, and replays dead
//! letters with the command line and the admin API. Then the target heals, the rows drain,
//! and one report says whether the queue-mode invariant held. Answers the violations.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use crate::chaos_attempts::{judge, Unrecordable};
use crate::chaos_logs::{summarise, LogSummary};
use crate::chaos_operator::{Operator, ADMIN_TOKEN};
use crate::chaos_report::{print_nodes, Run};
use crate::chaos_rows::Rows;
use crate::chaos_senders::Senders;
use crate::chaos_target::ChaosTarget;
use hookgate_kit::node::{free_port, Node};
use hookgate_kit::proxy::StoreProxy;

/// The provider's name in the config and in every key's `Idempotency-Key`.
const PROVIDER: &str = "chaos";

/// Node B's database is frozen this long: longer than the lease (3 s, see [`config`]),
/// so B cannot renew the leases of the deliveries it has running.
const FREEZE: Duration = Duration::from_secs(5);

/// Every attempt starting this long before the freeze is slow, so B has deliveries open
/// at the target when its database stops answering.
const SLOW_BEFORE_FREEZE: Duration = Duration::from_secs(1);

/// Senders keep retrying an event this long after the last one was due.
const SENDER_TAIL: Duration = Duration::from_secs(15);

/// Longest wait, once the target is healthy, for every accepted row to be done or dead:
/// a row backed off to the cap (6 s) a few times over, plus slow answers, fits well inside.
const DRAIN: Duration = Duration::from_secs(90);

/// The drain gives up when no accepted row reached done or dead for this long.
const STUCK: Duration = Duration::from_secs(30);

/// Pause between two rounds of the operator's replays.
const REPLAY_EVERY: Duration = Duration::from_secs(3);

/// One node's config. Lease 3 s with an 8 s target timeout is queue mode's rule (renewal
/// every second); `retry.base` must exceed the lease, so 4 s, capped at 6 s, 4 attempts:
/// dead letters within ~20 s.
fn config(node: &str, port: u16, url: &str, schema: &str, target_port: u16) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
workers_per_shard = 16
[store]
url = "{url}"
schema = "{schema}"
pool_size = 8
pool_timeout = "1s"
statement_timeout = "1s"
[lease]
duration = "3s"
[retry]
base = "4s"
cap = "6s"
max_attempts = 4
[queue]
poll_interval = "100ms"
[shutdown]
grace = "10s"
[admin]
token_env = "HOOKGATE_ADMIN_TOKEN"
[[providers]]
name = "{PROVIDER}"
preset = "none"
mode = "queue"
key = [{{ header = "X-Idempotency-Key" }}]
target = {{ url = "http://127.0.0.1:{target_port}/effects/{node}", timeout = "8s" }}
"#
    )
}

/// Runs the queue-mode chaos scenario: `duration` of sending at `rate` new events a
/// second with the faults spread over it, then the drain; answers the violations.
pub async fn run(database_url: String, duration: Duration, rate: u64) -> u64 {
    let dir = std::env::temp_dir().join(format!("hookgate-chaos-queue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("chaos dir");
    let schema = format!("chaos_queue_{}_{}", std::process::id(), fastrand::u32(..));
    let db_proxy = StoreProxy::start(&database_url).await;
    let target = ChaosTarget::default();
    let target_port = target.start();
    let urls = [database_url.clone(), db_proxy.url_for(&database_url)];
    let mut nodes = [("A", 0usize), ("B", 1)].map(|(name, i)| {
        let port = free_port();
        let file = dir.join(format!("node-{name}.toml"));
        std::fs::write(&file, config(name, port, &urls[i], &schema, target_port)).expect("config");
        let mut node = Node::new(
            crate::BINARY,
            name,
            file,
            dir.join(format!("node-{name}.log")),
            port,
        );
        node.stderr = Some(dir.join(format!("node-{name}.stderr")));
        node.env = vec![("HOOKGATE_ADMIN_TOKEN".into(), ADMIN_TOKEN.into())];
        node
    });
    for node in nodes.iter_mut() {
        node.start().await; // A first: it creates the schema.
    }
    let ports = [nodes[0].port, nodes[1].port];
    let rows = Rc::new(Rows::connect(&database_url, &schema).await);
    println!("# chaos queue: node logs in {}", dir.display());

    let started = Instant::now();
    let started_wall = SystemTime::now();
    let at = |f: f64| started + duration.mul_f64(f);
    let events = rate * duration.as_secs().max(1);
    let senders = Senders::new(ports.map(|p| format!("http://127.0.0.1:{p}/webhooks/{PROVIDER}")));
    let spawner = {
        let senders = senders.clone();
        let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
        let deadline = started + duration + SENDER_TAIL;
        actix_rt::spawn(async move {
            let mut tasks = Vec::with_capacity(events as usize);
            for n in 0..events {
                actix_rt::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
                let senders = senders.clone();
                tasks.push(actix_rt::spawn(
                    async move { senders.event(n, deadline).await },
                ));
            }
            for task in tasks {
                let _ = task.await;
            }
        })
    };
    let operator = Operator::new(PROVIDER, &nodes[0].config);
    let replays = actix_rt::spawn(replay_rounds(
        operator.clone(),
        Rc::clone(&rows),
        target.clone(),
        ports,
        (at(0.25), at(0.92)),
    ));

    // The faults, on a timeline through the run; each leaves a window that violations
    // starting in it are blamed on (the fault, plus a lease and a bit for its aftermath).
    let mut faults = Vec::new();
    let mut windows = Vec::new();
    let mut kills = Vec::new();
    let mut unrecordable = Vec::new();
    let t = |i: Instant| (i - started).as_secs_f64();
    let aftermath = Duration::from_secs(5);
    let freeze_at = at(0.12);
    watch_until(freeze_at - SLOW_BEFORE_FREEZE, &mut nodes).await;
    target.all_slow.store(true, Ordering::SeqCst);
    watch_until(freeze_at, &mut nodes).await;
    target.all_slow.store(false, Ordering::SeqCst);
    db_proxy.freeze();
    watch_until(freeze_at + FREEZE, &mut nodes).await;
    db_proxy.thaw();
    unrecordable.push(Unrecordable {
        what: "B's database frozen",
        node: "B",
        from: freeze_at,
        to: Instant::now(),
    });
    windows.push((
        "B's database frozen".to_owned(),
        freeze_at,
        Instant::now() + aftermath,
    ));
    faults.push(format!(
        "B's database frozen {:.0}s at {:.1}s",
        FREEZE.as_secs_f64(),
        t(freeze_at)
    ));
    watch_until(at(0.40), &mut nodes).await;
    kills.push(Instant::now());
    nodes[0].kill();
    unrecordable.push(Unrecordable {
        what: "SIGKILL A",
        node: "A",
        from: kills[0],
        to: kills[0],
    });
    nodes[0].start().await;
    windows.push(("SIGKILL A".to_owned(), kills[0], Instant::now() + aftermath));
    faults.push(format!("SIGKILL A at {:.1}s", t(kills[0])));
    watch_until(at(0.55), &mut nodes).await;
    let term = Instant::now();
    nodes[1].terminate().await;
    faults.push(format!(
        "SIGTERM B at {:.1}s (exit took {:.1}s)",
        t(term),
        term.elapsed().as_secs_f64()
    ));
    nodes[1].start().await;
    windows.push(("SIGTERM B".to_owned(), term, Instant::now() + aftermath));
    watch_until(at(0.65), &mut nodes).await;
    target.overflow.store(true, Ordering::SeqCst);
    faults.push(format!("Retry-After 2^64-1 sent from {:.1}s", t(at(0.65))));
    watch_until(at(0.85), &mut nodes).await;
    target.year.store(true, Ordering::SeqCst);
    faults.push(format!(
        "Retry-After 31536000 sent from {:.1}s",
        t(at(0.85))
    ));
    watch_until(at(1.0), &mut nodes).await;
    target.healthy.store(true, Ordering::SeqCst);
    faults.push(format!("target healthy from {:.1}s", t(Instant::now())));
    let _ = spawner.await;
    let _ = replays.await;

    // The drain: every accepted row done or dead, read directly from Postgres; given up
    // early when nothing moved for a while (a wedged node will not heal by itself).
    let drain_from = Instant::now();
    let accepted = senders.sent.borrow().accepted.clone();
    let mut census = rows.census().await;
    let (mut left, mut moved) = (census.stranded(&accepted).len(), Instant::now());
    while left > 0 && drain_from.elapsed() < DRAIN && moved.elapsed() < STUCK {
        watch_until(Instant::now() + Duration::from_secs(1), &mut nodes).await;
        census = rows.census().await;
        let now_left = census.stranded(&accepted).len();
        if now_left != left {
            (left, moved) = (now_left, Instant::now());
        }
    }
    faults.push(match left {
        0 => format!("drained in {:.1}s", t(Instant::now()) - t(drain_from)),
        n => format!(
            "NOT drained: {n} left after {:.1}s ({:.0}s without progress)",
            t(Instant::now()) - t(drain_from),
            moved.elapsed().as_secs_f64()
        ),
    });
    for node in nodes.iter_mut() {
        node.terminate().await;
    }
    faults.push(format!("run took {:.1}s", started.elapsed().as_secs_f64()));
    rows.drop_schema().await;
    // A panic is a fault too, the node's own, found in its log (wall-clock times).
    let logs: Vec<(&Node, LogSummary)> = nodes.iter().map(|n| (n, summarise(&n.log))).collect();
    for (node, log) in &logs {
        for at in &log.panic_times {
            let from = started + at.duration_since(started_wall).unwrap_or_default();
            windows.push((format!("panic on {}", node.name), from, from + aftermath));
        }
    }
    let seen = target.seen();
    let judged = judge(&seen, &unrecordable);
    let sent = senders.sent.borrow();
    let run = Run {
        started,
        faults: &faults,
        windows: &windows,
        sent: &sent,
        operator: &operator,
        census: &census,
        judged: &judged,
        seen: &seen,
        provider: PROVIDER,
    };
    run.print() + print_nodes(&logs, started)
}

/// Sleeps until `until`, restarting (and so noting) a node that exited by itself.
async fn watch_until(until: Instant, nodes: &mut [Node; 2]) {
    loop {
        for node in nodes.iter_mut() {
            if !node.reap() {
                node.start().await;
            }
        }
        let now = Instant::now();
        if now >= until {
            return;
        }
        actix_rt::time::sleep((until - now).min(Duration::from_millis(500))).await;
    }
}

/// The operator, every [`REPLAY_EVERY`] within `window`: lists dead letters (the admin API
/// of either node, or the table), and replays up to three — one with the command line, one
/// with the admin API, one with both at once — half of them into a slow answer, so a replay
/// outlives the lease.
async fn replay_rounds(
    operator: Operator,
    rows: Rc<Rows>,
    target: ChaosTarget,
    ports: [u16; 2],
    window: (Instant, Instant),
) {
    actix_rt::time::sleep_until(window.0.into()).await;
    let mut round = 0usize;
    while Instant::now() < window.1 {
        let listed = match round % 3 {
            2 => None,
            i => operator.list_dead(ports[i]).await,
        };
        let mut dead = match listed {
            Some(keys) => keys,
            None => rows.dead_keys(200).await,
        };
        fastrand::shuffle(&mut dead);
        let picked: Vec<String> = dead
            .into_iter()
            .filter(|k| operator.replayed.borrow().get(k).map_or(0, Vec::len) < 2)
            .take(3)
            .collect();
        let mut replays: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>> = Vec::new();
        for (i, key) in picked.into_iter().enumerate() {
            if fastrand::bool() {
                target.slow_next(format!("{PROVIDER}:{key}"));
            }
            let (op, port) = (operator.clone(), ports[fastrand::usize(0..2)]);
            replays.push(Box::pin(async move {
                match i {
                    0 => op.replay_cli(&key).await,
                    1 => op.replay_api(port, &key).await,
                    _ => {
                        futures_util::future::join(op.replay_cli(&key), op.replay_api(port, &key))
                            .await;
                    }
                }
            }));
        }
        futures_util::future::join_all(replays).await;
        round += 1;
        actix_rt::time::sleep(REPLAY_EVERY).await;
    }
}
