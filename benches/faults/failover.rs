//! `--scenario failover [--mode sync|queue]`: the release binary on a primary + synchronous
//! standby pair (`scripts/pg-ha.sh`, started and stopped here, fsync on) through a
//! multi-host URL with `target_session_attrs=read-write`, while senders deliver and
//! redeliver as real ones do; mid-run the primary is SIGKILLed and the standby promoted.
//! `--scenario patroni --case kill|switchover|rejoin|lose-sync [--strict]`: the same on a
//! three-member Patroni cluster (`scripts/pg-patroni.sh`), Patroni promoting (`patroni.rs`).
//! What the senders, the target and the new primary saw goes to `failover_report.rs`,
//! which answers the violations. Loopback only, bounded in time.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use crate::chaos_target::ChaosTarget;
use crate::failover_report::{Answer, Report};
use crate::patroni::{Case, Cluster};
use hookgate_kit::node::{free_port, Node};
use hookgate_kit::sender::post_event;

/// The provider's name in the config and in every key's `Idempotency-Key`.
const PROVIDER: &str = "failover";

/// When the primary is killed, as a share of the sending time.
const KILL_AT: f64 = 0.4;

/// Senders keep retrying an event this long after the last one was due: the store's 503s
/// ask for 5 s, a sync lease is 10 s.
const SENDER_TAIL: Duration = Duration::from_secs(30);

/// Queue mode: longest wait after the senders for every accepted row to be done or dead.
const DRAIN: Duration = Duration::from_secs(60);

/// The node's config. Sync mode: target timeout 2 s < lease 10 s < first backoff 12 s, so
/// an outcome write held up by the promotion is retried well inside its lease. Queue mode:
/// lease 5 s (renewed every third), first backoff 6 s. On Patroni, whose failover takes its
/// `ttl` (20 s here) and a little more, the lease must outlast that (the promise holds only
/// while an attempt's outcome can still be written inside its lease): 40 s, backoff 45 s.
fn config(
    port: u16,
    url: &str,
    schema: &str,
    target_port: u16,
    queue: bool,
    patroni: bool,
) -> String {
    let (lease, base, mode) = match (queue, patroni) {
        (true, false) => ("5s", "6s", "queue"),
        (false, false) => ("10s", "12s", "sync"),
        (true, true) => ("40s", "45s", "queue"),
        (false, true) => ("40s", "45s", "sync"),
    };
    let cap = if patroni { "90s" } else { "30s" };
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
[store]
url = "{url}&application_name=hookgate-failover"
schema = "{schema}"
pool_size = 8
pool_timeout = "1s"
statement_timeout = "1s"
[lease]
duration = "{lease}"
[retry]
base = "{base}"
cap = "{cap}"
max_attempts = 20
[queue]
poll_interval = "100ms"
[[providers]]
name = "{PROVIDER}"
preset = "none"
mode = "{mode}"
key = [{{ header = "X-Idempotency-Key" }}]
target = {{ url = "http://127.0.0.1:{target_port}/effects", timeout = "2s" }}
"#
    )
}

