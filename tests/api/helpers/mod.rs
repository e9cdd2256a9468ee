//! Test harness: a real database per test ([`db`]), the hookgate binary as a child
//! process ([`binary`]), a primary + standby pair to fail over ([`ha`]), one wrapper that puts faults into a real
//! store ([`wrapped`], with the seeded [`chaos`] and the targeted [`faults`]),
//! captured JSON logs ([`log`]), an OTLP/HTTP collector ([`collector`]), setups several files share ([`setups`]), a target answering `103 Early Hints` ([`early_hints`]),
//! and `spawn_app`, which starts a whole hookgate node on port 0. The counting target,
//! the store proxy and `eventually` are the kit's (`hookgate_kit`), shared with the
//! benches, and re-exported here.

mod binary;
mod chaos;
mod collector;
mod db;
mod early_hints;
mod faults;
mod ha;
mod log;
mod setups;
pub mod webdriver;
mod wrapped;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use hookgate::config::Config;
use hookgate::outcome::DeliveryOutcome;
use hookgate::scheduler::Scheduler;
use hookgate::startup::{Application, Stopper};
use hookgate::store::Store;
use hookgate::worker::{Delivery, DeliveryRequest, HttpDelivery};

pub use binary::BinaryNode;
pub use chaos::{AttemptNote, Call, ChaosStore, Journal, Outage, Span, Weather};
pub use collector::{attr, Answering, Collector};
pub use db::{failure, key_text, keyring, seal_config, Backend, TestDb};
pub use early_hints::early_hints_target;
pub use faults::{FaultyStore, WritesHeld};
pub use ha::HaPair;
pub use hookgate_kit::eventually;
pub use hookgate_kit::proxy::StoreProxy;
pub use hookgate_kit::target::{Arrival, Behaviour, Target as TestTarget, ERROR_PAGE};
pub use log::CapturedLog;
pub use setups::{
    bearer, dead_letter, failed_sync_row_and_a_queue_node, long_deliveries, queue_mode,
};
pub use wrapped::Op;

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
        # Room for every test's parallel burst on one shard: keys spread over shards by a
        # hasher keyed per process, so a burst's spread differs run to run. Tests of
        # admission set their own.
        admission_queue = 64
        http_workers = 2
        [[providers]]
        name = "{PROVIDER}"
        preset = "none"
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

