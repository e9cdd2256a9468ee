//! The hot statements' plans (claims, completions, failures, renewals and the scheduler's
//! batched take) do not depend on when the table was last analyzed: prepared
//! while `webhook_events` was empty and never analyzed, they still find rows by the primary
//! key once it holds 100 000 rows — half of them `in_progress` — never by a sequential scan
//! nor by walking an index (the status index holds every `in_progress` row). Counted as
//! rows read by sequential scans plus index entries read, per `pg_stat_user_*`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, StoredResult};
use hookgate::config::StoreConfig;
use hookgate::key::EventId;
use hookgate::store::Store;

use crate::helpers::{eventually, failure, TestDb};

const ROWS: i64 = 100_000;

/// Claims keys `hot{i}` and ends each won attempt one of three ways (complete; fail;
/// renew, then complete), so every fenced single-row and batched statement runs; with
/// `old`, also claims a key of the big table, which is reported, not won.
async fn claim_and_complete(store: &Arc<dyn Store>, keys: std::ops::Range<u32>, old: bool) {
    let done = StoredResult {
        status: 200,
        content_type: None,
        body: Vec::new(),
    };
    let lease = Duration::from_secs(30);
    let work = keys.map(|i| {
        let (store, done) = (Arc::clone(store), done.clone());
        async move {
            let id = EventId::new("p", format!("hot{i}"));
            let claimed = store.claim(&id, Some("fp"), lease, None).await;
            if let Ok(ClaimResult::Won { attempts, .. }) = claimed {
                match i % 3 {
                    0 => {
                        store.fail(&id, attempts, &failure(None)).await.unwrap();
                    }
                    1 => {
                        store.renew(&id, attempts, lease).await.unwrap();
                        store.complete(&id, attempts, &done, None).await.unwrap();
                    }
                    _ => {
                        store.complete(&id, attempts, &done, None).await.unwrap();
                    }
                }
            }
            if old {
                let old = EventId::new("p", format!("old{}", i64::from(i) % ROWS + 1));
                store.claim(&old, None, lease, None).await.unwrap();
            }
            // The scheduler's batched take, with keys of its own in flight to skip.
            if i % 10 == 0 {
                let busy: Vec<Arc<str>> = vec![Arc::from(format!("hot{i}"))];
                store.take_due("p", 10, lease, &busy).await.unwrap();
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
                                     result_status, locked_until)
         SELECT 'p', 'old' || g, CASE g % 2 WHEN 0 THEN 'done' ELSE 'in_progress' END, 1,
                'first_run', 200, now() + interval '1 hour'
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
        "{read} rows or index entries read by scans: at least one walk of the table or \
         of an index"
    );
}
