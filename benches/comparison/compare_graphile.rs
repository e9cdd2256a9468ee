//! graphile-worker's side of the queue comparison: `scripts/queue-compare/worker.js` run by
//! the system's `node` (`npm ci` in that folder first; scripts/queue-compare.sh does it).
//! `prepare` installs its schema and adds the jobs; the worker is started and SIGTERMed
//! here, a direct child of the bench, so its CPU is the bench's to read. Knows nothing of
//! what is measured.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The table graphile-worker keeps its jobs in (a job's row is deleted when it completes).
pub const TABLE: &str = "graphile_worker._private_jobs";

/// How long a graceful shutdown may take before the worker is killed.
const STOP_WAIT: Duration = Duration::from_secs(60);

/// How the worker runs.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    /// Jobs at once (`concurrentJobs`).
    pub concurrency: usize,
    /// Jobs fetched and locked a query (`localQueue.size`).
    pub local_queue: usize,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/queue-compare/worker.js")
}

/// Installs graphile-worker's schema in the run's database and adds `events` jobs with its
/// `addJobs`.
pub fn prepare(database_url: &str, events: u64) {
    let status = Command::new("node")
        .arg(script())
        .arg("prepare")
        .env("DATABASE_URL", database_url)
        .env("EVENTS", events.to_string())
        .status()
        .expect("run node (is Node.js installed, and `npm ci` done in scripts/queue-compare?)");
    assert!(status.success(), "worker.js prepare failed: {status}");
}

/// Starts the worker; its output goes to `dir`/graphile.log.
pub fn start(dir: &Path, database_url: &str, target: &str, sizing: Sizing) -> Child {
    let log = std::fs::File::create(dir.join("graphile.log")).expect("worker log");
    let stderr = log.try_clone().expect("worker log");
    Command::new("node")
        .arg(script())
        .arg("run")
        .env("DATABASE_URL", database_url)
        .env("TARGET_URL", target)
        .env("CONCURRENCY", sizing.concurrency.to_string())
        .env("LOCAL_QUEUE", sizing.local_queue.to_string())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("start the graphile-worker process")
}

/// SIGTERM (graceful: running jobs finish, completions are written, locked jobs go back),
/// then waits for the exit — at most [`STOP_WAIT`], then SIGKILL.
pub async fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + STOP_WAIT;
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Jobs left in the table (the check after a run; 0 when every job completed).
pub async fn unfinished(database_url: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .expect("connect to the run's database");
    actix_rt::spawn(connection);
    client
        .query_one(&format!("SELECT count(*) FROM {TABLE}"), &[])
        .await
        .expect("count jobs left")
        .get(0)
}
