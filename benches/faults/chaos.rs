//! `--scenario chaos`: the release binary as a child process, on Postgres behind a TCP
//! proxy this bench controls, driven by senders that behave like real ones (redeliver after
//! `Retry-After` on 409/503 and after a refused connection, until a 2xx or a dead letter).
//! During the run it SIGTERMs and restarts the node, SIGKILLs and restarts it, freezes the
//! database proxy for longer than the statement timeout, and takes the target down.
//!
//! At the end it reports events sent, done and dead, deliveries, and events the target
//! received more than once — split into those that overlap a SIGKILL (the only case where
//! a second delivery is allowed: the target acted and the process died before recording
//! it) and the rest, which must be 0. It answers the number of violations.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

use hookgate_kit::node::{free_port, Node};
use hookgate_kit::proxy::StoreProxy;
use hookgate_kit::sender::post_event;

/// Deliveries a target reception may be "in flight" for at a SIGKILL: received before the
/// kill and answered less than this long before it (the node records an outcome within
/// milliseconds of the target's answer, so anything older was recorded).
const RECORD_MARGIN: Duration = Duration::from_millis(500);

/// The node's lease: longer than the database freeze, so outcome writes held up by the
/// freeze are retried inside their lease.
const LEASE: &str = "10s";

/// How long the database is frozen: longer than the statement timeout (1 s).
const FREEZE: Duration = Duration::from_secs(3);

/// How long the target is down.
const TARGET_DOWN: Duration = Duration::from_secs(3);

/// One reception at the target.
#[derive(Debug, Clone, Copy)]
struct Reception {
    received: Instant,
    answered: Instant,
}

/// The chaos target: answers 200 after a few milliseconds and records every reception it
/// acted on; while `down`, it answers 503 without acting.
#[derive(Clone, Default)]
struct ChaosTarget {
    seen: Arc<Mutex<HashMap<String, Vec<Reception>>>>,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl ChaosTarget {
    fn start(&self) -> u16 {
        let state = web::Data::new(self.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .default_service(web::to(receive))
        })
        .workers(1)
        .backlog(4096)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind the chaos target");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        port
    }
}

async fn receive(req: HttpRequest, state: web::Data<ChaosTarget>) -> HttpResponse {
    use std::sync::atomic::Ordering;
    if state.down.load(Ordering::SeqCst) {
        return HttpResponse::ServiceUnavailable().finish();
    }
    let received = Instant::now();
    let key = req
        .headers()
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    actix_rt::time::sleep(Duration::from_millis(fastrand::u64(5..40))).await;
    let answered = Instant::now();
    state
        .seen
        .lock()
        .unwrap()
        .entry(key)
        .or_default()
        .push(Reception { received, answered });
    HttpResponse::Ok()
        .content_type("application/json")
        .body(r#"{"ok":true}"#)
}

/// How a sender's event ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Done,
    Dead,
    Unfinished,
}

