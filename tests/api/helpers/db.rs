//! The stores under test: a Postgres schema per test in the throwaway cluster started by
//! scripts/test.sh, or a SQLite file per test in the temp directory.

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

    /// Moves the store's clock forward by `by` for every row: each of its instants — lease,
    /// due time, creation, last change — moves back by that much, which is what every
    /// comparison with `now()` sees when time passes.
    pub async fn advance_clock(&self, by: Duration) {
        match &self.inspect {
            Inspect::Pg(client) => {
                let ms = i64::try_from(by.as_millis()).expect("a step of sane size");
                client
                    .execute(
                        "UPDATE webhook_events SET
                             locked_until = locked_until - $1::bigint * interval '1 millisecond',
                             next_attempt_at = next_attempt_at - $1::bigint * interval '1 millisecond',
                             created_at = created_at - $1::bigint * interval '1 millisecond',
                             updated_at = updated_at - $1::bigint * interval '1 millisecond'",
                        &[&ms],
                    )
                    .await
                    .expect("advance the clock");
                // The ring's times too: its turns and emptyings come due as rows age.
                client
                    .execute(
                        "UPDATE hookgate_slots SET
                             opened_at = opened_at - $1::bigint * interval '1 millisecond',
                             sealed_at = sealed_at - $1::bigint * interval '1 millisecond'",
                        &[&ms],
                    )
                    .await
                    .expect("advance the ring's clock");
            }
            Inspect::Sqlite(file) => {
                Self::sqlite(file)
                    .execute(
                        "UPDATE webhook_events SET locked_until = locked_until - ?1,
                             next_attempt_at = next_attempt_at - ?1,
                             created_at = created_at - ?1, updated_at = updated_at - ?1",
                        [by.as_secs_f64()],
                    )
                    .expect("advance the clock");
            }
        }
    }

    /// Makes a queue row due now, as if its backoff (or lease) had passed long ago.
    pub async fn make_due(&self, provider: &str, key: &str) {
        let n = match &self.inspect {
            Inspect::Pg(client) => client
                .execute(
                    "UPDATE webhook_events SET next_attempt_at = now() - interval '1 day',
                         locked_until = LEAST(locked_until, now() - interval '1 day')
                     WHERE provider = $1 AND event_key = $2",
                    &[&provider, &key],
                )
                .await
                .expect("make due"),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .execute(
                    "UPDATE webhook_events SET next_attempt_at = unixepoch('subsec') - 86400,
                         locked_until = MIN(locked_until, unixepoch('subsec') - 86400)
                     WHERE provider = ?1 AND event_key = ?2",
                    [provider, key],
                )
                .expect("make due") as u64,
        };
        assert_eq!(n, 1, "no row {provider}:{key} to make due");
    }

    /// `(status, attempts, seconds since the claim, seconds left on the lease)`.
    pub async fn lease_state(&self, provider: &str, key: &str) -> (String, i32, f64, f64) {
        match &self.inspect {
            Inspect::Pg(client) => {
                let row = client
                    .query_one(
                        "SELECT status, attempts,
                                extract(epoch FROM now() - updated_at)::float8,
                                COALESCE(extract(epoch FROM locked_until - now()), 0)::float8
                         FROM webhook_events WHERE provider = $1 AND event_key = $2",
                        &[&provider, &key],
                    )
                    .await
                    .expect("lease state");
                (row.get(0), row.get(1), row.get(2), row.get(3))
            }
            Inspect::Sqlite(file) => Self::sqlite(file)
                .query_row(
                    "SELECT status, attempts, unixepoch('subsec') - updated_at,
                            COALESCE(locked_until - unixepoch('subsec'), 0)
                     FROM webhook_events WHERE provider = ?1 AND event_key = ?2",
                    [provider, key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .expect("lease state"),
        }
    }

    /// Seconds from a row's last change to when it is due again: the backoff its last
    /// failure wrote.
    pub async fn backoff(&self, provider: &str, key: &str) -> f64 {
        match &self.inspect {
            Inspect::Pg(client) => client
                .query_one(
                    "SELECT extract(epoch FROM next_attempt_at - updated_at)::float8
                     FROM webhook_events WHERE provider = $1 AND event_key = $2",
                    &[&provider, &key],
                )
                .await
                .expect("backoff")
                .get(0),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .query_row(
                    "SELECT next_attempt_at - updated_at FROM webhook_events
                     WHERE provider = ?1 AND event_key = ?2",
                    [provider, key],
                    |r| r.get(0),
                )
                .expect("backoff"),
        }
    }

    /// Writes `n` done rows of `provider` (keys `{prefix}{i}`), created and done `age` ago,
    /// straight into the table: a backlog for retention without delivering it.
    pub async fn insert_done_rows(&self, provider: &str, prefix: &str, n: u32, age: Duration) {
        match &self.inspect {
            Inspect::Pg(client) => {
                client
                    .execute(
                        "INSERT INTO webhook_events (provider, event_key, status, attempts,
                             last_path, result_status, created_at, updated_at)
                         SELECT $1, $2 || i, 'done', 1, 'first_run', 200,
                                now() - $4::float8 * interval '1 second',
                                now() - $4::float8 * interval '1 second'
                         FROM generate_series(1, $3::int) i",
                        &[&provider, &prefix, &(n as i32), &age.as_secs_f64()],
                    )
                    .await
                    .expect("insert done rows");
            }
            Inspect::Sqlite(file) => {
                Self::sqlite(file)
                    .execute(
                        "WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < ?3)
                         INSERT INTO webhook_events (provider, event_key, status, attempts,
                             last_path, result_status, created_at, updated_at)
                         SELECT ?1, ?2 || n, 'done', 1, 'first_run', 200,
                                unixepoch('subsec') - ?4, unixepoch('subsec') - ?4 FROM i",
                        rusqlite::params![provider, prefix, n, age.as_secs_f64()],
                    )
                    .expect("insert done rows");
            }
        }
    }

    /// Moves a row's creation `days` into the past, as if it had been accepted long ago.
    pub async fn age(&self, provider: &str, key: &str, days: u32) {
        let n = match &self.inspect {
            Inspect::Pg(client) => client
                .execute(
                    "UPDATE webhook_events SET created_at = now() - $3::int * interval '1 day'
                     WHERE provider = $1 AND event_key = $2",
                    &[&provider, &key, &(days as i32)],
                )
                .await
                .expect("age row"),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .execute(
                    "UPDATE webhook_events SET created_at = unixepoch('subsec') - ?3 * 86400
                     WHERE provider = ?1 AND event_key = ?2",
                    rusqlite::params![provider, key, days],
                )
                .expect("age row") as u64,
        };
        assert_eq!(n, 1, "no row {provider}:{key} to age");
    }

    /// Locks the whole events table in a transaction left open, so that every statement
    /// of the store waits until [`TableLock::release`]: Postgres's `ACCESS EXCLUSIVE`
    /// lock, SQLite's exclusive transaction.
    pub async fn lock_table(&self) -> TableLock {
        match &self.inspect {
            Inspect::Pg(_) => {
                let client = self.own_connection().await;
                client
                    .batch_execute("BEGIN; LOCK TABLE webhook_events IN ACCESS EXCLUSIVE MODE")
                    .await
                    .expect("lock the table");
                TableLock::Pg(client)
            }
            Inspect::Sqlite(file) => {
                let conn = Self::sqlite(file);
                conn.execute_batch("BEGIN EXCLUSIVE")
                    .expect("lock the database");
                TableLock::Sqlite(conn)
            }
        }
    }

    /// Locks one of the store's tables (`hookgate_paused`, ...) in a transaction left open,
    /// so that every statement on it waits until [`TableLock::release`] (Postgres only).
    pub async fn lock_pg_table(&self, table: &str) -> TableLock {
        self.hold_lock(table, "ACCESS EXCLUSIVE").await
    }

    /// Holds `table`'s lock in `mode` in a transaction left open until
    /// [`TableLock::release`] (Postgres): `SHARE UPDATE EXCLUSIVE` is what autovacuum and
    /// `ANALYZE` of the table hold while they run.
    pub async fn hold_lock(&self, table: &str, mode: &str) -> TableLock {
        let client = self.own_connection().await;
        client
            .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN {mode} MODE"))
            .await
            .expect("lock the table");
        TableLock::Pg(client)
    }

    /// Runs `work` while watching this schema's `tables` for a lock request that waits
    /// (Postgres): its output, and whether such a wait was seen before it ended.
    pub async fn lock_waits_during<T>(
        &self,
        tables: &[&str],
        work: impl std::future::Future<Output = T>,
    ) -> (T, bool) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("lock waiters are a Postgres test");
        };
        let tables: Vec<String> = tables
            .iter()
            .map(|t| format!("{}.{t}", self.schema))
            .collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        let run = async {
            let out = work.await;
            done.store(true, Ordering::SeqCst);
            out
        };
        let watch = async {
            while !done.load(Ordering::SeqCst) {
                let waits: bool = client
                    .query_one(
                        "SELECT EXISTS (
                             SELECT 1 FROM pg_locks
                             WHERE NOT granted
                               AND relation = ANY($1::text[]::regclass[]))",
                        &[&tables],
                    )
                    .await
                    .expect("pg_locks")
                    .get(0);
                if waits {
                    return true;
                }
            }
            false
        };
        futures_util::join!(run, watch)
    }

    /// `(connections, encrypted ones)` of this cluster whose `application_name` is `name`.
    pub async fn tls_connections(&self, name: &str) -> (i64, i64) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        let row = client
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE s.ssl)
                 FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.application_name = $1",
                &[&name],
            )
            .await
            .expect("pg_stat_ssl");
        (row.get(0), row.get(1))
    }

    /// Runs SQL on this schema through the test's own connection (Postgres).
    pub async fn execute(&self, sql: &str) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        client.batch_execute(sql).await.expect(sql);
    }

    /// Moves the Postgres ring's clock back by `by` (its slots' opening and sealing times,
    /// not the rows'): the next retention pass sees the current slot as `by` older, and
    /// turns the ring if that is a turn's time.
    pub async fn age_ring(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).expect("a step of sane size");
        self.execute(&format!(
            "UPDATE hookgate_slots SET
                 opened_at = opened_at - {ms} * interval '1 millisecond',
                 sealed_at = sealed_at - {ms} * interval '1 millisecond'"
        ))
        .await;
    }

    /// The ring's slots (Postgres) as `(slot, state)`, in slot order.
    pub async fn ring(&self) -> Vec<(i16, String)> {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("the ring is Postgres's");
        };
        client
            .query("SELECT slot, state FROM hookgate_slots ORDER BY slot", &[])
            .await
            .expect("hookgate_slots")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// The slot that takes new keys (Postgres).
    pub async fn current_slot(&self) -> i16 {
        let ring = self.ring().await;
        ring.iter()
            .find(|(_, state)| state == "current")
            .map(|(slot, _)| *slot)
            .unwrap_or_else(|| panic!("no current slot: {ring:?}"))
    }

    /// The slots holding a row of `provider:key` (Postgres): one, or none once removed.
    pub async fn slots_of(&self, provider: &str, key: &str) -> Vec<i16> {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("the ring is Postgres's");
        };
        client
            .query(
                "SELECT slot FROM webhook_events WHERE provider = $1 AND event_key = $2",
                &[&provider, &key],
            )
            .await
            .expect("slots of a key")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Keys with more than one row (Postgres): none, if every key lives in one slot.
    pub async fn keys_in_two_slots(&self) -> Vec<String> {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("the ring is Postgres's");
        };
        client
            .query(
                "SELECT provider || ':' || event_key FROM webhook_events
                 GROUP BY provider, event_key HAVING count(*) > 1",
                &[],
            )
            .await
            .expect("keys in two slots")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Turns autovacuum off for `tables` of this schema (Postgres), each partition of a
    /// partitioned one (the storage parameter belongs to the tables that hold rows), so a
    /// test's statistics stay what it made them.
    pub async fn autovacuum_off(&self, tables: &[&str]) {
        for table in tables {
            self.execute(&format!(
                "DO $$ DECLARE r regclass; BEGIN
                     FOR r IN SELECT relid FROM pg_partition_tree('{table}') WHERE isleaf LOOP
                         EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', r);
                     END LOOP;
                 END $$"
            ))
            .await;
        }
    }

    /// Rows of `webhook_events` (all its partitions) read by sequential scans plus entries
    /// read from their indexes so far (`pg_stat_user_tables`, `pg_stat_user_indexes`),
    /// and the server processes still connected as `application_name`.
    pub async fn rows_scanned(&self, application_name: &str) -> (i64, i64) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        let row = client
            .query_one(
                "SELECT (SELECT COALESCE(sum(COALESCE(t.seq_tup_read, 0)
                                + (SELECT COALESCE(sum(i.idx_tup_read), 0)::int8
                                   FROM pg_stat_user_indexes i WHERE i.relid = t.relid)), 0)::int8
                         FROM pg_stat_user_tables t
                         WHERE t.relid IN (SELECT relid FROM pg_partition_tree('webhook_events'))),
                        (SELECT count(*) FROM pg_stat_activity WHERE application_name = $1)",
                &[&application_name],
            )
            .await
            .expect("pg_stat_user_tables");
        (row.get(0), row.get(1))
    }

    /// Rows read by sequential scans plus entries read from indexes so far, summed over
    /// `tables` of this schema and their partitions (`pg_stat_user_tables`,
    /// `pg_stat_user_indexes`). A backend
    /// reports its counts when it goes idle (at most once a second) or ends.
    pub async fn reads(&self, tables: &[&str]) -> i64 {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        let tables: Vec<String> = tables.iter().map(|t| (*t).to_owned()).collect();
        client
            .query_one(
                "SELECT COALESCE(sum(COALESCE(t.seq_tup_read, 0)
                                     + (SELECT COALESCE(sum(i.idx_tup_read), 0)
                                        FROM pg_stat_user_indexes i WHERE i.relid = t.relid)),
                                 0)::int8
                 FROM pg_stat_user_tables t
                 WHERE t.relid IN (SELECT p.relid FROM unnest($1::text[]) n,
                                   pg_partition_tree(n::regclass) p)",
                &[&tables],
            )
            .await
            .expect("pg_stat_user_tables")
            .get(0)
    }

    /// Blocks of `webhook_events`'s TOAST tables (one a partition; where large payloads,
    /// answers and headers live) read so far, from disk or the buffer cache
    /// (`pg_statio_user_tables`).
    pub async fn toast_reads(&self) -> i64 {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        client
            .query_one(
                "SELECT COALESCE(sum(COALESCE(toast_blks_read, 0)
                                     + COALESCE(toast_blks_hit, 0)), 0)::int8
                 FROM pg_statio_user_tables
                 WHERE relid IN (SELECT relid FROM pg_partition_tree('webhook_events'))",
                &[],
            )
            .await
            .expect("pg_statio_user_tables")
            .get(0)
    }

    /// Reports the test's own connection's counts to the statistics now, so they are not
    /// reported later, into another read's count (PostgreSQL 15 or later).
    pub async fn flush_stats(&self) {
        self.execute("SELECT pg_stat_force_next_flush()").await;
    }

    /// The server processes connected as `application_name`.
    pub async fn backends(&self, application_name: &str) -> i64 {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&application_name],
            )
            .await
            .expect("pg_stat_activity")
            .get(0)
    }

    /// One row of `sql` (with `params`) on the test's own connection (Postgres).
    pub async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> tokio_postgres::Row {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        client.query_one(sql, params).await.expect(sql)
    }

    /// Writes `n` dead letters of provider `p` straight into the table, keys `k1`…`kN`,
    /// `k1` changed a millisecond ago, each next one a millisecond earlier.
    pub async fn fill_dead(&self, n: u32) {
        match &self.inspect {
            Inspect::Pg(client) => client
                .batch_execute(&format!(
                    "INSERT INTO webhook_events (provider, event_key, status, attempts,
                                                 last_path, dead_reason, created_at, updated_at)
                     SELECT 'p', 'k' || g, 'dead', 1, 'first_run', 'non_retryable',
                            now() - g * interval '1 millisecond',
                            now() - g * interval '1 millisecond'
                     FROM generate_series(1, {n}) g"
                ))
                .await
                .expect("fill"),
            Inspect::Sqlite(file) => {
                Self::sqlite(file)
                    .execute(
                        "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?1)
                         INSERT INTO webhook_events (provider, event_key, status, attempts,
                                                     last_path, dead_reason, created_at,
                                                     updated_at)
                         SELECT 'p', 'k' || i, 'dead', 1, 'first_run', 'non_retryable',
                                unixepoch('subsec') - i / 1000.0,
                                unixepoch('subsec') - i / 1000.0
                         FROM g",
                        [n],
                    )
                    .expect("fill");
            }
        }
    }

    /// Writes a failed event `provider:key` with `n` history rows, attempts 1…n, each a
    /// 429 throttled, straight into the tables (as a target answering 429 for days leaves
    /// it).
    pub async fn fill_history(&self, provider: &str, key: &str, n: u32) {
        match &self.inspect {
            Inspect::Pg(client) => client
                .batch_execute(&format!(
                    "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                                 mode)
                     VALUES ('{provider}', '{key}', 'failed', {n}, 'retry_after_failure',
                             'queue');
                     INSERT INTO webhook_attempts (provider, event_key, attempt, path, node, mode,
                                                   outcome, started_at, ended_at, target_status,
                                                   error)
                     SELECT '{provider}', '{key}', g, 'retry_after_failure', 'n1', 'queue',
                            'throttled', now() - (({n} - g) || ' s')::interval,
                            now() - (({n} - g) || ' s')::interval, 429, 'target answered 429'
                     FROM generate_series(1, {n}) g"
                ))
                .await
                .expect("fill history"),
            Inspect::Sqlite(file) => {
                Self::sqlite(file)
                    .execute_batch(&format!(
                        "INSERT INTO webhook_events (provider, event_key, status, attempts,
                                                     last_path, mode, created_at, updated_at)
                         VALUES ('{provider}', '{key}', 'failed', {n}, 'retry_after_failure',
                                 'queue', unixepoch('subsec'), unixepoch('subsec'));
                         WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g
                                                 WHERE i < {n})
                         INSERT INTO webhook_attempts (provider, event_key, attempt, path, node,
                                                       mode, outcome, started_at, ended_at,
                                                       target_status, error)
                         SELECT '{provider}', '{key}', i, 'retry_after_failure', 'n1', 'queue',
                                'throttled', unixepoch('subsec') - ({n} - i),
                                unixepoch('subsec') - ({n} - i), 429, 'target answered 429'
                         FROM g"
                    ))
                    .expect("fill history");
            }
        }
    }

    /// Runs `sql` (several statements) on this database: the test's own connection on
    /// Postgres (this schema), a connection of its own on SQLite.
    pub async fn apply_sql(&self, sql: &str) {
        match &self.inspect {
            Inspect::Pg(client) => client.batch_execute(sql).await.expect(sql),
            Inspect::Sqlite(file) => Self::sqlite(file).execute_batch(sql).expect(sql),
        }
    }

    /// The versions of every migration of this store, in order (the Postgres store's
    /// storage over time took four more than the embedded store's).
    pub fn all_migrations(&self) -> Vec<i64> {
        let last = match &self.inspect {
            Inspect::Pg(_) => 10,
            Inspect::Sqlite(_) => 6,
        };
        (1..=last).collect()
    }

    /// The migrations recorded as applied, in order.
    pub async fn migrations(&self) -> Vec<i64> {
        let sql = "SELECT version FROM hookgate_migrations ORDER BY version";
        match &self.inspect {
            Inspect::Pg(client) => client
                .query(sql, &[])
                .await
                .expect(sql)
                .iter()
                .map(|r| i64::from(r.get::<_, i32>(0)))
                .collect(),
            Inspect::Sqlite(file) => {
                let conn = Self::sqlite(file);
                let mut stmt = conn.prepare(sql).expect(sql);
                let rows = stmt.query_map([], |r| r.get(0)).expect(sql);
                rows.map(|r| r.expect(sql)).collect()
            }
        }
    }

    /// Rows by status.
    pub async fn count_status(&self, status: &str) -> i64 {
        match &self.inspect {
            Inspect::Pg(client) => client
                .query_one(
                    "SELECT count(*) FROM webhook_events WHERE status = $1",
                    &[&status],
                )
                .await
                .expect("count")
                .get(0),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .query_row(
                    "SELECT count(*) FROM webhook_events WHERE status = ?1",
                    [status],
                    |r| r.get(0),
                )
                .expect("count"),
        }
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

    /// Inserts `provider:key` in a transaction left open, so that a claim of that key
    /// blocks on the row until [`RowLock::release`] rolls it back (Postgres only).
    pub async fn hold_new_row(&self, provider: &str, key: &str) -> RowLock {
        let client = self.own_connection().await;
        client
            .batch_execute(&format!(
                "BEGIN; INSERT INTO webhook_events (provider, event_key, status, last_path)
                 VALUES ('{provider}', '{key}', 'in_progress', 'first_run')"
            ))
            .await
            .expect("hold a new row");
        RowLock { client }
    }

    /// Reads this schema's `table` (Postgres) in a transaction left open, as a long report
    /// does: it holds the table's `ACCESS SHARE` lock — which every write shares, and only
    /// DDL waits for — until [`TableLock::release`].
    pub async fn read_in_open_transaction(&self, table: &str) -> TableLock {
        let client = self.own_connection().await;
        client
            .batch_execute(&format!("BEGIN; SELECT count(*) FROM {table}"))
            .await
            .expect("read the table");
        TableLock::Pg(client)
    }

    /// Holds a snapshot open (Postgres: a repeatable-read transaction that has read), as a
    /// long report does: an index built concurrently waits for it, and nothing else does.
    pub async fn hold_snapshot(&self) -> TableLock {
        let client = self.own_connection().await;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
            .await
            .expect("hold a snapshot");
        TableLock::Pg(client)
    }

    /// Waits until `n` statements wait for this schema's events table, held by
    /// [`TestDb::lock_table`] (other tests' tables and row locks not counted).
    pub async fn wait_for_table_waiters(&self, n: i64) {
        self.wait_for_waiters_on("webhook_events", n).await;
    }

    /// Waits until `n` statements whose text contains `text` wait for this schema's events
    /// table (Postgres): only the statements a test races, not a node's own retention pass
    /// or size query that happens to wait on the same lock.
    pub async fn wait_for_table_waiters_running(&self, text: &str, n: i64) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("lock waiters are a Postgres test");
        };
        let table = format!("{}.webhook_events", self.schema);
        super::eventually(
            &format!("{n} statements with {text:?} to wait for {table}"),
            || async {
                client
                    .query_one(
                        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                     WHERE NOT l.granted AND l.relation = $1::text::regclass
                       AND strpos(a.query, $2) > 0",
                        &[&table, &text],
                    )
                    .await
                    .expect("pg_locks")
                    .get::<_, i64>(0)
                    >= n
            },
        )
        .await;
    }

    /// Waits until `n` statements wait for this schema's `table` (Postgres).
    pub async fn wait_for_waiters_on(&self, table: &str, n: i64) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("lock waiters are a Postgres test");
        };
        let table = format!("{}.{table}", self.schema);
        super::eventually(&format!("{n} statements to wait for {table}"), || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_locks
                     WHERE NOT granted AND relation = $1::text::regclass",
                    &[&table],
                )
                .await
                .expect("pg_locks")
                .get::<_, i64>(0)
                >= n
        })
        .await;
    }

    /// Waits until some session of this cluster waits on a lock (a claim blocked on a
    /// [`RowLock`]).
    pub async fn wait_for_lock_waiter(&self) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("lock waiters are a Postgres test");
        };
        super::eventually("a claim to wait on the held row", || async {
            client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get::<_, i64>(0)
                > 0
        })
        .await;
    }

    /// The kept request headers of a row, as JSON text.
    pub async fn request_headers(&self, provider: &str, key: &str) -> Option<String> {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        client
            .query_one(
                "SELECT request_headers FROM webhook_events WHERE provider = $1 AND event_key = $2",
                &[&provider, &key],
            )
            .await
            .expect("request_headers")
            .get(0)
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
