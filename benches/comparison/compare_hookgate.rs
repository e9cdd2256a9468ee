//! hookgate's side of the queue comparison: the release binary's config for a run (one
//! queue-mode provider `bench`, defaults for everything not given), its schema made by the
//! binary's own `migrate`, the burn-down's preloaded rows, and the node started and
//! stopped through `node.rs`. Knows nothing of what is measured.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hookgate::canonical::{Body, Fingerprinter};

use hookgate_kit::node::{free_port, Node};

/// The provider's name: rows carry it, and the target sees `bench:<key>`.
pub const PROVIDER: &str = "bench";

/// The schema hookgate's rows live in, inside the run's own database.
const SCHEMA: &str = "hookgate";

/// Rows a preload statement inserts.
const PRELOAD_CHUNK: usize = 5_000;

/// The settings a run changes; `None` keeps hookgate's default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sizing {
    pub shards: Option<usize>,
    pub workers_per_shard: Option<usize>,
    pub pool_size: Option<usize>,
    /// `queue.poll_interval`.
    pub poll_interval: Option<Duration>,
}

/// Writes the node's config into `dir`, creates its schema with `hookgate migrate`, and
/// answers the node, not started yet.
pub fn prepare(dir: &Path, database_url: &str, target: &str, sizing: Sizing) -> Node {
    let port = free_port();
    let optional = |name: &str, value: Option<usize>| {
        value.map_or(String::new(), |v| format!("{name} = {v}\n"))
    };
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\n{}{}\
         [store]\nurl = \"{database_url}\"\nschema = \"{SCHEMA}\"\n{}\
         [[providers]]\nname = \"{PROVIDER}\"\npreset = \"none\"\nmode = \"queue\"\n\
         key = [{{ header = \"X-Idempotency-Key\" }}]\ntarget = {{ url = \"{target}\" }}\n{}",
        optional("shards", sizing.shards),
        optional("workers_per_shard", sizing.workers_per_shard),
        optional("pool_size", sizing.pool_size),
        sizing.poll_interval.map_or(String::new(), |p| {
            format!("[queue]\npoll_interval = \"{}ms\"\n", p.as_millis())
        }),
    );
    let file = dir.join("hookgate.toml");
    std::fs::write(&file, config).expect("write the node's config");
    let status = Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["migrate", "--config"])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run hookgate migrate");
    assert!(status.success(), "hookgate migrate failed: {status}");
    let mut node = Node::new(
        crate::BINARY,
        "hookgate",
        file,
        dir.join("hookgate.log"),
        port,
    );
    node.stderr = Some(dir.join("hookgate.stderr"));
    node
}

/// The table the burn-down preloads (for `VACUUM ANALYZE` and the check at the end).
pub fn table() -> String {
    format!("{SCHEMA}.webhook_events")
}

/// The key of preloaded event `i`, the same for both systems (`worker.js` writes it too).
pub fn burndown_key(i: u64) -> String {
    format!("b-{i}")
}

/// Writes `events` queue rows as an accepted request leaves them (the store's `ENQUEUE`
/// statement): `queued`, attempts 0, due now, with the payload, its fingerprint and the
/// kept headers.
pub async fn preload(database_url: &str, events: u64) {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .expect("connect to the run's database");
    actix_rt::spawn(connection);
    let insert = format!(
        "INSERT INTO {} (provider, event_key, status, attempts, last_path, fingerprint, mode,
                         payload, content_type, request_headers, next_attempt_at)
         SELECT '{PROVIDER}', k, 'queued', 0, 'queued', f, 'queue', p, 'application/json', h,
                now()
         FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) AS t(k, f, p, h)",
        table()
    );
    let fingerprints = Fingerprinter::new(true, Vec::new());
    let keys: Vec<String> = (0..events).map(burndown_key).collect();
    for chunk in keys.chunks(PRELOAD_CHUNK) {
        let payloads: Vec<Vec<u8>> = chunk
            .iter()
            .map(|k| format!(r#"{{"id":"{k}","type":"bench.event"}}"#).into_bytes())
            .collect();
        let prints: Vec<Option<String>> = payloads
            .iter()
            .map(|p| fingerprints.fingerprint(&Body::new(p)))
            .collect();
        let headers: Vec<String> = chunk
            .iter()
            .map(|k| format!(r#"{{"content-type":"application/json","x-idempotency-key":"{k}"}}"#))
            .collect();
        client
            .execute(&insert, &[&chunk, &prints, &payloads, &headers])
            .await
            .expect("preload queue rows");
    }
}

/// Rows not `done` (the check after a run; 0 when every delivery was recorded).
pub async fn unfinished(database_url: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
        .await
        .expect("connect to the run's database");
    actix_rt::spawn(connection);
    let query = format!("SELECT count(*) FROM {} WHERE status <> 'done'", table());
    client
        .query_one(&query, &[])
        .await
        .expect("count unfinished rows")
        .get(0)
}

/// A scratch directory for one run's config and logs.
pub fn run_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "hookgate-queue-compare-{}-{label}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("run dir");
    dir
}
