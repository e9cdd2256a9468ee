//! The stores under test: a Postgres schema per test in the throwaway cluster started by
//! scripts/test.sh, or a SQLite file per test in the temp directory. Here: [`TestDb`]
//! made, attached and opened as a store, the lock guards, and [`failure`]; its other
//! methods by what they do:
//!
//! * `rows.rs` — rows read and written behind the store's back, on either backend.
//! * `locks.rs` — locks held open for the store to wait on, and waits for its waiters.
//! * `postgres.rs` — Postgres only: SQL on the test's connection, the ring, statistics.
//! * `sealed.rs` — encryption at rest: test keyrings, sealing stores, the raw bodies.

mod locks;
mod postgres;
mod rows;
mod sealed;

pub use sealed::{key_text, keyring, seal_config};

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookgate::config::StoreConfig;
use hookgate::store::Store;

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

    /// A fresh schema on the Postgres server (or servers: a failover pair) `url` names.
    pub async fn on_url(url: &str) -> Self {
        let n = DATABASES.fetch_add(1, Ordering::SeqCst);
        let schema = format!("t{}_{n}_{}", std::process::id(), fastrand::u32(..));
        Self::attach_pg(url.to_owned(), schema).await
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

    /// A migrated store whose connections carry a name of their own (`prefix` and a random
    /// number), returned with it: the statistics of what it read reach Postgres's views
    /// only when its connections end (see [`TestDb::close`]).
    pub async fn named_store(&self, prefix: &str, pool_size: usize) -> (Arc<dyn Store>, String) {
        let name = format!("{prefix}_{}", fastrand::u32(..));
        let config = StoreConfig {
            url: format!("{}?application_name={name}", self.url),
            schema: self.schema.clone(),
            pool_size,
            ..StoreConfig::default()
        };
        (self.store_with(config).await, name)
    }

    /// Drops `store` and waits until its connections, named `name`, have ended.
    pub async fn close(&self, store: Arc<dyn Store>, name: &str) {
        drop(store);
        crate::helpers::eventually("the store's connections to end", || async {
            self.backends(name).await == 0
        })
        .await;
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

    /// A new connection to this schema (Postgres), for a transaction the test holds open.
    async fn own_connection(&self) -> tokio_postgres::Client {
        let mut config: tokio_postgres::Config = self.url.parse().expect("test database URL");
        config.options(format!("-c search_path={}", self.schema));
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect");
        actix_rt::spawn(connection);
        client
    }
}

/// An open transaction holding a new row's lock (see [`TestDb::hold_new_row`]).
pub struct RowLock {
    client: tokio_postgres::Client,
}

impl RowLock {
    /// Rolls the insert back: the blocked claim goes on and finds no row.
    pub async fn release(self) {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .expect("rollback");
    }

    /// Commits the insert, as the claim it stands for would: a blocked claim finds the row.
    pub async fn commit(self) {
        self.client.batch_execute("COMMIT").await.expect("commit");
    }
}

/// The whole events table locked (see [`TestDb::lock_table`]).
pub enum TableLock {
    Pg(tokio_postgres::Client),
    Sqlite(rusqlite::Connection),
}

impl TableLock {
    /// Ends the transaction: every statement that waited goes on.
    pub async fn release(self) {
        match self {
            TableLock::Pg(client) => client.batch_execute("ROLLBACK").await.expect("rollback"),
            TableLock::Sqlite(conn) => conn.execute_batch("ROLLBACK").expect("rollback"),
        }
    }
}

/// A failed attempt's record: a target's 500, with a payload and kept headers; `dead`
/// makes it a dead letter.
pub fn failure(dead: Option<hookgate::outcome::DeadReason>) -> hookgate::store::Failure {
    hookgate::store::Failure {
        error: "target answered 500".into(),
        dead,
        payload: actix_web::web::Bytes::from_static(b"{\"a\":1}"),
        content_type: Some("application/json".into()),
        headers: Some(r#"{"x-sender":"s1"}"#.into()),
        retry_in: None,
        uncounted: false,
        history: None,
    }
}
