//! The soak run's own view of the store, on a connection of its own beside the node's: it
//! prefills the events table before the node starts, and each window counts rows, rows
//! past retention and the store's bytes on disk. It knows what its own reads cost, so the
//! node's CPU per event is not charged with them. It writes nothing but the prefill, and
//! names only the columns every schema version has and that have no default.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hookgate_kit::proc_cpu;

/// The simulated past the prefill's rows are spread over: a week, so with any retention
/// under a week most of them are already past it.
pub const PREFILL_SPAN: Duration = Duration::from_secs(7 * 24 * 3600);

/// The provider of the prefill's rows (the node's), and their keys' prefix.
const PROVIDER: &str = "bench";
pub const PREFILL_PREFIX: &str = "prefill-";

/// A direct connection to the run's store.
pub enum Db {
    Postgres {
        client: tokio_postgres::Client,
        schema: String,
        /// This connection's backend, whose CPU is the bench's, not the node's.
        backend: u32,
        /// The cluster's postmaster, when it runs on this machine.
        postmaster: Option<u32>,
    },
    Sqlite {
        conn: Arc<Mutex<rusqlite::Connection>>,
        file: String,
        /// Ticks this process spent in the bench's own reads.
        ticks: Arc<AtomicU64>,
    },
}

/// What the prefill wrote: row `prefill-i` was done `i × step` seconds before `t0` (the
/// store's clock, Unix seconds).
#[derive(Debug, Clone, Copy, Default)]
pub struct Prefill {
    pub rows: u64,
    pub t0: f64,
    pub step: f64,
}

/// One window's counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub rows: u64,
    pub attempts: u64,
    /// Done rows changed longer ago than the retention.
    pub past_retention: u64,
    /// The store's bytes on disk: every table of the schema with its indexes and TOAST
    /// (Postgres), the database file and its WAL (SQLite).
    pub disk: u64,
}

/// The prefill's rows at the end of the run.
#[derive(Debug, Clone, Copy)]
pub struct PrefillLeft {
    /// Rows already past retention when the run started, still there.
    pub expired: u64,
    /// Rows within retention now.
    pub young: u64,
    /// How many rows the prefill wrote that are within retention now.
    pub young_expected: u64,
}

/// Plain reads, no locks: each statement sees the rows committed when it starts.
const PG_COUNTS: &str = "
SELECT (SELECT count(*) FROM webhook_events),
       (SELECT count(*) FROM webhook_attempts),
       (SELECT count(*) FROM webhook_events
        WHERE status = 'done' AND updated_at < now() - $1::float8 * interval '1 second'),
       (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind = 'r')";
const SQLITE_COUNTS: &str = "
SELECT (SELECT count(*) FROM webhook_events),
       (SELECT count(*) FROM webhook_attempts),
       (SELECT count(*) FROM webhook_events
        WHERE status = 'done' AND updated_at < unixepoch('subsec') - ?1)";

/// The prefill's rows: `$2`/`?2` is t0 − retention, `$3`/`?3` the retention in seconds,
/// `$4`/`?4` the keys' prefix. A plain read of the provider's rows, no lock.
const PG_LEFT: &str = "
SELECT extract(epoch FROM now())::float8,
       count(*) FILTER (WHERE updated_at < to_timestamp($2::float8)),
       count(*) FILTER (WHERE updated_at >= now() - $3::float8 * interval '1 second')
FROM webhook_events WHERE provider = $1 AND starts_with(event_key, $4)";
const SQLITE_LEFT: &str = "
SELECT unixepoch('subsec'),
       coalesce(sum(updated_at < ?2), 0),
       coalesce(sum(updated_at >= unixepoch('subsec') - ?3), 0)
FROM webhook_events WHERE provider = ?1 AND substr(event_key, 1, length(?4)) = ?4";

impl Db {
    /// Connects to the Postgres schema the node uses (after its migration).
    pub async fn postgres(url: &str, schema: &str) -> Self {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to Postgres directly");
        actix_rt::spawn(connection);
        // No parallel workers: the counts run in this backend alone, so their CPU is
        // taken out of the cluster's whole.
        client
            .batch_execute(&format!(
                "SET search_path TO {schema}; SET max_parallel_workers_per_gather = 0"
            ))
            .await
            .expect("the run's schema");
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pg_backend_pid")
            .get(0);
        let backend = backend as u32;
        let postmaster = proc_cpu::stat(backend).map(|s| s.ppid);
        Self::Postgres {
            client,
            schema: schema.to_owned(),
            backend,
            postmaster,
        }
    }

    /// Opens the SQLite file the node uses (after its migration).
    pub fn sqlite(file: &str) -> Self {
        let conn = rusqlite::Connection::open(file).expect("open the SQLite file");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy_timeout");
        Self::Sqlite {
            conn: Arc::new(Mutex::new(conn)),
            file: file.to_owned(),
            ticks: Arc::default(),
        }
    }

