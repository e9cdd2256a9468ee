//! The operator during the queue-mode chaos run: lists dead letters (admin API) and replays
//! them with the command line (`hookgate dead replay`, a child process) and the admin API
//! (`POST /admin/dead/{provider}/{key}/replay`), tallying how each replay ended. Knows
//! nothing of the faults.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The bearer token both nodes are started with (loopback only; a bench secret).
pub const ADMIN_TOKEN: &str = "chaos-admin-token";

/// How long one replay may take: the target's slowest answer plus store trouble.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(30);

/// An operator with a node to talk to.
#[derive(Clone)]
pub struct Operator {
    client: awc::Client,
    provider: String,
    /// A config reaching Postgres directly, for the command line.
    config: PathBuf,
    /// How replays ended, `cli: …` / `api: …`.
    pub tally: Rc<RefCell<BTreeMap<String, usize>>>,
    /// Every key a replay was asked for, with when each replay was sent.
    pub replayed: Rc<RefCell<BTreeMap<String, Vec<Instant>>>>,
}

impl Operator {
    pub fn new(provider: &str, config: &Path) -> Self {
        Self {
            client: awc::Client::builder().timeout(REPLAY_TIMEOUT).finish(),
            provider: provider.to_owned(),
            config: config.to_owned(),
            tally: Rc::default(),
            replayed: Rc::default(),
        }
    }

    fn note_replay(&self, key: &str) {
        let mut replayed = self.replayed.borrow_mut();
        replayed
            .entry(key.to_owned())
            .or_default()
            .push(Instant::now());
    }

    fn note(&self, what: String) {
        *self.tally.borrow_mut().entry(what).or_default() += 1;
    }

    /// `GET /admin/dead?provider=…` on the node at `port`: the dead keys, or `None` when
    /// the node did not answer 200 with the documented shape.
    pub async fn list_dead(&self, port: u16) -> Option<Vec<String>> {
        let url = format!(
            "http://127.0.0.1:{port}/admin/dead?provider={}&limit=1000",
            self.provider
        );
        let mut response = self
            .client
            .get(url)
            .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
            .send()
            .await
            .ok()?;
        if response.status() != 200 {
            self.note(format!("list: {}", response.status().as_u16()));
            return None;
        }
        let body = response.body().limit(1 << 24).await.ok()?;
        let json: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let keys = json["dead"]
            .as_array()?
            .iter()
            .filter(|d| d["provider"] == self.provider.as_str())
            .filter_map(|d| d["event_key"].as_str().map(str::to_owned))
            .collect();
        Some(keys)
    }

    /// Replays `key` through the admin API of the node at `port`.
    pub async fn replay_api(&self, port: u16, key: &str) {
        self.note_replay(key);
        let url = format!(
            "http://127.0.0.1:{port}/admin/dead/{}/{key}/replay",
            self.provider
        );
        let sent = self
            .client
            .post(url)
            .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
            .send()
            .await;
        let what = match sent {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let body = response.body().limit(1 << 20).await.unwrap_or_default();
                let row = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|j| j["status"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| "-".into());
                format!("api: {status} {row}")
            }
            Err(e) => format!("api: {}", short(&e.to_string())),
        };
        self.note(what);
    }

    /// Replays `key` with `hookgate --config FILE dead replay PROVIDER KEY`.
    pub async fn replay_cli(&self, key: &str) {
        self.note_replay(key);
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .arg("--config")
            .arg(&self.config)
            .args(["dead", "replay", &self.provider, key])
            .env("HOOKGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .kill_on_drop(true)
            .output();
        let what = match actix_rt::time::timeout(REPLAY_TIMEOUT, run).await {
            Err(_) => "cli: timed out".to_owned(),
            Ok(Err(e)) => format!("cli: did not run: {e}"),
            Ok(Ok(out)) if out.status.success() => {
                let line = String::from_utf8_lossy(&out.stdout);
                match line.rsplit("; ").next() {
                    Some(end) => format!("cli: ok, {}", end.trim()),
                    None => "cli: ok".to_owned(),
                }
            }
            Ok(Ok(out)) => {
                let err = String::from_utf8_lossy(&out.stderr);
                format!("cli: {}, {}", out.status, short(&err))
            }
        };
        self.note(what);
    }
}

/// The gist of an error line: without keys and numbers, so the tally groups by kind.
fn short(text: &str) -> String {
    let line = text.lines().last().unwrap_or("").trim();
    let words: Vec<&str> = line
        .split_whitespace()
        .filter(|w| !w.contains("chaos-") && !w.chars().any(|c| c.is_ascii_digit()))
        .take(10)
        .collect();
    words.join(" ")
}
