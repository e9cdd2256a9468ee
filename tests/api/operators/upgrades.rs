//! Upgrading a node's schema: a migration waiting for a long reader holds no claim behind
//! it, and a schema of the last release upgrades and keeps its rows.

use std::time::Duration;

use hookgate::key::EventId;

use crate::helpers::{Backend, PROVIDER};

/// A migration whose table lock is held by a long reader gives its lock request up after a
/// short lock timeout instead of queuing every claim behind it, tries again, and applies
/// once the reader is gone: a claim made while it waits is answered, within its deadline,
/// while the reader still reads; the migrations' bookkeeping ends complete.
#[actix_web::test]
async fn a_migration_waiting_for_a_long_reader_holds_no_claim_behind_it() {
    let db = crate::helpers::TestDb::new().await;
    let config = hookgate::config::StoreConfig {
        // Far past the migration's lock timeout: a claim that waits for the reader fails.
        statement_timeout: Some(Duration::from_secs(20)),
        ..db.store_config()
    };
    let store = db.store_with(config.clone()).await;
    // An upgrade still to apply, one that alters the events table (ACCESS EXCLUSIVE).
    db.execute("DELETE FROM hookgate_migrations WHERE version = 4")
        .await;
    let reader = db.read_in_open_transaction("webhook_events").await;
    let upgrading = hookgate::store::open(&config).await.unwrap();
    let waits = std::sync::Mutex::new(Vec::new());
    let on_wait = |wait: &hookgate::store::MigrationWait| {
        waits.lock().unwrap().push(wait.error.clone());
    };
    let migrated = upgrading.migrate_reporting(&on_wait);
    let claimed = async {
        // The migration has asked for the table and waits behind the reader.
        db.wait_for_table_waiters(1).await;
        let claimed = store
            .claim(
                &EventId::new(PROVIDER, "evt_during_migration"),
                None,
                Duration::from_secs(30),
                None,
            )
            .await;
        reader.release().await;
        claimed
    };
    let (migrated, claimed) = futures_util::join!(migrated, claimed);
    assert!(
        matches!(claimed, Ok(hookgate::claim::ClaimResult::Won { .. })),
        "a claim beside a waiting migration: {claimed:?}"
    );
    migrated.expect("the migration applies once the reader is gone");
    let waits = waits.into_inner().unwrap();
    assert!(
        !waits.is_empty() && waits.iter().all(|w| w.contains("lock timeout")),
        "each wait reported: {waits:?}"
    );
    assert_eq!(db.migrations().await, db.all_migrations());
}

/// The schema of the last release (migrations 1 to 5, as their files say), with a dead
/// letter in it, upgrades: only the migrations after 5 are applied, each once, and the row
/// is listed as before.
async fn a_schema_of_the_last_release_upgrades_and_keeps_its_rows(backend: Backend) {
    let db = crate::helpers::TestDb::on(backend).await;
    let (files, now) = match backend {
        Backend::Postgres => (
            [
                include_str!("../../../src/store/postgres/migrations/0001_webhook_events.sql"),
                include_str!("../../../src/store/postgres/migrations/0002_request_headers.sql"),
                include_str!("../../../src/store/postgres/migrations/0003_queue.sql"),
                include_str!("../../../src/store/postgres/migrations/0004_throttles.sql"),
                include_str!("../../../src/store/postgres/migrations/0005_history.sql"),
            ],
            "now()",
        ),
        Backend::Sqlite => (
            [
                include_str!("../../../src/store/sqlite/migrations/0001_webhook_events.sql"),
                include_str!("../../../src/store/sqlite/migrations/0002_request_headers.sql"),
                include_str!("../../../src/store/sqlite/migrations/0003_queue.sql"),
                include_str!("../../../src/store/sqlite/migrations/0004_throttles.sql"),
                include_str!("../../../src/store/sqlite/migrations/0005_history.sql"),
            ],
            "unixepoch('subsec')",
        ),
    };
    if backend == Backend::Postgres {
        db.apply_sql(&format!("CREATE SCHEMA {}", db.schema)).await;
    }
    for sql in files {
        db.apply_sql(sql).await;
    }
    db.apply_sql(&format!(
        "CREATE TABLE hookgate_migrations (version integer PRIMARY KEY,
                                           applied_at {} NOT NULL DEFAULT ({now}));
         INSERT INTO hookgate_migrations (version) VALUES (1), (2), (3), (4), (5);
         INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                     dead_reason, created_at, updated_at)
         VALUES ('{PROVIDER}', 'evt_old', 'dead', 1, 'first_run', 'non_retryable', {now},
                 {now})",
        if backend == Backend::Postgres {
            "timestamptz"
        } else {
            "REAL"
        },
    ))
    .await;
    let store = db.store().await;
    store
        .migrate()
        .await
        .expect("a second migrate changes nothing");
    assert_eq!(db.migrations().await, db.all_migrations());
    let dead = store.dead_letters(Some(PROVIDER), None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id.key.as_ref(), "evt_old");
    let items = store.operator().job_items(1, 10).await.unwrap();
    assert!(items.is_empty(), "the new index serves a job's page");
}

on_both_stores!(a_schema_of_the_last_release_upgrades_and_keeps_its_rows,);
