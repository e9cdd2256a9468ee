//! Rows read and written behind the store's back, on either backend: leases expired,
//! clocks moved, rows made due or aged, backlogs and histories written straight into the
//! tables, statuses, counts and applied migrations read.

use std::time::Duration;

use super::{Inspect, TestDb};

impl TestDb {
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
    /// storage over time took four more than the embedded store's, and the repair of what
    /// an earlier build of it left, two more).
    pub fn all_migrations(&self) -> Vec<i64> {
        let last = match &self.inspect {
            Inspect::Pg(_) => 13,
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

    /// How the row of `key` ended, read raw (no body opened): its attempts, dead reason
    /// and last error.
    pub async fn ending(&self, provider: &str, key: &str) -> Ending {
        const SQL_PG: &str = "SELECT attempts, dead_reason, last_error FROM webhook_events \
                              WHERE provider = $1 AND event_key = $2";
        const SQL_LITE: &str = "SELECT attempts, dead_reason, last_error FROM webhook_events \
                                WHERE provider = ?1 AND event_key = ?2";
        match &self.inspect {
            Inspect::Pg(client) => {
                let row = client
                    .query_one(SQL_PG, &[&provider, &key])
                    .await
                    .expect("the row");
                Ending {
                    attempts: row.get(0),
                    dead_reason: row.get(1),
                    last_error: row.get(2),
                }
            }
            Inspect::Sqlite(file) => Self::sqlite(file)
                .query_row(SQL_LITE, [provider, key], |r| {
                    Ok(Ending {
                        attempts: r.get(0)?,
                        dead_reason: r.get(1)?,
                        last_error: r.get(2)?,
                    })
                })
                .expect("the row"),
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

/// How a row ended, as [`TestDb::ending`] reads it.
#[derive(Debug)]
pub struct Ending {
    pub attempts: i32,
    pub dead_reason: Option<String>,
    pub last_error: Option<String>,
}
