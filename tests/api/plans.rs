//! The hot statements' plans do not depend on when the table was last analyzed: prepared
//! while `webhook_events` was empty and never analyzed, they still find rows by the primary
//! key once it holds 100 000 rows, never by a sequential scan nor by a scan of a whole index.
//! Counted in `pg_stat_user_tables` (`seq_tup_read + idx_tup_fetch`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, StoredResult};
use hookgate::config::StoreConfig;
use hookgate::key::EventId;
use hookgate::store::Store;

use crate::helpers::{eventually, TestDb};

const ROWS: i64 = 100_000;

async fn claim_and_complete(store: &Arc<dyn Store>, keys: std::ops::Range<u32>, old: bool) {
    let done = StoredResult {
        status: 200,
        content_type: None,
        body: Vec::new(),
    };
    let work = keys.map(|i| {
        let (store, done) = (Arc::clone(store), done.clone());
        async move {
            let id = EventId::new("p", format!("hot{i}"));
            let claimed = store.claim(&id, Some("fp"), Duration::from_secs(30)).await;
            if let Ok(ClaimResult::Won { attempts, .. }) = claimed {
                store.complete(&id, attempts, &done).await.unwrap();
            }
            if old {
                // A key of the big table: reported, not won.
                let old = EventId::new("p", format!("old{}", i64::from(i) % ROWS + 1));
                store
                    .claim(&old, None, Duration::from_secs(30))
                    .await
                    .unwrap();
            }
        }
    });
    join_all(work).await;
}

#[actix_web::test]
async fn claims_and_completions_never_scan_the_table_whatever_its_statistics() {
    let db = TestDb::new().await;
    let name = format!("hookgate_plans_{}", fastrand::u32(..));
    let config = StoreConfig {
        url: format!("{}?application_name={name}", db.url),
        schema: db.schema.clone(),
        pool_size: 4,
        ..StoreConfig::default()
    };
    let store = db.store_with(config).await;
    db.execute("ALTER TABLE webhook_events SET (autovacuum_enabled = false)")
        .await;
    // Prepared and run on an empty table, each statement more often than Postgres's five
    // custom plans on every pooled connection, so a generic plan is chosen there.
    // The table is emptied after each round, so the scans a tiny table rightly gets read
    // next to nothing.
    for round in 0..40 {
        claim_and_complete(&store, round * 10..round * 10 + 10, false).await;
        db.execute("DELETE FROM webhook_events").await;
    }

    db.execute(&format!(
        "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                     result_status)
         SELECT 'p', 'old' || g, 'done', 1, 'first_run', 200
         FROM generate_series(1, {ROWS}) g"
    ))
    .await;
    claim_and_complete(&store, 400..3400, true).await;

    // Stats reach pg_stat_user_tables when the connections end: close them, then read.
    drop(store);
    eventually("hookgate's connections to end", || async {
        db.rows_scanned(&name).await.1 == 0
    })
    .await;
    let (read, _) = db.rows_scanned(&name).await;
    assert!(
        read < ROWS,
        "{read} rows read by scans: at least one full scan of the table or an index"
    );
}
