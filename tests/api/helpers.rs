//! Test harness: a real Postgres schema per test, a real HTTP target that counts
//! deliveries per `Idempotency-Key`, a TCP proxy that can cut the store's network, and
//! `spawn_app`, which starts a whole hookgate node on port 0.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures_util::future::LocalBoxFuture;
use hookgate::config::{Config, StoreConfig};
use hookgate::startup::Application;
use hookgate::store::Store;
use hookgate::worker::{Delivery, DeliveryOutcome, DeliveryRequest, HttpDelivery};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Waits for `condition` to hold, polling, failing the test after a generous deadline.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------
// The stores: a Postgres schema per test in the throwaway cluster started by
// scripts/test.sh, or a SQLite file per test in the temp directory.

static DATABASES: AtomicUsize = AtomicUsize::new(0);

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A SQLite file removed (with its WAL files) when the last handle on it goes.
struct SqliteFile(PathBuf);

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

enum Inspect {
    Pg(tokio_postgres::Client),
    Sqlite(Arc<SqliteFile>),
}

/// A fresh database for one test, and a direct connection for inspecting rows.
pub struct TestDb {
    pub url: String,
    pub schema: String,
    inspect: Inspect,
}

impl TestDb {
    /// A fresh Postgres schema.
    pub async fn new() -> Self {
        Self::on(Backend::Postgres).await
    }

    pub async fn on(backend: Backend) -> Self {
        let n = DATABASES.fetch_add(1, Ordering::SeqCst);
        let unique = format!("t{}_{n}_{}", std::process::id(), fastrand::u32(..));
        match backend {
            Backend::Postgres => {
                let url = std::env::var("HOOKGATE_TEST_DATABASE_URL").expect(
                    "HOOKGATE_TEST_DATABASE_URL is not set: run the suite with scripts/test.sh, \
                     which starts a throwaway PostgreSQL",
                );
                Self::attach_pg(url, unique).await
            }
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join("hookgate-tests");
                std::fs::create_dir_all(&dir).expect("temp dir");
                let path = dir.join(format!("{unique}.db"));
                Self {
                    url: format!("sqlite://{}", path.display()),
                    schema: String::new(),
                    inspect: Inspect::Sqlite(Arc::new(SqliteFile(path))),
                }
            }
        }
    }

    async fn attach_pg(url: String, schema: String) -> Self {
        let mut config: tokio_postgres::Config = url.parse().expect("test database URL");
        config.options(format!("-c search_path={schema}"));
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        actix_rt::spawn(connection);
        Self {
            url,
            schema,
            inspect: Inspect::Pg(client),
        }
    }

    /// Another handle on the same database (a second node's view of it).
    pub async fn attach(&self) -> Self {
        match &self.inspect {
            Inspect::Pg(_) => Self::attach_pg(self.url.clone(), self.schema.clone()).await,
            Inspect::Sqlite(file) => Self {
                url: self.url.clone(),
                schema: String::new(),
                inspect: Inspect::Sqlite(Arc::clone(file)),
            },
        }
    }

    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            url: self.url.clone(),
            schema: if self.schema.is_empty() {
                "public".into()
            } else {
                self.schema.clone()
            },
            pool_size: 8,
            ..StoreConfig::default()
        }
    }

    /// A migrated store on this database.
    pub async fn store(&self) -> Arc<dyn Store> {
        self.store_with(self.store_config()).await
    }

    pub async fn store_with(&self, config: StoreConfig) -> Arc<dyn Store> {
        let store = hookgate::store::open(&config).await.expect("store");
        store.migrate().await.expect("migrate");
        store
    }

    fn sqlite(file: &SqliteFile) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(&file.0).expect("open the test SQLite file");
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn
    }

    /// Moves a row's lease into the past, as if its lease had run out long ago.
    pub async fn expire_lease(&self, provider: &str, key: &str) {
        let n = match &self.inspect {
            Inspect::Pg(client) => client
                .execute(
                    "UPDATE webhook_events SET locked_until = now() - interval '1 day'
                     WHERE provider = $1 AND event_key = $2",
                    &[&provider, &key],
                )
                .await
                .expect("expire lease"),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .execute(
                    "UPDATE webhook_events SET locked_until = unixepoch('subsec') - 86400
                     WHERE provider = ?1 AND event_key = ?2",
                    [provider, key],
                )
                .expect("expire lease") as u64,
        };
        assert_eq!(n, 1, "no row {provider}:{key} to expire");
    }

    /// The row's status, or `None`.
    pub async fn status(&self, provider: &str, key: &str) -> Option<String> {
        match &self.inspect {
            Inspect::Pg(client) => client
                .query_opt(
                    "SELECT status FROM webhook_events WHERE provider = $1 AND event_key = $2",
                    &[&provider, &key],
                )
                .await
                .expect("status query")
                .map(|row| row.get(0)),
            Inspect::Sqlite(file) => {
                use rusqlite::OptionalExtension;
                Self::sqlite(file)
                    .query_row(
                        "SELECT status FROM webhook_events WHERE provider = ?1 AND event_key = ?2",
                        [provider, key],
                        |r| r.get(0),
                    )
                    .optional()
                    .expect("status query")
            }
        }
    }

    pub async fn count_rows(&self) -> i64 {
        match &self.inspect {
            Inspect::Pg(client) => client
                .query_one("SELECT count(*) FROM webhook_events", &[])
                .await
                .expect("count")
                .get(0),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))
                .expect("count"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The target: a real HTTP server that counts deliveries per Idempotency-Key.

/// How the target answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 201 with `{"received": "<idempotency key>"}`.
    Accept,
    /// This status, with an empty body.
    Status(u16),
    /// Counts the delivery, then holds the request until `release()`.
    Hang,
}

