//! Opening the store a URL names: `postgres://…` (or libpq's `host=… dbname=…` form) or
//! `sqlite://PATH`.

use std::sync::Arc;

use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use super::{Store, StoreError};
use crate::config::StoreConfig;

/// Opens the store named by `config.url`.
/// With `[store.encryption]` keys (read from the environment), bodies are sealed at rest
/// (`sealed.rs`).
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    let store: Arc<dyn Store> = match kind(config)? {
        Kind::Postgres => Arc::new(PgStore::connect(config)?),
        Kind::Sqlite(path) => Arc::new(SqliteStore::open(
            std::path::Path::new(path),
            config.deadline(),
        )?),
    };
    Ok(super::sealed(store, config.encryption.keyring.clone()))
}

/// Checks `config` as [`open`] reads it, opening nothing and connecting to nothing: the
/// URL's form and, for Postgres, the schema's name, the URL's settings, its TLS mode and
/// trust anchors (building the pool reads them; connections open on first use).
/// `check-config` asks, so it refuses what `serve` would.
pub fn check(config: &StoreConfig) -> Result<(), StoreError> {
    match kind(config)? {
        Kind::Postgres => PgStore::connect(config).map(drop),
        Kind::Sqlite(_) => Ok(()),
    }
}

/// Which store a URL names.
enum Kind<'a> {
    Postgres,
    Sqlite(&'a str),
}

fn kind(config: &StoreConfig) -> Result<Kind<'_>, StoreError> {
    let key_values = !config.url.contains("://") && config.url.contains('=');
    if config.url.starts_with("postgres://")
        || config.url.starts_with("postgresql://")
        || key_values
    {
        Ok(Kind::Postgres)
    } else if let Some(path) = SqliteStore::path_of(&config.url) {
        Ok(Kind::Sqlite(path))
    } else {
        Err(StoreError::Query(
            format!(
                "unsupported store URL {} (expected postgres://…, host=… dbname=… or sqlite://PATH)",
                config.redacted_url()
            )
            .into(),
        ))
    }
}
