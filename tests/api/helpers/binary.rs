//! The `hookgate` binary as a real child process on a test database, through the kit's
//! node runner: a node that can be killed with SIGKILL mid-delivery, as a crash or an OOM
//! kill would.

use std::path::PathBuf;
use std::time::Duration;

use hookgate_kit::node::{free_port, Node};

use super::{TestDb, TestTarget, PROVIDER};

pub struct BinaryNode {
    node: Node,
    pub address: String,
    dir: PathBuf,
}

impl BinaryNode {
    /// Starts the binary serving [`PROVIDER`] in queue mode (lease 2 s, scheduler polling
    /// every 100 ms) on `db`'s schema, delivering to `target`.
    pub async fn start_queue(db: &TestDb, target: &TestTarget) -> Self {
        Self::start_queue_with(db, target, "").await
    }

    /// [`BinaryNode::start_queue`] with `provider` (TOML) added to the provider's entry.
    pub async fn start_queue_with(db: &TestDb, target: &TestTarget, provider: &str) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("hookgate-node-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("node dir");
        let config = dir.join("hookgate.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[server]
listen = "127.0.0.1:{port}"
shards = 2
workers_per_shard = 4
[store]
url = "{url}"
schema = "{schema}"
statement_timeout = "1s"
[lease]
duration = "2s"
[retry]
base = "3s"
[queue]
poll_interval = "100ms"
[[providers]]
name = "{PROVIDER}"
preset = "none"
mode = "queue"
key = [{{ header = "X-Idempotency-Key" }}, {{ json = "/id" }}]
target = {{ url = "{target}", timeout = "1s" }}
{provider}
"#,
                url = db.url,
                schema = db.schema,
                target = target.url,
            ),
        )
        .expect("node config");
        let mut node = Node::new(
            env!("CARGO_BIN_EXE_hookgate"),
            "test",
            config,
            dir.join("node.log"),
            port,
        );
        node.stderr = Some(dir.join("stderr.log"));
        node.start().await;
        Self {
            node,
            address: format!("http://127.0.0.1:{port}"),
            dir,
        }
    }

    /// POSTs a delivery of `key`; the status, or `None` when the node did not answer.
    pub async fn deliver(&self, key: &str) -> Option<u16> {
        awc::Client::builder()
            .timeout(Duration::from_secs(30))
            .finish()
            .post(format!("{}/webhooks/{PROVIDER}", self.address))
            .insert_header(("X-Idempotency-Key", key))
            .send_body("{}")
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    /// What the node has written to stdout (its JSON log lines) so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.node.log).unwrap_or_default()
    }

    /// SIGKILL: the process dies wherever it is, recording nothing more.
    pub fn kill9(&mut self) {
        self.node.kill();
    }
}

impl Drop for BinaryNode {
    fn drop(&mut self) {
        self.node.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