pub struct TestApp {
    pub log: CapturedLog,
    pub address: String,
    pub db: TestDb,
    pub target: TestTarget,
    pub store: Arc<dyn Store>,
    pub scheduler: Arc<Scheduler>,
    pub operator_work: Arc<hookgate::operator_work::OperatorWork>,
    stopper: Stopper,
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

/// A node on a fresh Postgres schema whose store connection runs through a
/// [`StoreProxy`] the test can cut and restore.
pub async fn spawn_app_behind_proxy() -> (TestApp, StoreProxy) {
    spawn_app_behind_proxy_with(|_| {}).await
}

/// [`spawn_app_behind_proxy`] with the config edited first.
pub async fn spawn_app_behind_proxy_with(edit: impl FnOnce(&mut Config)) -> (TestApp, StoreProxy) {
    let db = TestDb::new().await;
    let proxy = StoreProxy::start(&db.url).await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    edit(&mut config);
    config.store.url = proxy.url_for(&db.url);
    let app = start_node(db, target, config, Arc::new(HttpDelivery)).await;
    (app, proxy)
}

/// Starts a node on `config` (its store, target and delivery seam are the caller's).
pub async fn start_node(
    db: TestDb,
    target: TestTarget,
    config: Config,
    delivery: Arc<dyn Delivery>,
) -> TestApp {
    let store = db.store_with(config.store.clone()).await;
    start_node_on(db, target, config, delivery, store).await
}

/// [`start_node`] on a store the caller made (for example one with a fault put in).
pub async fn start_node_on(
    db: TestDb,
    target: TestTarget,
    config: Config,
    delivery: Arc<dyn Delivery>,
    store: Arc<dyn Store>,
) -> TestApp {
    let log = CapturedLog::default();
    let app = Application::build(&config, Arc::clone(&store), delivery, log.logger())
        .await
        .expect("build app");
    let address = format!("http://127.0.0.1:{}", app.port());
    let stopper = app.stopper();
    let scheduler = app.scheduler();
    let operator_work = app.operator_work();
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
        scheduler,
        operator_work,
        stopper,
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

    /// Waits until the row of `key` (of [`PROVIDER`]) is `status`.
    pub async fn wait_status(&self, key: &str, status: &str) {
        eventually(&format!("{key} to be {status}"), || async {
            self.db.status(PROVIDER, key).await.as_deref() == Some(status)
        })
        .await;
    }

    /// Waits until the row of `key` is `status` and this node has ended `n` attempts of
    /// `key`. The row is written first; only then does the node free the attempt's worker,
    /// its provider's slot and its key, apply a pause the target asked for, and log the
    /// outcome (`webhook.done`, `webhook.failed`, `webhook.dead`). A scheduler pass in
    /// between finds the key still in flight, or no room, and takes nothing.
    pub async fn wait_ended(&self, key: &str, status: &str, n: usize) {
        self.wait_status(key, status).await;
        let outcomes = ["webhook.done", "webhook.failed", "webhook.dead"];
        eventually(&format!("{n} attempts of {key} to end"), || async {
            let ended = outcomes.iter().map(|m| self.log.events(m, key).len());
            ended.sum::<usize>() >= n
        })
        .await;
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
        let body = response.body().limit(16 << 20).await.expect("body");
        Answer {
            status,
            path,
            attempt,
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// The value of the first `/metrics` sample whose line starts with `prefix`, or 0.
    pub async fn metric(&self, prefix: &str) -> f64 {
        let text = self.get("/metrics").await.body;
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Runs the `hookgate` command line with `args` on this node's store, with a config
    /// naming its provider (sync mode, no signature) and target; answers its output.
    pub async fn run_cli(&self, args: &[&str]) -> std::process::Output {
        self.run_cli_with(args, "").await
    }

    /// [`TestApp::run_cli`] with `provider` (TOML) added to the provider's entry.
    pub async fn run_cli_with(&self, args: &[&str], provider: &str) -> std::process::Output {
        self.run_cli_in(args, "", provider, Vec::new()).await
    }

    /// [`TestApp::run_cli`] on a store sealing with the test keys `ids` (their variables
    /// set), refusing plaintext bodies if `strict`.
    pub async fn run_cli_sealed(
        &self,
        args: &[&str],
        ids: &[&str],
        strict: bool,
    ) -> std::process::Output {
        let keys: Vec<String> = ids
            .iter()
            .map(|id| format!("{{ id = \"{id}\", env = \"HOOKGATE_TEST_KEY_{id}\" }}"))
            .collect();
        let store = format!(
            "encryption = {{ keys = [{}], require_sealed = {strict} }}\n",
            keys.join(", ")
        );
        let env = ids
            .iter()
            .map(|id| (format!("HOOKGATE_TEST_KEY_{id}"), db::key_text(id)))
            .collect();
        self.run_cli_in(args, &store, "", env).await
    }

    /// The command line with `store` (TOML) added to `[store]`, `provider` to the
    /// provider's entry, and `env` set.
    async fn run_cli_in(
        &self,
        args: &[&str],
        store: &str,
        provider: &str,
        env: Vec<(String, String)>,
    ) -> std::process::Output {
        let dir = std::env::temp_dir().join(format!("hookgate-cli-{}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).expect("config dir");
        let config = dir.join("hookgate.toml");
        let schema = if self.db.schema.is_empty() {
            String::new()
        } else {
            format!("schema = \"{}\"\n", self.db.schema)
        };
        std::fs::write(
            &config,
            format!(
                "[store]\nurl = \"{}\"\n{schema}{store}[[providers]]\nname = \"{PROVIDER}\"\n\
                 preset = \"none\"\nkey = [{{ header = \"X-Idempotency-Key\" }}]\n\
                 target = {{ url = \"{}\" }}\n{provider}\n",
                self.db.url, self.target.url
            ),
        )
        .expect("write the config");
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let out = actix_web::rt::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
                .args(args)
                .arg("--config")
                .arg(&config)
                .envs(env)
                .output()
                .expect("run hookgate")
        })
        .await
        .expect("the command line");
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    /// Starts the node's graceful shutdown (as SIGTERM does) without waiting for it.
    pub fn start_shutdown(&self) {
        let stopper = self.stopper.clone();
        actix_rt::spawn(async move { stopper.stop().await });
    }

    /// Waits (bounded) until the node has stopped by itself; its result.
    pub async fn stopped_by_itself(&mut self) -> anyhow::Result<()> {
        let stopped = self.stopped.take().expect("the node is running");
        tokio::time::timeout(Duration::from_secs(20), stopped)
            .await
            .expect("the node did not stop by itself")
            .expect("node task")
    }

    /// Stops the node the way SIGTERM does and waits until everything in flight has
    /// been recorded.
    pub async fn shutdown(&mut self) {
        self.stopper.stop().await;
        if let Some(stopped) = self.stopped.take() {
            stopped.await.expect("node task").expect("node stopped");
        }
    }
}
