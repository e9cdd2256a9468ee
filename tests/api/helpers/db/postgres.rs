//! What only the Postgres store has: SQL on the test's own connection, the slot ring's
//! state, the statistics views (rows and blocks read, backends), TLS connections.

use std::time::Duration;

use super::{Inspect, TestDb};

impl TestDb {
    /// Runs SQL on this schema through the test's own connection (Postgres).
    pub async fn execute(&self, sql: &str) {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        client.batch_execute(sql).await.expect(sql);
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

    /// The rows of `sql` (no parameters) on the test's own connection (Postgres), or the
    /// error the server answered.
    pub async fn try_query(
        &self,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let Inspect::Pg(client) = &self.inspect else {
            panic!("a Postgres test");
        };
        client.query(sql, &[]).await
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
}
