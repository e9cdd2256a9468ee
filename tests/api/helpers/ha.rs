//! A throwaway primary + synchronous standby pair (`scripts/pg-ha.sh`) for one failover
//! test, and a superuser's plain connections to either server for looking at it. Each test
//! starts its own pair (about two seconds), so failover tests never share a server; the
//! pair is stopped when the handle is dropped, panics included.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

static PAIRS: AtomicUsize = AtomicUsize::new(0);

/// A running pair; `url` names both servers, writes going to whichever is primary.
pub struct HaPair {
    dir: PathBuf,
    /// `postgres://…@h1:p1,h2:p2/postgres?target_session_attrs=read-write`.
    pub url: String,
    /// The server that starts as primary (n1) and the one that starts as standby (n2).
    pub first_url: String,
    pub second_url: String,
}

/// Runs `scripts/pg-ha.sh ARGS…` off the test's thread; its stdout, or a panic with its
/// stderr.
async fn script(args: Vec<String>) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-ha.sh");
    let shown = args.join(" ");
    let out = actix_rt::task::spawn_blocking(move || Command::new(script).args(&args).output())
        .await
        .expect("pg-ha thread")
        .expect("run scripts/pg-ha.sh");
    assert!(
        out.status.success(),
        "pg-ha.sh {shown} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl HaPair {
    /// Starts a pair under `$HOOKGATE_HA_DIR` (scripts/test.sh sets it, and stops whatever
    /// a killed test run left there) or the temp directory.
    pub async fn start() -> Self {
        let root =
            std::env::var_os("HOOKGATE_HA_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        let n = PAIRS.fetch_add(1, Ordering::SeqCst);
        let dir = root.join(format!("ha-{}-{n}", std::process::id()));
        let exports = script(vec!["start".into(), dir.display().to_string()]).await;
        let var = |name: &str| {
            exports
                .lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(|v| v.trim_matches('\'').to_owned())
                .unwrap_or_else(|| panic!("pg-ha.sh start printed no {name}: {exports}"))
        };
        Self {
            url: var("HOOKGATE_HA_URL"),
            first_url: var("HOOKGATE_HA_PRIMARY_URL"),
            second_url: var("HOOKGATE_HA_STANDBY_URL"),
            dir,
        }
    }

    /// `url` with `application_name` set, so a test can count its node's backends.
    pub fn url_named(&self, application_name: &str) -> String {
        format!("{}&application_name={application_name}", self.url)
    }

    /// Kills the primary (kill -9 of its postmaster) and promotes the standby.
    pub async fn promote(&self) {
        self.run("promote").await;
    }

    /// Makes the primary's commits wait for a standby that does not exist.
    pub async fn require_ghost(&self) {
        self.run("require-ghost").await;
    }

    /// Lets the waiting commits complete.
    pub async fn release_ghost(&self) {
        self.run("release-ghost").await;
    }

    async fn run(&self, command: &str) {
        script(vec![command.into(), self.dir.display().to_string()]).await;
    }

    /// kill -9 of the first server's postmaster, as a crash would, and waits (bounded) until
    /// its backends have noticed and exited too. `promote` accepts a primary already killed.
    pub async fn kill_first(&self) {
        let data = self.dir.join("n1");
        let pid = std::fs::read_to_string(data.join("postmaster.pid")).expect("postmaster.pid");
        let pid = pid.lines().next().expect("a pid").trim().to_owned();
        let status = Command::new("kill")
            .args(["-9", &pid])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -9 {pid}");
        // Every PostgreSQL process works in its data directory.
        let running = || {
            std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
                std::fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd == data)
                    && std::fs::read_to_string(p.path().join("stat"))
                        .is_ok_and(|stat| !stat.contains(") Z "))
            })
        };
        super::eventually("the killed server's processes to exit", || async {
            !running()
        })
        .await;
    }

    /// `pg_ctl promote` of the second server while the first keeps running: a switchover
    /// that leaves the old primary up (fenced read-only by the test, as some tools do).
    pub async fn promote_second_keeping_first(&self) {
        let data = self.dir.join("n2");
        let done = actix_rt::task::spawn_blocking(move || {
            let bin = std::fs::read_dir("/usr/lib/postgresql")
                .expect("PostgreSQL's packages")
                .filter_map(|d| Some(d.ok()?.path().join("bin/pg_ctl")))
                .find(|p| p.exists())
                .expect("pg_ctl");
            let mut command = if running_as_root() {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(bin);
                c
            } else {
                Command::new(bin)
            };
            command
                .args(["-w", "-t", "60", "promote", "-D"])
                .arg(data)
                .output()
        })
        .await
        .expect("pg_ctl thread")
        .expect("run pg_ctl");
        assert!(
            done.status.success(),
            "pg_ctl promote: {}",
            String::from_utf8_lossy(&done.stderr)
        );
    }

    /// A superuser's connection to one server of the pair.
    pub async fn connect(url: &str) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        actix_rt::spawn(connection);
        client
    }

    /// The number of backends whose `application_name` is `name`, on the server at `url`.
    pub async fn backends(url: &str, name: &str) -> i64 {
        Self::connect(url)
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .await
            .expect("count backends")
            .get(0)
    }
}

/// Whether this process runs as root (then the servers run as `postgres`).
fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

impl Drop for HaPair {
    fn drop(&mut self) {
        let _ = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-ha.sh"))
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}
