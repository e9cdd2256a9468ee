//! Locks a test holds open so that the store's statements wait on them — a table, a new
//! row, a long reader's snapshot — and waits for statements to be waiting on them.

use std::sync::atomic::Ordering;

use super::{Inspect, RowLock, TableLock, TestDb};

impl TestDb {
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

    /// Whether `table`'s lock in `mode` can be had at once (`NOWAIT`), as the ring's
    /// emptying asks for a due slot's partitions; let go at once (Postgres).
    pub async fn lock_now(&self, table: &str, mode: &str) -> bool {
        let client = self.own_connection().await;
        let got = client
            .batch_execute(&format!("BEGIN; LOCK TABLE {table} IN {mode} MODE NOWAIT"))
            .await
            .is_ok();
        client.batch_execute("ROLLBACK").await.expect("rollback");
        got
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
        crate::helpers::eventually(
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
        crate::helpers::eventually(&format!("{n} statements to wait for {table}"), || async {
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
        crate::helpers::eventually("a claim to wait on the held row", || async {
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
}
