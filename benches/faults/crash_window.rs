//! `--scenario crash`: queue mode's crash window. Two nodes of the release binary on one
//! Postgres schema with the provider in queue mode, a target that answers every attempt 200
//! after `--target-ms` (default 50); `--requests` events (default 300) posted at once, half
//! to each node; node A is SIGKILLed at a random moment within one target answer after
//! the target has answered a third of them, and not restarted. (The deliveries run in
//! waves — every worker starts at once and the target answers them together — so a kill
//! right when a count is reached would always land just after a wave: the random delay
//! samples every phase alike.) Every event whose 2xx from A was not written yet when A died is sent again by
//! B after the lease (the promise's excused case): the bench counts those — the crash
//! window — beside A's outcome-write p99 just before the kill, and checks that every
//! event ends done with no two attempts of a key open at once and no other second 2xx.
//! Answers the violations.

use std::time::{Duration, Instant};

use crate::chaos_attempts::{judge, Unrecordable};
use crate::chaos_rows::Rows;
use crate::chaos_target::ChaosTarget;
use hookgate_kit::node::outcome_write_p99_ms;
use hookgate_kit::node::{free_port, Node};
use hookgate_kit::sender::post_event;

const PROVIDER: &str = "crash";

/// Longest wait for every event to be done: the lease (3 s) and B's next passes, with room.
const DRAIN: Duration = Duration::from_secs(60);

/// One node's config: the chaos run's lease and timeouts, the default workers.
fn config(node: &str, port: u16, url: &str, schema: &str, target_port: u16) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
[store]
url = "{url}"
schema = "{schema}"
[lease]
duration = "3s"
[retry]
base = "4s"
[queue]
poll_interval = "100ms"
[[providers]]
name = "{PROVIDER}"
preset = "none"
mode = "queue"
key = [{{ header = "X-Idempotency-Key" }}]
target = {{ url = "http://127.0.0.1:{target_port}/effects/{node}", timeout = "8s" }}
"#
    )
}

/// Runs the crash-window scenario once; answers the violations.
pub async fn run(database_url: String, events: u64, target_ms: u64) -> u64 {
    let dir = std::env::temp_dir().join(format!("hookgate-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("crash dir");
    let schema = format!("crash_{}_{}", std::process::id(), fastrand::u32(..));
    let target = ChaosTarget::default();
    target
        .healthy
        .store(true, std::sync::atomic::Ordering::SeqCst);
    target
        .pause_ms
        .store(target_ms, std::sync::atomic::Ordering::SeqCst);
    let target_port = target.start();
    let mut nodes = ["A", "B"].map(|name| {
        let port = free_port();
        let file = dir.join(format!("node-{name}.toml"));
        std::fs::write(
            &file,
            config(name, port, &database_url, &schema, target_port),
        )
        .expect("config");
        Node::new(
            crate::BINARY,
            name,
            file,
            dir.join(format!("node-{name}.log")),
            port,
        )
    });
    for node in nodes.iter_mut() {
        node.start().await; // A first: it creates the schema.
    }
    let rows = Rows::connect(&database_url, &schema).await;
    let ports = [nodes[0].port, nodes[1].port];

    let client = awc::Client::builder()
        .connector(awc::Connector::new().limit(512))
        .timeout(Duration::from_secs(30))
        .finish();
    let started = Instant::now();
    let posts = (0..events).map(|n| {
        let client = client.clone();
        let url = format!(
            "http://127.0.0.1:{}/webhooks/{PROVIDER}",
            ports[n as usize % 2]
        );
        async move {
            let key = format!("crash-{n}");
            let body = format!(r#"{{"id":"{key}"}}"#);
            let accepted = matches!(post_event(&client, &url, &key, &body).await,
                Ok(reply) if reply.status == 202);
            accepted.then_some(key)
        }
    });
    let posting = actix_rt::spawn(futures_util::future::join_all(posts));

    // The kill, at a random moment within one answer after a third were answered.
    let third = (events / 3) as usize;
    let answered = || {
        target
            .seen()
            .iter()
            .filter(|s| s.status == Some(200))
            .count()
    };
    while answered() < third && started.elapsed() < DRAIN {
        actix_rt::time::sleep(Duration::from_millis(1)).await;
    }
    actix_rt::time::sleep(Duration::from_millis(fastrand::u64(0..=target_ms))).await;
    let write_p99 = outcome_write_p99_ms(ports[0]).await;
    let killed = Instant::now();
    nodes[0].kill();
    let answered_before = answered();
    let accepted: std::collections::HashSet<String> = posting
        .await
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect();

    let mut census = rows.census().await;
    while !census.stranded(&accepted).is_empty() && started.elapsed() < DRAIN {
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        census = rows.census().await;
    }
    let drained = started.elapsed();
    let unfinished = census.stranded(&accepted).len() as u64;
    nodes[1].terminate().await;
    rows.drop_schema().await;

    let seen = target.seen();
    let unrecordable = [Unrecordable {
        what: "SIGKILL A",
        node: "A",
        from: killed,
        to: killed,
    }];
    let judged = judge(&seen, &unrecordable);
    let open_at_kill = seen
        .iter()
        .filter(|s| s.node == "A" && s.start <= killed && s.status.is_none())
        .count();
    let not_accepted = events - accepted.len() as u64;
    println!(
        "scenario=crash events={events} accepted={} target_ms={target_ms} \
         killed_at_s={:.3} answered_before_kill={answered_before} \
         a_write_p99_ms={} resent_after_kill={} a_open_at_kill={open_at_kill} \
         overlaps={} doubles_outside={} unfinished={unfinished} drained_s={:.1}",
        accepted.len(),
        (killed - started).as_secs_f64(),
        write_p99.map_or("-".into(), |ms| format!("{ms:.1}")),
        judged.doubles_unrecordable.len(),
        judged.overlaps.len(),
        judged.doubles_outside.len(),
        drained.as_secs_f64(),
    );
    judged.overlaps.len() as u64 + judged.doubles_outside.len() as u64 + unfinished + not_accepted
}