/// Runs the chaos scenario for about `duration` of faults (plus the senders' tail) with
/// `rate` new events a second; answers the violations found.
pub async fn run(database_url: String, duration: Duration, rate: u64) -> u64 {
    let dir = std::env::temp_dir().join(format!("hookgate-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("chaos dir");
    let schema = format!("chaos_{}_{}", std::process::id(), fastrand::u32(..));
    let db_proxy = StoreProxy::start(&database_url).await;
    let target = ChaosTarget::default();
    let target_port = target.start();
    let port = free_port();
    let config = dir.join("hookgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
listen = "127.0.0.1:{port}"
workers_per_shard = 8
[store]
url = "{url}"
schema = "{schema}"
pool_size = 8
pool_timeout = "1s"
statement_timeout = "1s"
[lease]
duration = "{LEASE}"
[retry]
base = "12s"
cap = "30s"
max_attempts = 20
[shutdown]
grace = "5s"
[[providers]]
name = "chaos"
preset = "none"
key = [{{ header = "X-Idempotency-Key" }}]
target = {{ url = "http://127.0.0.1:{target_port}/effects", timeout = "2s" }}
"#,
            url = db_proxy.url_for(&database_url),
        ),
    )
    .expect("chaos config");
    let mut node = Node::new(crate::BINARY, "A", config, dir.join("node.log"), port);
    node.start().await;
    println!("# chaos: node {} log {}", node.name, node.log.display());

    let started = Instant::now();
    let events = rate * duration.as_secs().max(1);
    let url = format!("http://127.0.0.1:{port}/webhooks/chaos");
    let hard_deadline = started + duration + Duration::from_secs(120);
    let ends: Rc<RefCell<Vec<End>>> = Rc::default();
    // Each event is its own sender, started at its due time: a sender waiting out a
    // backoff never holds back the events due after it, so traffic spans every fault.
    let client = awc::Client::builder()
        .connector(awc::Connector::new().limit(512))
        .timeout(Duration::from_secs(30))
        .finish();
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let spawner = {
        let (url, ends) = (url.clone(), Rc::clone(&ends));
        actix_rt::spawn(async move {
            let mut senders = Vec::with_capacity(events as usize);
            for n in 0..events {
                actix_rt::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
                let (client, url, ends) = (client.clone(), url.clone(), Rc::clone(&ends));
                senders.push(actix_rt::spawn(async move {
                    let end = send(&client, &url, &format!("chaos-{n}"), hard_deadline).await;
                    ends.borrow_mut().push(end);
                }));
            }
            for sender in senders {
                let _ = sender.await;
            }
        })
    };

    // The faults, on a timeline through the run.
    let at = |f: f64| started + duration.mul_f64(f);
    let mut kills = Vec::new();
    actix_rt::time::sleep_until(at(0.15).into()).await;
    let sigterm_at = started.elapsed();
    node.terminate().await;
    node.start().await;
    actix_rt::time::sleep_until(at(0.35).into()).await;
    kills.push(Instant::now());
    node.kill();
    node.start().await;
    actix_rt::time::sleep_until(at(0.55).into()).await;
    let freeze_at = started.elapsed();
    db_proxy.freeze();
    actix_rt::time::sleep(FREEZE).await;
    db_proxy.thaw();
    actix_rt::time::sleep_until(at(0.70).into()).await;
    let down_at = started.elapsed();
    target.down.store(true, std::sync::atomic::Ordering::SeqCst);
    actix_rt::time::sleep(TARGET_DOWN).await;
    target
        .down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    actix_rt::time::sleep_until(at(0.85).into()).await;
    kills.push(Instant::now());
    node.kill();
    node.start().await;
    let _ = spawner.await;
    let took = started.elapsed();
    node.terminate().await;

    let rows = row_counts(&database_url, &schema).await;
    let ends = ends.borrow().clone();
    let count = |e: End| ends.iter().filter(|&&x| x == e).count();
    let seen = target.seen.lock().unwrap();
    let deliveries: usize = seen.values().map(Vec::len).sum();
    let mut in_flight = vec![0usize; kills.len()];
    let mut again_in_window = vec![0usize; kills.len()];
    let mut again_outside = Vec::new();
    for (key, receptions) in seen.iter() {
        for (i, kill) in kills.iter().enumerate() {
            in_flight[i] += receptions
                .iter()
                .filter(|r| r.received <= *kill && r.answered + RECORD_MARGIN >= *kill)
                .count();
        }
        if receptions.len() < 2 {
            continue;
        }
        let first = receptions[0];
        let window = kills.iter().position(|kill| {
            first.received <= *kill
                && first.answered + RECORD_MARGIN >= *kill
                && receptions[1..].iter().all(|r| r.received > *kill)
        });
        match window {
            Some(i) if receptions.len() == 2 => again_in_window[i] += 1,
            _ => again_outside.push(key.clone()),
        }
    }
    let unfinished_rows =
        rows.get("in_progress").copied().unwrap_or(0) + rows.get("failed").copied().unwrap_or(0);
    println!(
        "# chaos faults: SIGTERM+restart at {:.1}s, SIGKILL+restart at {}, database frozen \
         {:.0}s at {:.1}s, target down {:.0}s at {:.1}s; run took {:.1}s",
        sigterm_at.as_secs_f64(),
        kills
            .iter()
            .map(|k| format!("{:.1}s", (*k - started).as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" and "),
        FREEZE.as_secs_f64(),
        freeze_at.as_secs_f64(),
        TARGET_DOWN.as_secs_f64(),
        down_at.as_secs_f64(),
        took.as_secs_f64()
    );
    println!(
        "scenario=chaos       store=postgres events={events} done={} dead={} unfinished={} \
         rows={rows:?} deliveries={deliveries} delivered_twice={} in_sigkill_windows={} \
         outside={}",
        count(End::Done),
        count(End::Dead),
        count(End::Unfinished),
        again_in_window.iter().sum::<usize>() + again_outside.len(),
        again_in_window.iter().sum::<usize>(),
        again_outside.len(),
    );
    let mut violations = again_outside.len() as u64;
    for (i, (flying, again)) in in_flight.iter().zip(&again_in_window).enumerate() {
        println!(
            "# SIGKILL {}: deliveries in flight {flying}, delivered again {again}",
            i + 1
        );
        if again > flying {
            violations += 1;
        }
    }
    if !again_outside.is_empty() {
        println!("# delivered twice outside any SIGKILL window: {again_outside:?}");
    }
    violations += (count(End::Unfinished) + unfinished_rows) as u64;
    violations
}

/// One event, sent until a 2xx (done or dead-lettered) or the hard deadline, the way a
/// real sender retries.
async fn send(client: &awc::Client, url: &str, key: &str, hard_deadline: Instant) -> End {
    let body = format!(r#"{{"id":"{key}","type":"chaos.event"}}"#);
    while Instant::now() < hard_deadline {
        let Ok(reply) = post_event(client, url, key, &body).await else {
            // The node is down or restarting: a real sender retries later.
            actix_rt::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let (status, answer) = (reply.status, reply.body);
        let retry_after = reply.retry_after.unwrap_or(1);
        match status {
            200..=299 if answer.as_ref() == br#"{"status":"dead_lettered"}"# => return End::Dead,
            200..=299 => return End::Done,
            409 | 503 => {
                actix_rt::time::sleep(Duration::from_secs(retry_after.clamp(1, 30))).await;
            }
            other => {
                eprintln!("# chaos: {key} answered {other}");
                return End::Unfinished;
            }
        }
    }
    End::Unfinished
}

/// Rows by status in the run's schema, read directly (not through the proxy).
async fn row_counts(url: &str, schema: &str) -> HashMap<String, usize> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect for the final count");
    actix_rt::spawn(connection);
    let rows = client
        .query(
            &format!("SELECT status, count(*) FROM {schema}.webhook_events GROUP BY status"),
            &[],
        )
        .await
        .expect("count rows");
    let counts = rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as usize))
        .collect();
    let _ = client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await;
    counts
}
