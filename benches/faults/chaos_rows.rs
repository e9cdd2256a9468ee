//! The queue-mode chaos run's view of the truth: its schema's `webhook_events` rows, read
//! on a direct connection to Postgres (never through the proxy the faults go through).
//! Reads only, except for dropping the schema at the end.

use std::collections::{BTreeMap, HashMap, HashSet};

/// A plain connection to the run's database.
pub struct Rows {
    client: tokio_postgres::Client,
    schema: String,
}

/// What the table says at one moment.
#[derive(Debug, Default)]
pub struct Census {
    /// Rows by `status`, or `dead:<dead_reason>` for dead ones.
    pub by_status: BTreeMap<String, usize>,
    /// Keys (without the provider) with their status.
    pub status_of: HashMap<String, String>,
}

impl Census {
    /// Accepted keys whose row is neither done nor dead (or missing: lost).
    pub fn stranded<'a>(&self, accepted: &'a HashSet<String>) -> Vec<&'a String> {
        let mut keys: Vec<&String> = accepted
            .iter()
            .filter(|k| {
                !matches!(
                    self.status_of.get(*k).map(String::as_str),
                    Some("done" | "dead")
                )
            })
            .collect();
        keys.sort();
        keys
    }

    pub fn count(&self, status: &str) -> usize {
        self.by_status
            .iter()
            .filter(|(s, _)| s.as_str() == status || s.starts_with(&format!("{status}:")))
            .map(|(_, n)| n)
            .sum()
    }
}

impl Rows {
    pub async fn connect(url: &str, schema: &str) -> Self {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to Postgres directly");
        actix_rt::spawn(connection);
        Self {
            client,
            schema: schema.to_owned(),
        }
    }

    /// Every row's key, status and dead reason: a plain read, no lock; sees the last
    /// committed state.
    pub async fn census(&self) -> Census {
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT event_key, status, dead_reason FROM {}.webhook_events",
                    self.schema
                ),
                &[],
            )
            .await
            .expect("read the rows");
        let mut census = Census::default();
        for row in rows {
            let (key, status, reason): (String, String, Option<String>) =
                (row.get(0), row.get(1), row.get(2));
            let label = match (&*status, reason) {
                ("dead", Some(reason)) => format!("dead:{reason}"),
                _ => status.clone(),
            };
            *census.by_status.entry(label).or_default() += 1;
            census.status_of.insert(key, status);
        }
        census
    }

    /// Up to `limit` dead keys, most recently dead first (the table, as an operator's
    /// `psql` would read it): a plain read, no lock.
    pub async fn dead_keys(&self, limit: i64) -> Vec<String> {
        self.client
            .query(
                &format!(
                    "SELECT event_key FROM {}.webhook_events WHERE status = 'dead' \
                     ORDER BY updated_at DESC LIMIT $1",
                    self.schema
                ),
                &[&limit],
            )
            .await
            .map(|rows| rows.iter().map(|r| r.get(0)).collect())
            .unwrap_or_default()
    }

    /// Drops the run's schema and everything in it.
    pub async fn drop_schema(&self) {
        let _ = self
            .client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await;
    }
}