    /// Writes `rows` done rows of mode `mode` with keys `prefill-0..rows` (each answered
    /// 200 with an empty body, as a target's plain acknowledgement), spread evenly
    /// over [`PREFILL_SPAN`] back from now — in one statement (Postgres) or one
    /// transaction (SQLite) — then prepares the table as one that has stood a while
    /// (Postgres: VACUUM ANALYZE, as autovacuum would, and a checkpoint; SQLite: the WAL
    /// emptied).
    /// Only new keys, before the node starts: no other session waits on it.
    ///
    /// On Postgres's ring of slots the rows go where a ring that took that week with
    /// `retention` would hold them. When the week fits in the five slots a ring keeps (a
    /// retention of at least four fifths of it), each slot holds a quarter of `retention`
    /// — slots 1 to 4 sealed, the newest in slot 5, current — and nothing is due yet: the
    /// claims probe five populated slots, as on a ring in its steady state. Otherwise (a
    /// retention of minutes, whose ring would have emptied most of the week) every row
    /// goes into the current slot, dated back to the oldest row, so the first pass seals
    /// and empties it.
    pub async fn prefill(&self, rows: u64, mode: &str, retention: Duration) -> Prefill {
        let step = PREFILL_SPAN.as_secs_f64() / rows.max(1) as f64;
        let n = i64::try_from(rows).expect("prefill rows");
        match self {
            Self::Postgres { client, .. } => {
                let row = client
                    .query_one(
                        "SELECT extract(epoch FROM now())::float8,
                                to_regclass('hookgate_slots') IS NOT NULL",
                        &[],
                    )
                    .await
                    .expect("the store's clock");
                let (t0, ring): (f64, bool) = (row.get(0), row.get(1));
                let quarter = retention.as_secs_f64() / 4.0;
                let spread = ring && PREFILL_SPAN.as_secs_f64() <= 5.0 * quarter;
                // Row i was changed (n - 1 - i) × step after the oldest.
                let (slot_column, slot_value) = match spread {
                    true => (
                        "slot, ",
                        format!("(1 + LEAST(4, floor(($4::bigint - 1 - i) * $6::float8 / {quarter})))::smallint, "),
                    ),
                    false => ("", String::new()),
                };
                client
                    .execute(
                        &format!(
                            "INSERT INTO webhook_events (provider, event_key, {slot_column}status,
                                 attempts, last_path, mode, result_status, result_body,
                                 created_at, updated_at)
                             SELECT $1::text, $2::text || i, {slot_value}'done', 1, 'first_run',
                                    $3::text, 200, '\\x'::bytea,
                                    to_timestamp($5::float8 - i * $6::float8 - 0.05),
                                    to_timestamp($5::float8 - i * $6::float8)
                             FROM generate_series(0, $4::bigint - 1) AS i"
                        ),
                        &[&PROVIDER, &PREFILL_PREFIX, &mode, &n, &t0, &step],
                    )
                    .await
                    .expect("prefill the events table");
                let oldest = t0 - (n - 1).max(0) as f64 * step;
                let date_the_ring = match (ring, spread) {
                    (false, _) => String::new(),
                    (true, false) => format!(
                        "UPDATE hookgate_slots SET opened_at = to_timestamp({oldest})
                         WHERE state = 'current';"
                    ),
                    (true, true) => format!(
                        "UPDATE hookgate_slots SET state = 'sealed',
                             opened_at = to_timestamp({oldest} + (slot - 1) * {quarter}),
                             sealed_at = to_timestamp({oldest} + slot * {quarter})
                         WHERE slot BETWEEN 1 AND 4;
                         UPDATE hookgate_slots SET state = 'current', sealed_at = NULL,
                             opened_at = to_timestamp({oldest} + 4 * {quarter})
                         WHERE slot = 5;"
                    ),
                };
                client
                    .batch_execute(&date_the_ring)
                    .await
                    .expect("date the ring's slots");
                // Vacuumed too, not only analyzed: autovacuum would have vacuumed a week of
                // inserts long ago; left to it, the run would pay for reading and marking
                // every prefilled page while it is measured.
                client
                    .batch_execute("VACUUM ANALYZE webhook_events")
                    .await
                    .expect("vacuum and analyze");
                // Needs a superuser (the throwaway clusters'); without it the run pays
                // for the prefill's checkpoint.
                let _ = client.batch_execute("CHECKPOINT").await;
                Prefill { rows, t0, step }
            }
            Self::Sqlite { conn, .. } => {
                let conn = Arc::clone(conn);
                let mode = mode.to_owned();
                let t0 = actix_rt::task::spawn_blocking(move || {
                    let mut conn = conn.lock().expect("the bench's connection");
                    let tx = conn.transaction().expect("begin");
                    let t0: f64 = tx
                        .query_row("SELECT unixepoch('subsec')", [], |r| r.get(0))
                        .expect("the store's clock");
                    tx.execute(
                        "WITH RECURSIVE seq(i) AS (
                             SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < ?4)
                         INSERT INTO webhook_events (provider, event_key, status, attempts,
                             last_path, mode, result_status, result_body, created_at,
                             updated_at)
                         SELECT ?1, ?2 || i, 'done', 1, 'first_run', ?3, 200, x'',
                                ?5 - i * ?6 - 0.05, ?5 - i * ?6
                         FROM seq WHERE i < ?4",
                        rusqlite::params![PROVIDER, PREFILL_PREFIX, mode, n, t0, step],
                    )
                    .expect("prefill the events table");
                    tx.commit().expect("commit the prefill");
                    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                        .expect("checkpoint the prefill");
                    t0
                })
                .await
                .expect("the prefill's thread");
                Prefill { rows, t0, step }
            }
        }
    }

    /// Rows, history rows, done rows past `retention`, bytes on disk.
    pub async fn counts(&self, retention: Duration) -> Counts {
        let retention = retention.as_secs_f64();
        match self {
            Self::Postgres { client, .. } => {
                let row = client
                    .query_one(PG_COUNTS, &[&retention])
                    .await
                    .expect("count the rows");
                let n = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
                Counts {
                    rows: n(0),
                    attempts: n(1),
                    past_retention: n(2),
                    disk: n(3),
                }
            }
            Self::Sqlite { conn, file, ticks } => {
                let (conn, ticks) = (Arc::clone(conn), Arc::clone(ticks));
                let (rows, attempts, past_retention) = actix_rt::task::spawn_blocking(move || {
                    let before = proc_cpu::this_thread_ticks();
                    let counts = conn
                        .lock()
                        .expect("the bench's connection")
                        .query_row(SQLITE_COUNTS, [retention], |r| {
                            let n = |i: usize| r.get::<_, i64>(i).map(|n| n.max(0) as u64);
                            Ok((n(0)?, n(1)?, n(2)?))
                        })
                        .expect("count the rows");
                    ticks.fetch_add(proc_cpu::this_thread_ticks() - before, Ordering::Relaxed);
                    counts
                })
                .await
                .expect("the counting thread");
                let size = |suffix: &str| {
                    std::fs::metadata(format!("{file}{suffix}")).map_or(0, |m| m.len())
                };
                Counts {
                    rows,
                    attempts,
                    past_retention,
                    disk: size("") + size("-wal"),
                }
            }
        }
    }

    /// The prefill's rows now: those already past `retention` when the run started
    /// (`prefill.t0`) and those within it now, against how many the prefill wrote that are.
    pub async fn prefill_left(&self, prefill: &Prefill, retention: Duration) -> PrefillLeft {
        let retention = retention.as_secs_f64();
        let expired_before = prefill.t0 - retention;
        let (now, expired, young): (f64, i64, i64) = match self {
            Self::Postgres { client, .. } => {
                let row = client
                    .query_one(
                        PG_LEFT,
                        &[&PROVIDER, &expired_before, &retention, &PREFILL_PREFIX],
                    )
                    .await
                    .expect("count the prefill's rows");
                (row.get(0), row.get(1), row.get(2))
            }
            Self::Sqlite { conn, .. } => {
                let conn = Arc::clone(conn);
                actix_rt::task::spawn_blocking(move || {
                    conn.lock()
                        .expect("the bench's connection")
                        .query_row(
                            SQLITE_LEFT,
                            rusqlite::params![PROVIDER, expired_before, retention, PREFILL_PREFIX],
                            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                        )
                        .expect("count the prefill's rows")
                })
                .await
                .expect("the counting thread")
            }
        };
        // Row i is within retention now when t0 − i × step >= now − retention.
        let margin = retention - (now - prefill.t0);
        let young_expected = if prefill.rows == 0 || margin < 0.0 {
            0
        } else {
            ((margin / prefill.step).floor() as u64 + 1).min(prefill.rows)
        };
        PrefillLeft {
            expired: u64::try_from(expired).unwrap_or(0),
            young: u64::try_from(young).unwrap_or(0),
            young_expected,
        }
    }

    /// CPU ticks the bench's own reads took inside this process (SQLite's).
    pub fn own_process_ticks(&self) -> u64 {
        match self {
            Self::Sqlite { ticks, .. } => ticks.load(Ordering::Relaxed),
            Self::Postgres { .. } => 0,
        }
    }

    /// The Postgres cluster's CPU ticks without the bench's own backend; `None` for SQLite
    /// or a cluster on another machine.
    pub fn cluster_ticks(&self) -> Option<u64> {
        match self {
            Self::Postgres {
                backend,
                postmaster: Some(postmaster),
                ..
            } => {
                let own = proc_cpu::stat(*backend).map_or(0, |s| s.utime + s.stime);
                Some(proc_cpu::cluster_ticks(*postmaster).saturating_sub(own))
            }
            _ => None,
        }
    }

    /// Drops the run's schema (Postgres); the caller removes a SQLite file.
    pub async fn drop_schema(&self) {
        if let Self::Postgres { client, schema, .. } = self {
            let _ = client
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .await;
        }
    }
}
