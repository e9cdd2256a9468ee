//! Encryption at rest as tests see it: keyrings of fixed test keys, stores that seal with
//! them, and the raw stored bodies — read, and moved between rows — behind the store's back.

use std::sync::Arc;

use hookgate::config::{KeyConfig, StoreConfig};
use hookgate::seal::{Keyring, KEY_BYTES};
use hookgate::store::Store;
use sha2::{Digest, Sha256};

use super::{Inspect, TestDb};

/// The test key named `id`: its bytes are the SHA-256 of the id.
pub fn test_key(id: &str) -> [u8; KEY_BYTES] {
    Sha256::digest(id.as_bytes()).into()
}

/// The test key `id` as its variable holds it (base64).
pub fn key_text(id: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(test_key(id))
}

/// `c`'s store sealing with the test keys `ids` (the first seals, each named by a variable
/// `HOOKGATE_TEST_KEY_<id>` and read already), refusing plaintext bodies if `strict`.
pub fn seal_config(c: &mut hookgate::config::Config, ids: &[&str], strict: bool) {
    c.store.encryption.keys = ids
        .iter()
        .map(|id| KeyConfig {
            id: (*id).into(),
            env: format!("HOOKGATE_TEST_KEY_{id}"),
        })
        .collect();
    c.store.encryption.require_sealed = strict;
    let keys: Vec<(String, [u8; KEY_BYTES])> = ids
        .iter()
        .map(|id| ((*id).to_owned(), test_key(id)))
        .collect();
    let keyring = Keyring::new(&keys).expect("a test keyring");
    c.store.encryption.keyring = Some(Arc::new(keyring.require_sealed(strict)));
}

/// A keyring of the test keys `ids`, the first sealing.
pub fn keyring(ids: &[&str]) -> Arc<Keyring> {
    let keys: Vec<(String, [u8; KEY_BYTES])> = ids
        .iter()
        .map(|id| ((*id).to_owned(), test_key(id)))
        .collect();
    Arc::new(Keyring::new(&keys).expect("a test keyring"))
}

impl TestDb {
    /// This database's store settings, sealing with the test keys `ids`.
    pub fn sealed_config(&self, ids: &[&str]) -> StoreConfig {
        let mut config = self.store_config();
        config.encryption.keys = ids
            .iter()
            .map(|id| KeyConfig {
                id: (*id).into(),
                env: format!("HOOKGATE_TEST_KEY_{id}"),
            })
            .collect();
        config.encryption.keyring = Some(keyring(ids));
        config
    }

    /// A migrated store on this database sealing with the test keys `ids`.
    pub async fn sealed_store(&self, ids: &[&str]) -> Arc<dyn Store> {
        self.store_with(self.sealed_config(ids)).await
    }

