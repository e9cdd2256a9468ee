//! The Postgres migrations and their runner: each migration once, in order, one node at a
//! time. A migration is either one transaction of DDL, whose table locks are given up
//! after a short lock timeout and the whole migration tried again later, or an *online*
//! step that must not hold a table's writes while it reads the table (an index built
//! concurrently), run outside a transaction. A migration that converts a large table is
//! split so that every step that reads the whole table runs while writes go on, and the
//! step that holds the table's writes only renames and attaches. `hookgate migrate
//! --online` stops before the first step that nodes of the previous release cannot run
//! beside.

use std::time::Duration;

use deadpool_postgres::Object;

use super::pool::Inner;
use super::rows::{db_error, is_lock_timeout};
use crate::store::{millis, MigrationWait, StoreError};

/// One migration.
enum Migration {
    /// DDL applied in one transaction with its bookkeeping row.
    InTransaction(&'static str),
    /// A unique index built with `CREATE UNIQUE INDEX CONCURRENTLY` (no transaction; the
    /// table's writes go on while it is built): `(table, index, columns)`.
    UniqueIndexOnline(&'static [(&'static str, &'static str, &'static str)]),
}

/// The migrations, applied in this order (not their versions'), each once. 11 and 12 came
/// after 10 but run before it: they repair what an earlier build's 0007 left beside nodes
/// of the previous release, which only the online steps run beside (on a database whose 10
/// that earlier build applied, they repair its slot 0).
const MIGRATIONS: &[(i32, Migration)] = &[
    (
        1,
        Migration::InTransaction(include_str!("migrations/0001_webhook_events.sql")),
    ),
    (
        2,
        Migration::InTransaction(include_str!("migrations/0002_request_headers.sql")),
    ),
    (
        3,
        Migration::InTransaction(include_str!("migrations/0003_queue.sql")),
    ),
    (
        4,
        Migration::InTransaction(include_str!("migrations/0004_throttles.sql")),
    ),
    (
        5,
        Migration::InTransaction(include_str!("migrations/0005_history.sql")),
    ),
    (
        6,
        Migration::InTransaction(include_str!("migrations/0006_replay_items_at.sql")),
    ),
    (
        7,
        Migration::InTransaction(include_str!("migrations/0007_slot_columns.sql")),
    ),
    (
        8,
        Migration::InTransaction(include_str!("migrations/0008_slot_checks.sql")),
    ),
    (
        9,
        Migration::UniqueIndexOnline(&[
            (
                "webhook_events",
                "webhook_events_key_slot",
                "provider, event_key, slot",
            ),
            (
                "webhook_attempts",
                "webhook_attempts_key_slot",
                "provider, event_key, slot, attempt",
            ),
        ]),
    ),
    (
        11,
        Migration::InTransaction(include_str!("migrations/0011_history_cascade.sql")),
    ),
    (
        12,
        Migration::InTransaction(include_str!("migrations/0012_history_left_behind.sql")),
    ),
    (
        10,
        Migration::InTransaction(include_str!("migrations/0010_slot_ring.sql")),
    ),
    (
        13,
        Migration::InTransaction(include_str!("migrations/0013_keep_slot.sql")),
    ),
];

/// The migrations that nodes of the previous release cannot run beside, which `hookgate
/// migrate --online` stops before. The others only add (a column with a constant default,
/// a check, unique indexes built concurrently) or repair, and the tables keep every index,
/// key and cascade those nodes' statements rely on; 10 makes the tables partitioned, which
/// only this version's statements use, and drops the history's foreign key, whose cascade
/// their sweep relies on.
const OFFLINE_MIGRATIONS: &[i32] = &[10];

/// Records a migration as applied.
const RECORD: &str = "INSERT INTO hookgate_migrations (version) VALUES ($1)";

/// The advisory lock every migrator takes: one node migrates at a time.
const MIGRATOR_LOCK: i64 = 8_347_284;

/// How often a migrator waiting for another node's migration asks for the lock again.
const MIGRATOR_POLL: Duration = Duration::from_millis(50);

/// How long a migration's statement waits for a table's lock before the migration gives up
/// for now: every claim that comes after a DDL lock request queues behind it, so a
/// migration stuck behind a long reader would hold every claim as long (15 s was seen).
/// Two seconds is well inside the store deadline (5 s by default), and long enough for the
/// short transactions of the claim path to finish and let the lock go.
const MIGRATION_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// Tries of a migration whose lock timed out before it gives up: with the pauses below,
/// about two minutes of a long transaction waited out.
const MIGRATION_TRIES: u32 = 10;

/// The pause after a migration's first lock timeout, doubled after each: claims run freely
/// in between, and a short transaction is likely gone by the next try.
const MIGRATION_FIRST_PAUSE: Duration = Duration::from_millis(500);

/// The longest pause between a migration's tries: a long transaction is given time to
/// end, and the migration still notices within seconds that it has.
const MIGRATION_MAX_PAUSE: Duration = Duration::from_secs(15);

