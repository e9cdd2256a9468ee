//! Opening the store a URL names: `postgres://…` (or libpq's `host=… dbname=…` form) or
//! `sqlite://PATH`.

use std::sync::Arc;

use super::api::{Store, StoreError};
use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use crate::config::StoreConfig;

/// Opens the store named by `config.url`.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    let key_values = !config.url.contains("://") && config.url.contains('=');
    if config.url.starts_with("postgres://")
        || config.url.starts_with("postgresql://")
        || key_values
    {
        Ok(Arc::new(PgStore::connect(config)?))
    } else if let Some(path) = SqliteStore::path_of(&config.url) {
        Ok(Arc::new(SqliteStore::open(
            std::path::Path::new(path),
            config.deadline(),
        )?))
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