/// What the target saw of the last delivery of a key.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub attempt: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

struct TargetState {
    counts: Mutex<HashMap<String, usize>>,
    last: Mutex<HashMap<String, Seen>>,
    behaviour: Mutex<Behaviour>,
    release: watch::Sender<bool>,
}

#[derive(Clone)]
pub struct TestTarget {
    pub url: String,
    state: Arc<TargetState>,
}

impl TestTarget {
    pub async fn start() -> Self {
        let (release, _) = watch::channel(false);
        let state = Arc::new(TargetState {
            counts: Mutex::default(),
            last: Mutex::default(),
            behaviour: Mutex::new(Behaviour::Accept),
            release,
        });
        let data = web::Data::from(Arc::clone(&state));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(receive))
        })
        .workers(2)
        .disable_signals()
        .shutdown_timeout(0)
        .bind("127.0.0.1:0")
        .expect("bind target");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        Self {
            url: format!("http://127.0.0.1:{port}/effects"),
            state,
        }
    }

    pub fn set(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().unwrap() = behaviour;
        if behaviour != Behaviour::Hang {
            self.state.release.send_replace(false);
        }
    }

    /// Lets every held request answer 201.
    pub fn release(&self) {
        *self.state.behaviour.lock().unwrap() = Behaviour::Accept;
        self.state.release.send_replace(true);
    }

    /// Deliveries received for `provider:key`.
    pub fn count(&self, idempotency_key: &str) -> usize {
        self.state
            .counts
            .lock()
            .unwrap()
            .get(idempotency_key)
            .copied()
            .unwrap_or(0)
    }

    /// The last delivery of `provider:key`, as the target received it.
    pub fn last(&self, idempotency_key: &str) -> Seen {
        self.state
            .last
            .lock()
            .unwrap()
            .get(idempotency_key)
            .cloned()
            .unwrap_or_default()
    }

    /// Forgets every count (between sub-cases of one test).
    pub fn reset(&self) {
        self.state.counts.lock().unwrap().clear();
        self.state.last.lock().unwrap().clear();
    }

    pub fn total(&self) -> usize {
        self.state.counts.lock().unwrap().values().sum()
    }

    pub async fn wait_for(&self, idempotency_key: &str, n: usize) {
        eventually(&format!("{n} deliveries of {idempotency_key}"), || async {
            self.count(idempotency_key) >= n
        })
        .await;
    }
}

