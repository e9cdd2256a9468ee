//! What one queue-comparison run cost, read from outside the systems measured: the
//! Postgres cluster's CPU (the postmaster's own and reaped children's, plus every live
//! child's, from /proc), the commits of the run's own database (`pg_stat_database`), and
//! the worker's CPU. The worker — hookgate's binary or graphile-worker's Node process — is
//! the bench's child, spawned after the first sample and reaped before the second, so its
//! whole life shows in the bench's own `cutime` + `cstime`.
//!
//! Each run gets a database of its own, and the meter's connection sits in the cluster's
//! maintenance database: the run's commit count holds no query of the bench's. The
//! cluster must run on this machine (its /proc is read).

use std::time::{Duration, Instant};

use hookgate_kit::proc_cpu::{cluster_ticks, stat, TICKS_PER_SECOND};

/// Longest wait for the run's database to have no session left (a backend flushes its
/// commit counts to the shared statistics when it exits; autovacuum may still be busy).
const SETTLE: Duration = Duration::from_secs(60);

/// The cluster and the run's database, measured.
pub struct Meter {
    /// A session in the maintenance database (`postgres`), never in the run's.
    admin: tokio_postgres::Client,
    postmaster: u32,
    /// The run's database.
    pub database: String,
    /// Its URL, for the systems measured.
    pub url: String,
}

/// Counters at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    postgres_ticks: u64,
    worker_ticks: u64,
    commits: i64,
}

/// A run's cost per event, between two samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    pub postgres_us: f64,
    pub worker_us: f64,
    pub commits: f64,
}

impl Meter {
    /// Connects to the cluster at `admin_url` and creates `database` afresh.
    pub async fn create(admin_url: &str, database: &str) -> Self {
        let (admin, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
            .await
            .expect("connect to the cluster's maintenance database");
        actix_rt::spawn(connection);
        let data: String = admin
            .query_one("SHOW data_directory", &[])
            .await
            .expect("data_directory (the bench connects as a superuser)")
            .get(0);
        let pid_file = std::fs::read_to_string(format!("{data}/postmaster.pid"))
            .expect("postmaster.pid: the cluster must run on this machine");
        let postmaster = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("the postmaster's pid");
        for statement in ["DROP DATABASE IF EXISTS", "CREATE DATABASE"] {
            admin
                .batch_execute(&format!("{statement} {database}"))
                .await
                .expect("create the run's database afresh");
        }
        let url = match admin_url.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{database}"),
            None => panic!("the database URL {admin_url} names no database"),
        };
        Self {
            admin,
            postmaster,
            database: database.to_owned(),
            url,
        }
    }

    /// Prepares the preloaded rows as a queue that has stood a while: `VACUUM ANALYZE` of
    /// `table` (so autovacuum has nothing of the preload left to do during the run), a
    /// checkpoint (the preload's dirty pages are not flushed inside the run), then waits
    /// for every session of the run's database to end.
    pub async fn quiesce(&self, table: &str) {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect to the run's database");
        actix_rt::spawn(connection);
        client
            .batch_execute(&format!("VACUUM (ANALYZE) {table}"))
            .await
            .expect("vacuum the preloaded table");
        drop(client);
        self.admin
            .batch_execute("CHECKPOINT")
            .await
            .expect("checkpoint");
        self.settle().await;
    }

    /// Waits (bounded) until no session is connected to the run's database.
    pub async fn settle(&self) {
        let deadline = Instant::now() + SETTLE;
        while Instant::now() < deadline {
            let left: i64 = self
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                    &[&self.database],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            if left == 0 {
                return;
            }
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("# warning: sessions still open on {}", self.database);
    }

    /// The counters now.
    pub async fn sample(&self) -> Sample {
        let commits: i64 = self
            .admin
            .query_one(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
                &[&self.database],
            )
            .await
            .expect("pg_stat_database")
            .get(0);
        Sample {
            postgres_ticks: cluster_ticks(self.postmaster),
            worker_ticks: reaped_children_ticks(),
            commits,
        }
    }
}

impl Sample {
    /// What happened since `before`, per event.
    pub fn cost_since(&self, before: &Sample, events: u64) -> Cost {
        let per_event = |ticks: u64| ticks as f64 / TICKS_PER_SECOND * 1e6 / events.max(1) as f64;
        Cost {
            postgres_us: per_event(self.postgres_ticks.saturating_sub(before.postgres_ticks)),
            worker_us: per_event(self.worker_ticks.saturating_sub(before.worker_ticks)),
            commits: (self.commits - before.commits) as f64 / events.max(1) as f64,
        }
    }
}

/// This process's reaped children's time: the workers it spawned and waited for.
fn reaped_children_ticks() -> u64 {
    let own = stat(std::process::id()).expect("/proc/self/stat");
    own.cutime + own.cstime
}