    /// Every stored body as its table holds it — payloads, cached answers, kept headers,
    /// history excerpts — each as `(table.column of provider/key, bytes)`.
    pub async fn raw_bodies(&self) -> Vec<(String, Vec<u8>)> {
        const EVENTS: &str = "SELECT provider, event_key, payload, result_body, \
                              request_headers FROM webhook_events";
        const ATTEMPTS: &str = "SELECT provider, event_key, attempt, answer FROM webhook_attempts";
        let mut found = Vec::new();
        match &self.inspect {
            Inspect::Pg(client) => {
                for row in client.query(EVENTS, &[]).await.expect("read events") {
                    let at: String =
                        format!("{}/{}", row.get::<_, String>(0), row.get::<_, String>(1));
                    for (i, column) in [(2, "payload"), (3, "result_body")] {
                        if let Some(b) = row.get::<_, Option<Vec<u8>>>(i) {
                            found.push((format!("{column} of {at}"), b));
                        }
                    }
                    if let Some(t) = row.get::<_, Option<String>>(4) {
                        found.push((format!("request_headers of {at}"), t.into_bytes()));
                    }
                }
                for row in client.query(ATTEMPTS, &[]).await.expect("read history") {
                    if let Some(t) = row.get::<_, Option<String>>(3) {
                        let at = format!(
                            "{}/{}#{}",
                            row.get::<_, String>(0),
                            row.get::<_, String>(1),
                            row.get::<_, i32>(2)
                        );
                        found.push((format!("answer of {at}"), t.into_bytes()));
                    }
                }
            }
            Inspect::Sqlite(file) => {
                let conn = Self::sqlite(file);
                let mut stmt = conn.prepare(EVENTS).expect("read events");
                let mut rows = stmt.query([]).expect("read events");
                while let Some(row) = rows.next().expect("a row") {
                    let at = format!(
                        "{}/{}",
                        row.get::<_, String>(0).unwrap(),
                        row.get::<_, String>(1).unwrap()
                    );
                    for (i, column) in [(2, "payload"), (3, "result_body"), (4, "request_headers")]
                    {
                        match row.get::<_, rusqlite::types::Value>(i).unwrap() {
                            rusqlite::types::Value::Blob(b) => {
                                found.push((format!("{column} of {at}"), b))
                            }
                            rusqlite::types::Value::Text(t) => {
                                found.push((format!("{column} of {at}"), t.into_bytes()));
                            }
                            _ => {}
                        }
                    }
                }
                let mut stmt = conn.prepare(ATTEMPTS).expect("read history");
                let mut rows = stmt.query([]).expect("read history");
                while let Some(row) = rows.next().expect("a row") {
                    if let Some(t) = row.get::<_, Option<String>>(3).unwrap() {
                        let at = format!(
                            "{}/{}#{}",
                            row.get::<_, String>(0).unwrap(),
                            row.get::<_, String>(1).unwrap(),
                            row.get::<_, i32>(2).unwrap()
                        );
                        found.push((format!("answer of {at}"), t.into_bytes()));
                    }
                }
            }
        }
        found
    }

    /// The SQLite file's bytes, its write-ahead log's included (empty on Postgres).
    pub fn file_bytes(&self) -> Vec<u8> {
        let Inspect::Sqlite(file) = &self.inspect else {
            return Vec::new();
        };
        let mut bytes = std::fs::read(&file.0).unwrap_or_default();
        let mut wal = file.0.clone().into_os_string();
        wal.push("-wal");
        bytes.extend(std::fs::read(&wal).unwrap_or_default());
        bytes
    }

    /// Copies the stored payload of `from` over that of `to` (two keys of `provider`), as
    /// someone with the database but not the key might.
    pub async fn copy_payload(&self, provider: &str, from: &str, to: &str) {
        let n = match &self.inspect {
            Inspect::Pg(client) => client
                .execute(
                    "UPDATE webhook_events SET payload = (SELECT payload FROM webhook_events \
                     WHERE provider = $1 AND event_key = $2) WHERE provider = $1 AND event_key = $3",
                    &[&provider, &from, &to],
                )
                .await
                .expect("copy the payload"),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .execute(
                    "UPDATE webhook_events SET payload = (SELECT payload FROM webhook_events \
                     WHERE provider = ?1 AND event_key = ?2) WHERE provider = ?1 AND event_key = ?3",
                    [provider, from, to],
                )
                .expect("copy the payload") as u64,
        };
        assert_eq!(n, 1, "no row {provider}:{to}");
    }

    /// Writes `payload` in plain over the stored payload of `key`, as someone who can
    /// write the table but holds no key might.
    pub async fn write_payload(&self, provider: &str, key: &str, payload: &[u8]) {
        let n = match &self.inspect {
            Inspect::Pg(client) => client
                .execute(
                    "UPDATE webhook_events SET payload = $3 WHERE provider = $1 AND event_key = $2",
                    &[&provider, &key, &payload],
                )
                .await
                .expect("write the payload"),
            Inspect::Sqlite(file) => Self::sqlite(file)
                .execute(
                    "UPDATE webhook_events SET payload = ?3 WHERE provider = ?1 AND event_key = ?2",
                    rusqlite::params![provider, key, payload],
                )
                .expect("write the payload") as u64,
        };
        assert_eq!(n, 1, "no row {provider}:{key}");
    }
}