async fn receive(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<TargetState>,
) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let key = header("Idempotency-Key").unwrap_or_default();
    *state.counts.lock().unwrap().entry(key.clone()).or_default() += 1;
    state.last.lock().unwrap().insert(
        key.clone(),
        Seen {
            attempt: header("Hookgate-Attempt"),
            content_type: header("Content-Type"),
            body: body.to_vec(),
        },
    );
    let behaviour = *state.behaviour.lock().unwrap();
    match behaviour {
        Behaviour::Accept => {}
        Behaviour::Status(code) => {
            return HttpResponse::build(code.try_into().unwrap()).finish();
        }
        Behaviour::Hang => {
            let mut released = state.release.subscribe();
            let _ = released.wait_for(|r| *r).await;
        }
    }
    HttpResponse::Created().json(serde_json::json!({ "received": key }))
}

// ---------------------------------------------------------------------------------------
// A delivery seam that panics: the first attempt of any key containing "panic".

pub struct PanickingDelivery;

impl Delivery for PanickingDelivery {
    fn deliver(&self, request: DeliveryRequest) -> LocalBoxFuture<'static, DeliveryOutcome> {
        if request.attempt == 1 && request.idempotency_key.contains("panic") {
            panic!("injected delivery panic for {}", request.idempotency_key);
        }
        HttpDelivery.deliver(request)
    }
}

// ---------------------------------------------------------------------------------------
// A TCP proxy in front of Postgres whose network can be cut and restored.

#[derive(Clone)]
pub struct StoreProxy {
    pub port: u16,
    down: watch::Sender<bool>,
}

impl StoreProxy {
    pub async fn start(upstream_url: &str) -> Self {
        let config: tokio_postgres::Config = upstream_url.parse().unwrap();
        let host = match &config.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[allow(unreachable_patterns)]
            _ => panic!("the test database must be reached over TCP"),
        };
        let upstream = format!("{host}:{}", config.get_ports()[0]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (down, _) = watch::channel(false);
        let down_rx = down.subscribe();
        actix_rt::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if *down_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut cut = down_rx.clone();
                actix_rt::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut a, mut b) = (inbound, outbound);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = cut.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        Self { port, down }
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.down.send_replace(true);
    }

    pub fn restore(&self) {
        self.down.send_replace(false);
    }

    /// `url` with its port replaced by the proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let config: tokio_postgres::Config = url.parse().unwrap();
        url.replace(
            &format!(":{}/", config.get_ports()[0]),
            &format!(":{}/", self.port),
        )
    }
}

// ---------------------------------------------------------------------------------------
// A whole node.

pub const PROVIDER: &str = "stripe";

/// The config every test starts from; tests edit the struct, never env vars.
pub fn base_config(db: &TestDb, target: &TestTarget) -> Config {
    let mut config = Config::from_toml(&format!(
        r#"
        [server]
        listen = "127.0.0.1:0"
        shards = 4
        workers_per_shard = 4
        http_workers = 2
        [[providers]]
        name = "{PROVIDER}"
        key = [{{ header = "X-Idempotency-Key" }}, {{ json = "/id" }}]
        target = {{ url = "{}", timeout = "10s" }}
        "#,
        target.url
    ))
    .expect("test config");
    config.store = db.store_config();
    config.shutdown.grace = Duration::ZERO;
    config
}

/// Log lines a node wrote, as JSON values (the same drain format as production).
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    pub fn logger(&self) -> slog::Logger {
        use slog::Drain;
        let drain = slog_json::Json::new(self.clone())
            .add_default_keys()
            .build();
        slog::Logger::root(Mutex::new(drain).fuse(), slog::o!())
    }

    pub fn lines(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect()
    }

    /// Lines with message `msg` whose `event_key` is `key`.
    pub fn events(&self, msg: &str, key: &str) -> Vec<serde_json::Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["msg"] == msg && l["event_key"] == key)
            .collect()
    }
}

pub struct TestApp {
    pub log: CapturedLog,
    pub address: String,
    pub db: TestDb,
    pub target: TestTarget,
    pub store: Arc<dyn Store>,
    handle: ServerHandle,
    stopped: Option<tokio::sync::oneshot::Receiver<anyhow::Result<()>>>,
    client: awc::Client,
}

/// The answer to one delivery, as a sender sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub path: String,
    pub attempt: Option<i32>,
    pub retry_after: Option<u64>,
    pub body: String,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(edit: impl FnOnce(&mut Config)) -> TestApp {
    spawn_app_on(Backend::Postgres, edit).await
}

