//! A hookgate node under chaos: the release binary as a child process with its config
//! file and log, started, SIGTERMed and SIGKILLed by the chaos scenarios, and asked
//! whether it died by itself. Owns nothing about what the node is sent.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The node under test: the release binary with its config file.
pub struct Node {
    /// Name in reports (`A`, `B`).
    pub name: &'static str,
    pub config: PathBuf,
    /// Its stdout (the JSON log), appended over restarts.
    pub log: PathBuf,
    /// Where its stderr goes; `None`: the bench's own stderr.
    pub stderr: Option<PathBuf>,
    pub port: u16,
    /// Environment variables set on the child (the admin token).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    /// Exits the bench did not cause, with when they were noticed.
    pub died: Vec<(Instant, ExitStatus)>,
}

impl Node {
    /// A node not started yet.
    pub fn new(name: &'static str, config: PathBuf, log: PathBuf, port: u16) -> Self {
        Self {
            name,
            config,
            log,
            stderr: None,
            port,
            env: Vec::new(),
            child: None,
            died: Vec::new(),
        }
    }

    /// Starts the binary and waits (bounded) until `/healthz` answers.
    pub async fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("node log");
        let stderr = match &self.stderr {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .expect("node stderr"),
            ),
            None => Stdio::inherit(),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(["serve", "--config"])
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::from(log))
            .stderr(stderr)
            .spawn()
            .expect("start the hookgate binary");
        self.child = Some(child);
        let client = awc::Client::new();
        let url = format!("http://127.0.0.1:{}/healthz", self.port);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = client.get(&url).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("hookgate did not come up; see {}", self.log.display());
    }

    /// Notes an exit the bench did not cause; answers whether the node is running.
    pub fn reap(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                self.died.push((Instant::now(), status));
                self.child = None;
                false
            }
            _ => true,
        }
    }

    /// SIGTERM, and waits for the graceful exit (at most a minute, then SIGKILL).
    pub async fn terminate(&mut self) {
        self.reap();
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                actix_rt::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL: the process dies wherever it is.
    pub fn kill(&mut self) {
        self.reap();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A port nobody listens on now, for a node's fixed `listen` (it keeps it over restarts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
