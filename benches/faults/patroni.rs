//! The failover run's clusters and what happens to them mid-run: the hand-promoted pair of
//! `scripts/pg-ha.sh`, or a three-member Patroni cluster on etcd (`scripts/pg-patroni.sh`)
//! in which Patroni does the promoting — its leader killed, a planned switchover, the killed
//! leader rejoining as a replica, or the synchronous standby lost and then the leader.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// What happens to the cluster mid-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// The pair: the primary SIGKILLed, the standby promoted by hand.
    Promote,
    /// Patroni: the leader (its Patroni and its PostgreSQL) SIGKILLed; Patroni elects the
    /// synchronous standby.
    Kill,
    /// Patroni: `patronictl switchover` to the synchronous standby, planned and graceful.
    Switchover,
    /// Patroni: the leader killed, then started again: it rejoins as a replica (pg_rewind).
    Rejoin,
    /// Patroni: the synchronous standby killed, then (Patroni has made the third member
    /// synchronous) the leader.
    LoseSync,
}

impl Case {
    /// The case named on the command line (`--case`).
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "kill" => Self::Kill,
            "switchover" => Self::Switchover,
            "rejoin" => Self::Rejoin,
            "lose-sync" => Self::LoseSync,
            _ => return None,
        })
    }

    /// Whether the run is on Patroni.
    pub fn patroni(self) -> bool {
        self != Self::Promote
    }
}

/// A running cluster, stopped (its directory removed) when dropped.
pub struct Cluster {
    dir: PathBuf,
    case: Case,
    /// The URL the node uses (every member, `target_session_attrs=read-write`).
    pub url: String,
    /// Where rows are read after the fault: the pair's standby, or Patroni's leader
    /// (through `url`).
    pub after_url: String,
}

/// What the fault took: when the last server that went away was gone, and when the
/// cluster took writes again.
pub struct Fault {
    pub dead_wall: SystemTime,
    pub dead_at: Instant,
    pub promoted_at: Instant,
}

fn script(name: &str, args: &[&str]) -> String {
    let path = format!("{}/scripts/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {path}: {e}"));
    assert!(
        out.status.success(),
        "{name} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn exported(exports: &str, name: &str) -> String {
    exports
        .lines()
        .find_map(|l| l.strip_prefix(&format!("export {name}=")))
        .map(|v| v.trim_matches('\'').to_owned())
        .unwrap_or_else(|| panic!("no {name} printed"))
}

impl Cluster {
    /// Starts the cluster `case` runs on (`replication`: Patroni's `sync` (the default),
    /// `strict` (`synchronous_mode_strict`) or `async`).
    pub fn start(dir: &Path, case: Case, replication: &str) -> Self {
        let shown = dir.display().to_string();
        if case.patroni() {
            let mut args = vec!["start", shown.as_str()];
            if replication != "sync" {
                args.push(replication);
            }
            let url = exported(&script("pg-patroni.sh", &args), "HOOKGATE_PATRONI_URL");
            Self {
                dir: dir.to_owned(),
                case,
                after_url: url.clone(),
                url,
            }
        } else {
            let exports = script("pg-ha.sh", &["start", &shown, "durable"]);
            Self {
                dir: dir.to_owned(),
                case,
                url: exported(&exports, "HOOKGATE_HA_URL"),
                after_url: exported(&exports, "HOOKGATE_HA_STANDBY_URL"),
            }
        }
    }

    /// Does the case's fault (blocking: run it off the senders' thread), over `span` (the
    /// rejoin and the loss of the standby spread their steps over it).
    pub fn fault(&self, span: Duration) -> Fault {
        let dir = self.dir.display().to_string();
        let patroni = |args: &[&str]| script("pg-patroni.sh", args);
        let gone = |at: Instant| (SystemTime::now(), at);
        let (dead_wall, dead_at) = match self.case {
            Case::Promote => {
                kill_server(&self.dir.join("n1"));
                let dead = gone(Instant::now());
                script("pg-ha.sh", &["promote", &dir]);
                dead
            }
            Case::Kill | Case::Rejoin => {
                let leader = patroni(&["leader", &dir]).trim().to_owned();
                patroni(&["kill", &dir, &leader]);
                let dead = gone(Instant::now());
                patroni(&["await-leader", &dir, &leader]);
                if self.case == Case::Rejoin {
                    std::thread::sleep(span / 4);
                    patroni(&["rejoin", &dir, &leader]);
                }
                dead
            }
            Case::Switchover => {
                let started = (SystemTime::now(), Instant::now());
                patroni(&["switchover", &dir]);
                started
            }
            Case::LoseSync => {
                patroni(&["await-sync", &dir]);
                let sync = patroni(&["sync", &dir]).trim().to_owned();
                patroni(&["kill", &dir, &sync]);
                patroni(&["await-sync", &dir]);
                std::thread::sleep(span / 4);
                let leader = patroni(&["leader", &dir]).trim().to_owned();
                patroni(&["kill", &dir, &leader]);
                let dead = gone(Instant::now());
                patroni(&["await-leader", &dir, &leader]);
                dead
            }
        };
        Fault {
            dead_wall,
            dead_at,
            promoted_at: Instant::now(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let name = if self.case.patroni() {
            "pg-patroni.sh"
        } else {
            "pg-ha.sh"
        };
        let _ = Command::new(format!("{}/scripts/{name}", env!("CARGO_MANIFEST_DIR")))
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

/// kill -9 of the postmaster of the server in `data`, then waits (at most 10 s) until every
/// process of it has exited: no commit can land on it after that.
fn kill_server(data: &Path) {
    let pid = std::fs::read_to_string(data.join("postmaster.pid")).expect("postmaster.pid");
    let pid = pid.lines().next().unwrap_or_default().trim().to_owned();
    let _ = Command::new("kill").args(["-9", &pid]).status();
    // Every PostgreSQL process works in its data directory; a zombie has exited.
    let running = || {
        std::fs::read_dir("/proc").is_ok_and(|procs| {
            procs.flatten().any(|p| {
                std::fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd == data)
                    && std::fs::read_to_string(p.path().join("stat"))
                        .is_ok_and(|stat| !stat.contains(") Z "))
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}