/// A node on a fresh database of `backend`.
pub async fn spawn_app_on(backend: Backend, edit: impl FnOnce(&mut Config)) -> TestApp {
    let db = TestDb::on(backend).await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    edit(&mut config);
    start_node(db, target, config, Arc::new(HttpDelivery)).await
}

/// Starts a node on `config` (its store, target and delivery seam are the caller's).
pub async fn start_node(
    db: TestDb,
    target: TestTarget,
    config: Config,
    delivery: Arc<dyn Delivery>,
) -> TestApp {
    let store = db.store_with(config.store.clone()).await;
    let log = CapturedLog::default();
    let app = Application::build(&config, Arc::clone(&store), delivery, log.logger())
        .await
        .expect("build app");
    let address = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    let (tx, rx) = tokio::sync::oneshot::channel();
    actix_rt::spawn(async move {
        let _ = tx.send(app.run_until_stopped().await);
    });
    TestApp {
        log,
        address,
        db,
        target,
        store,
        handle,
        stopped: Some(rx),
        client: awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish(),
    }
}

impl TestApp {
    /// A second node on the same schema and target (several nodes, one database).
    pub async fn second_node(&self, edit: impl FnOnce(&mut Config)) -> TestApp {
        let db = self.db.attach().await;
        let mut config = base_config(&db, &self.target);
        edit(&mut config);
        start_node(db, self.target.clone(), config, Arc::new(HttpDelivery)).await
    }

    pub fn idem(key: &str) -> String {
        format!("{PROVIDER}:{key}")
    }

    /// Sends a delivery in the background and forgets it (the node may stop under it).
    pub fn fire(&self, key: &str, body: &str) {
        let request = awc::Client::new()
            .post(format!("{}/webhooks/{PROVIDER}", self.address))
            .insert_header(("X-Idempotency-Key", key.to_owned()));
        let body = body.to_owned();
        actix_rt::spawn(async move {
            let _ = request.send_body(body).await;
        });
    }

    /// POSTs `body` to `/webhooks/stripe` with the key in `X-Idempotency-Key`.
    pub async fn deliver(&self, key: &str, body: &str) -> Answer {
        self.post(
            &format!("/webhooks/{PROVIDER}"),
            &[("X-Idempotency-Key", key)],
            body.to_owned(),
        )
        .await
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: String) -> Answer {
        let mut request = self
            .client
            .post(format!("{}{path}", self.address))
            .insert_header(("Content-Type", "application/json"));
        for (name, value) in headers {
            request = request.insert_header((*name, *value));
        }
        let response = request.send_body(body).await.expect("request");
        Self::answer(response).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        let response = self
            .client
            .get(format!("{}{path}", self.address))
            .send()
            .await
            .expect("request");
        Self::answer(response).await
    }

    /// GET with `Authorization: <auth>`.
    pub async fn get_with(&self, path: &str, auth: &str) -> Answer {
        let response = self
            .client
            .get(format!("{}{path}", self.address))
            .insert_header(("Authorization", auth))
            .send()
            .await
            .expect("request");
        Self::answer(response).await
    }

    pub async fn request(&self, method: awc::http::Method, path: &str) -> Answer {
        let response = self
            .client
            .request(method, format!("{}{path}", self.address))
            .send()
            .await
            .expect("request");
        Self::answer(response).await
    }

    async fn answer<S>(mut response: awc::ClientResponse<S>) -> Answer
    where
        S: futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>
            + Unpin,
    {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let path = header("Hookgate-Path").unwrap_or_default();
        let attempt = header("Hookgate-Attempt").and_then(|v| v.parse().ok());
        let retry_after = header("Retry-After").and_then(|v| v.parse().ok());
        let status = response.status().as_u16();
        let body = response.body().limit(1 << 20).await.expect("body");
        Answer {
            status,
            path,
            attempt,
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// Stops the node the way SIGTERM does and waits until it has released its leases.
    pub async fn shutdown(&mut self) {
        self.handle.stop(true).await;
        if let Some(stopped) = self.stopped.take() {
            stopped.await.expect("node task").expect("node stopped");
        }
    }
}
