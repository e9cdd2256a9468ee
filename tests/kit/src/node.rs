//! A hookgate node as a child process: the `hookgate` binary with its config file and log,
//! started, SIGTERMed and SIGKILLed (a crash, an OOM kill), and asked whether it died by
//! itself. Owns nothing about what the node is sent.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The node under test: the binary with its config file.
pub struct Node {
    /// The `hookgate` executable: `env!("CARGO_BIN_EXE_hookgate")` in the caller, the one
    /// place it is known.
    pub binary: PathBuf,
    /// Name in reports (`A`, `B`).
    pub name: &'static str,
    /// Its config file.
    pub config: PathBuf,
    /// Its stdout (the JSON log), appended over restarts.
    pub log: PathBuf,
    /// Where its stderr goes; `None`: the bench's own stderr.
    pub stderr: Option<PathBuf>,
    /// The port it listens on.
    pub port: u16,
    /// Environment variables set on the child (the admin token).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    /// Exits the bench did not cause, with when they were noticed.
    pub died: Vec<(Instant, ExitStatus)>,
}

impl Node {
    /// A node not started yet, of `binary`.
    pub fn new(
        binary: impl Into<PathBuf>,
        name: &'static str,
        config: PathBuf,
        log: PathBuf,
        port: u16,
    ) -> Self {
        Self {
            binary: binary.into(),
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
        let child = Command::new(&self.binary)
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

/// The p99 of `hookgate_outcome_write_seconds` (target's answer → outcome written), over
/// every provider, from a running node's `/metrics`, in milliseconds, interpolated within
/// its bucket as Prometheus's `histogram_quantile` does (`None` before any write).
pub async fn outcome_write_p99_ms(port: u16) -> Option<f64> {
    let text = awc::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .body()
        .limit(16 << 20)
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&text);
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("hookgate_outcome_write_seconds_bucket{") else {
            continue;
        };
        let le = rest.split("le=\"").nth(1)?.split('"').next()?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let count: f64 = line.rsplit(' ').next()?.parse().ok()?;
        match buckets.iter_mut().find(|(b, _)| *b == le) {
            Some(bucket) => bucket.1 += count,
            None => buckets.push((le, count)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    let rank = total * 0.99;
    let at = buckets.iter().position(|(_, count)| *count >= rank)?;
    let (upper, count) = buckets[at];
    let (lower, below) = if at == 0 { (0.0, 0.0) } else { buckets[at - 1] };
    if upper.is_infinite() {
        return Some(lower * 1e3);
    }
    Some((lower + (upper - lower) * (rank - below) / (count - below)) * 1e3)
}