/// Runs the scenario: `duration` of sending at `rate` new events a second, `case`'s fault
/// (the pair: the primary killed and the standby promoted) at [`KILL_AT`] of it; answers
/// the violations.
pub async fn run(queue: bool, duration: Duration, rate: u64, case: Case, replication: &str) -> u64 {
    let dir = std::env::temp_dir().join(format!("hookgate-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("failover dir");
    let pg_dir = dir.join("pg");
    let replication_mode = replication.to_owned();
    let pair =
        actix_rt::task::spawn_blocking(move || Cluster::start(&pg_dir, case, &replication_mode))
            .await
            .expect("start the cluster");
    println!(
        "# failover: {case:?}, replication {replication}, on {}",
        pair.url
    );
    let schema = format!("failover_{}", std::process::id());
    let target = ChaosTarget::default();
    target.healthy.store(true, Ordering::SeqCst);
    let target_port = target.start();
    let port = free_port();
    let file = dir.join("hookgate.toml");
    std::fs::write(
        &file,
        config(port, &pair.url, &schema, target_port, queue, case.patroni()),
    )
    .expect("config");
    let mut node = Node::new(crate::BINARY, "A", file, dir.join("node.log"), port);
    node.stderr = Some(dir.join("node.stderr"));
    node.start().await;
    println!("# failover: node log {}", node.log.display());

    let started = Instant::now();
    let events = rate * duration.as_secs().max(1);
    let url = format!("http://127.0.0.1:{port}/webhooks/{PROVIDER}");
    let answers: Rc<RefCell<Vec<Answer>>> = Rc::default();
    let spawner = {
        let answers = Rc::clone(&answers);
        let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
        let deadline = started + duration + SENDER_TAIL;
        let client = awc::Client::builder()
            .connector(awc::Connector::new().limit(512))
            .timeout(Duration::from_secs(30))
            .finish();
        actix_rt::spawn(async move {
            let mut tasks = Vec::with_capacity(events as usize);
            for n in 0..events {
                actix_rt::time::sleep_until((started + interval.mul_f64(n as f64)).into()).await;
                let (client, url, answers) = (client.clone(), url.clone(), Rc::clone(&answers));
                tasks.push(actix_rt::spawn(async move {
                    send(&client, &url, &format!("evt-{n}"), deadline, &answers).await;
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        })
    };

    actix_rt::time::sleep_until((started + duration.mul_f64(KILL_AT)).into()).await;
    // Read before the kill; without it "done before the kill, missing now" would judge
    // nothing.
    let done_before = done_keys(&pair.url, &schema, None)
        .await
        .expect("read the done rows before the kill");
    // The fault, off the senders' thread: the pair's primary (the first server: the pair
    // is fresh) killed, its processes gone, then the standby promoted (`pg-ha.sh promote`
    // takes a primary already dead); or Patroni's case.
    let (kill_at, kill_wall) = (Instant::now(), SystemTime::now());
    let span = duration.mul_f64(1.0 - KILL_AT);
    let (pair, fault) = actix_rt::task::spawn_blocking(move || {
        let fault = pair.fault(span);
        (pair, fault)
    })
    .await
    .expect("the fault");
    // A fault of several steps (the standby lost, then the leader) is judged from its
    // last server's loss.
    let (kill_at, kill_wall) = if case == Case::LoseSync {
        (fault.dead_at, fault.dead_wall)
    } else {
        (kill_at, kill_wall)
    };
    let (dead_wall, promoted_at) = (fault.dead_wall, fault.promoted_at);
    let _ = spawner.await;

    // Queue mode: every accepted row done or dead on the new primary (or the drain gives up).
    let accepted: Vec<String> = {
        let answers = answers.borrow();
        let mut keys: Vec<String> = answers
            .iter()
            .filter(|a| (200..300).contains(&a.status))
            .map(|a| format!("{PROVIDER}:{}", a.key))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    };
    let drain_from = Instant::now();
    // The new primary may still be starting: an unanswered read counts as nothing yet.
    let mut finished = done_keys(&pair.after_url, &schema, Some("dead"))
        .await
        .unwrap_or_default();
    while queue
        && drain_from.elapsed() < DRAIN
        && accepted.iter().any(|k| !finished.contains_key(k))
    {
        actix_rt::time::sleep(Duration::from_millis(500)).await;
        finished = done_keys(&pair.after_url, &schema, Some("dead"))
            .await
            .unwrap_or_default();
    }
    let took = started.elapsed();
    node.terminate().await;

    // Rows changed after the old primary's processes were all gone were written on the
    // new one.
    let first_done_after_kill = first_done_after(&pair.after_url, &schema, dead_wall)
        .await
        .and_then(|at| at.duration_since(kill_wall).ok())
        .map(|d| d.as_secs_f64());
    let answers = answers.borrow();
    let report = Report {
        provider: PROVIDER,
        queue,
        rate,
        duration,
        events,
        started,
        kill_at,
        promoted_at,
        took,
        answers: &answers,
        done_before: &done_before,
        finished: &finished,
        seen: &target.seen(),
        first_done_after_kill,
    };
    let violations = report.print();
    drop(pair);
    if violations == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
    violations
}

/// One event, POSTed until a 2xx (a done or dead-lettered event in sync mode, an accepted
/// one in queue mode) or the deadline, the way a real sender retries: after `Retry-After`
/// (at most 5 s) on 409/429/503, after 300 ms on a refused connection. Every answer is
/// recorded with its instant.
async fn send(
    client: &awc::Client,
    url: &str,
    key: &str,
    deadline: Instant,
    answers: &RefCell<Vec<Answer>>,
) {
    let body = format!(r#"{{"id":"{key}","type":"failover.event"}}"#);
    while Instant::now() < deadline {
        let Ok(reply) = post_event(client, url, key, &body).await else {
            answers.borrow_mut().push(Answer::new(key, 0, "-"));
            actix_rt::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let (status, mut path) = (reply.status, reply.path);
        // A 503's reason where it differs from the path (`first_run` answered 503).
        if let Some(reason) = serde_json::from_slice::<serde_json::Value>(&reply.body)
            .ok()
            .and_then(|b| b["reason"].as_str().map(str::to_owned))
            .filter(|r| *r != path)
        {
            path = format!("{path}/{reason}");
        }
        answers.borrow_mut().push(Answer::new(key, status, &path));
        match status {
            200..=299 => return,
            409 | 429 | 503 => {
                let secs = reply.retry_after.unwrap_or(1).clamp(1, 5);
                actix_rt::time::sleep(Duration::from_secs(secs)).await;
            }
            _ => return,
        }
    }
}

/// Keys (`provider:key`) of rows done — and of `also` if given — on the server(s) `url`
/// names, with their status: a plain read, no lock. An error when the server does not
/// answer or the schema does not exist yet.
async fn done_keys(
    url: &str,
    schema: &str,
    also: Option<&str>,
) -> Result<std::collections::HashMap<String, String>, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    actix_rt::spawn(connection);
    let rows = client
        .query(
            &format!(
                "SELECT provider || ':' || event_key, status FROM {schema}.webhook_events \
                 WHERE status = 'done' OR status = $1"
            ),
            &[&also.unwrap_or("done")],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// When the first row done after `since` was changed (its `updated_at`: the servers share
/// this machine's clock). A plain read, no lock.
async fn first_done_after(url: &str, schema: &str, since: SystemTime) -> Option<SystemTime> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .ok()?;
    actix_rt::spawn(connection);
    let since = since
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    let row = client
        .query_one(
            &format!(
                "SELECT extract(epoch FROM min(updated_at))::float8 FROM {schema}.webhook_events
                 WHERE status = 'done' AND updated_at > to_timestamp($1)"
            ),
            &[&since],
        )
        .await
        .ok()?;
    let at: Option<f64> = row.get(0);
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(at?))
}