impl Inner {
    /// Applies the migrations not applied yet, in order, one node at a time. A statement of
    /// a migration that waits longer than [`MIGRATION_LOCK_TIMEOUT`] for a table's lock
    /// rolls that migration back (nothing of it applied, nothing recorded; the migrations
    /// before it stay applied): it is tried again after a pause, at most
    /// [`MIGRATION_TRIES`] times, each wait reported to `on_wait`. With `online_only`, the
    /// first migration not applied yet that is one of [`OFFLINE_MIGRATIONS`], and those
    /// after it, are left for a later run.
    pub(crate) async fn migrate(
        &self,
        on_wait: &(dyn Fn(&MigrationWait) + Send + Sync),
        online_only: bool,
    ) -> Result<(), StoreError> {
        let mut pause = MIGRATION_FIRST_PAUSE;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let error = match self.migrate_once(online_only).await {
                Err(e) if is_lock_timeout(&e) => e,
                done => return done,
            };
            if attempt >= MIGRATION_TRIES {
                return Err(StoreError::Transient(
                    format!(
                        "the migration could not lock a table within {} ms in {attempt} \
                         tries: a long transaction holds it (see pg_stat_activity); the \
                         migration was not applied ({error})",
                        millis(MIGRATION_LOCK_TIMEOUT)
                    )
                    .into(),
                ));
            }
            // Jittered, so nodes started together do not ask for the lock together.
            let retry_in = pause.mul_f64(0.75 + fastrand::f64() / 2.0);
            on_wait(&MigrationWait {
                attempt,
                retry_in,
                error: error.to_string(),
            });
            tokio::time::sleep(retry_in).await;
            pause = (pause * 2).min(MIGRATION_MAX_PAUSE);
        }
    }

    /// One try of [`migrate`](Self::migrate): every migration not applied yet, each in its
    /// own transaction (or, online, in none), so that a step that reads a large table holds
    /// no lock another took before it.
    async fn migrate_once(&self, online_only: bool) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        client
            .batch_execute("SET statement_timeout = 0")
            .await
            .map_err(db_error)?;
        // Waiting for the lock with a statement would hold a snapshot while waiting, and an
        // index built concurrently by the node that holds it waits for every snapshot: the
        // two would wait on each other. Asked again every little while instead.
        loop {
            let row = client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&MIGRATOR_LOCK])
                .await
                .map_err(db_error)?;
            if row.get::<_, bool>(0) {
                break;
            }
            tokio::time::sleep(MIGRATOR_POLL).await;
        }
        client
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {0};
                 CREATE TABLE IF NOT EXISTS {0}.hookgate_migrations (
                     version integer PRIMARY KEY,
                     applied_at timestamptz NOT NULL DEFAULT now());",
                self.schema
            ))
            .await
            .map_err(db_error)?;
        let applied = self.apply_pending(&mut client, online_only).await;
        // The session's lock goes with the connection if this fails; it is given back here
        // so the pooled connection carries nothing into its next use.
        let unlocked = client
            .batch_execute(&format!(
                "SELECT pg_advisory_unlock({MIGRATOR_LOCK}); RESET statement_timeout;"
            ))
            .await
            .map_err(db_error);
        applied.and(unlocked)
    }

    /// The migrations not applied yet, in order, with the migrator's lock held; with
    /// `online_only`, none from the first offline one not applied yet on.
    async fn apply_pending(
        &self,
        client: &mut Object,
        online_only: bool,
    ) -> Result<(), StoreError> {
        for (version, migration) in MIGRATIONS {
            let applied = client
                .query_opt(
                    "SELECT 1 FROM hookgate_migrations WHERE version = $1",
                    &[version],
                )
                .await
                .map_err(db_error)?;
            if applied.is_some() {
                continue;
            }
            if online_only && OFFLINE_MIGRATIONS.contains(version) {
                break;
            }
            match migration {
                Migration::InTransaction(sql) => {
                    let tx = client.transaction().await.map_err(db_error)?;
                    // Every lock this transaction asks for is given up after the timeout.
                    tx.batch_execute(&format!(
                        "SET LOCAL lock_timeout = {}",
                        millis(MIGRATION_LOCK_TIMEOUT)
                    ))
                    .await
                    .map_err(db_error)?;
                    tx.batch_execute(sql).await.map_err(db_error)?;
                    tx.execute(RECORD, &[version]).await.map_err(db_error)?;
                    tx.commit().await.map_err(db_error)?;
                }
                Migration::UniqueIndexOnline(indexes) => {
                    for (table, index, columns) in *indexes {
                        unique_index(client, table, index, columns).await?;
                    }
                    client.execute(RECORD, &[version]).await.map_err(db_error)?;
                }
            }
        }
        Ok(())
    }
}

/// Builds the unique index `index` on `table` (`columns`) while the table's writes go on. A
/// build that an earlier try left unfinished (an invalid index) is dropped first; a valid
/// one is kept. An empty table (a new database) gets it in a plain transaction: a
/// concurrent build waits for every transaction of the database that holds a snapshot,
/// which on an empty table buys nothing.
async fn unique_index(
    client: &mut Object,
    table: &str,
    index: &str,
    columns: &str,
) -> Result<(), StoreError> {
    let valid: Option<bool> = client
        .query_opt(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relname = $1 AND n.nspname = current_schema()",
            &[&index],
        )
        .await
        .map_err(db_error)?
        .map(|row| row.get(0));
    match valid {
        Some(true) => return Ok(()),
        Some(false) => client
            .batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"))
            .await
            .map_err(db_error)?,
        None => {}
    }
    let tx = client.transaction().await.map_err(db_error)?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}",
        millis(MIGRATION_LOCK_TIMEOUT)
    ))
    .await
    .map_err(db_error)?;
    let empty: bool = tx
        .query_one(&format!("SELECT NOT EXISTS (SELECT 1 FROM {table})"), &[])
        .await
        .map_err(db_error)?
        .get(0);
    if empty {
        // SHARE lock for the build: nothing is written meanwhile, and nothing is there.
        tx.batch_execute(&format!(
            "CREATE UNIQUE INDEX {index} ON {table} ({columns})"
        ))
        .await
        .map_err(db_error)?;
        return tx.commit().await.map_err(db_error);
    }
    tx.rollback().await.map_err(db_error)?;
    client
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX CONCURRENTLY {index} ON {table} ({columns})"
        ))
        .await
        .map_err(db_error)
}
