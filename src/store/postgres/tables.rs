//! The Postgres store's answers about its tables outside the ring's pass: one statement
//! deleting a batch of expired rows (the `sweep` the store offers besides the ring), and
//! each table's bytes on disk.

use std::time::Duration;

use super::pool::Inner;
use super::rows::{db_error, get};
use super::sql::{SWEEP, TABLE_SIZES};
use crate::claim::Status;
use crate::store::retain::{TableSize, TABLES};
use crate::store::{millis, StoreError};

impl Inner {
    /// Deletes up to `batch` rows in `status` older than `older_than`; answers how many.
    pub(super) async fn sweep(
        &self,
        status: Status,
        older_than: Duration,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let age_ms = millis(older_than);
        self.guarded(self.run(async move |client| {
            client
                .query_one(SWEEP, &[&status.as_str(), &age_ms, &i64::from(batch)])
                .await
                .map_err(db_error)
                .and_then(|row| get::<i64>(&row, "deleted"))
                .map(|n| u64::try_from(n).unwrap_or(0))
        }))
        .await
    }

    /// Each of hookgate's tables' bytes on disk, its indexes and TOAST included (0 for
    /// one the server does not report).
    pub(super) async fn table_sizes(&self) -> Result<Vec<TableSize>, StoreError> {
        let names: Vec<&str> = TABLES.to_vec();
        let rows = self
            .guarded(self.run(async move |client| {
                client.query(TABLE_SIZES, &[&names]).await.map_err(db_error)
            }))
            .await?;
        let mut sizes = Vec::with_capacity(TABLES.len());
        for table in TABLES {
            let bytes = rows
                .iter()
                .find(|r| r.get::<_, String>("name") == *table)
                .map(|r| get::<i64>(r, "bytes"))
                .transpose()?
                .unwrap_or(0);
            sizes.push(TableSize {
                table,
                bytes: u64::try_from(bytes).unwrap_or(0),
            });
        }
        Ok(sizes)
    }
}
