//! Upgrading a store's schema: a migration waiting for a long reader holds no claim behind
//! it, a schema of the last release upgrades and keeps its rows, and a populated Postgres
//! database of the previous schema becomes the slot ring in place while the previous
//! release goes on claiming.

use std::time::Duration;

use hookgate::claim::{ClaimResult, RowState, Status};
use hookgate::key::EventId;

use super::{pass, retention, turn};
use crate::helpers::{eventually, Backend, TestDb, PROVIDER};

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

/// A claim as a node of the previous release makes it (its statement names the table's
/// primary key), on the test's own connection.
async fn claim_as_the_previous_release(db: &TestDb, key: &str) {
    db.execute(&format!(
        "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path)
         VALUES ('{PROVIDER}', '{key}', 'in_progress', 1, 'first_run')
         ON CONFLICT (provider, event_key) DO UPDATE SET attempts = webhook_events.attempts + 1
         WHERE webhook_events.status = 'failed'"
    ))
    .await;
}

/// Rows of the previous schema: 20 000 events over the statuses (7 in 10 done, half of
/// them done eight days ago, past retention), with a history row for each dead letter.
const UPGRADED_ROWS: i64 = 20_000;

/// A populated database of the previous schema (migrations 1 to 6) upgrades in place. The
/// online steps (`hookgate migrate --online`) run while a node of the previous release goes
/// on claiming, even while the unique index's concurrent build waits for a long report's
/// snapshot; the last step runs at the new version's start. Every row is kept, in slot 0,
/// and answers as before; retention removes slot 0's expired rows row by row, and empties
/// the slot (its keepers moved out) once its time is up.
#[actix_web::test]
async fn a_populated_database_of_the_previous_schema_upgrades_in_place() {
    let db = TestDb::new().await;
    db.apply_sql(&format!("CREATE SCHEMA {}", db.schema)).await;
    for sql in [
        include_str!("../../../src/store/postgres/migrations/0001_webhook_events.sql"),
        include_str!("../../../src/store/postgres/migrations/0002_request_headers.sql"),
        include_str!("../../../src/store/postgres/migrations/0003_queue.sql"),
        include_str!("../../../src/store/postgres/migrations/0004_throttles.sql"),
        include_str!("../../../src/store/postgres/migrations/0005_history.sql"),
        include_str!("../../../src/store/postgres/migrations/0006_replay_items_at.sql"),
    ] {
        db.apply_sql(sql).await;
    }
    db.apply_sql(&format!(
        "CREATE TABLE hookgate_migrations (version integer PRIMARY KEY,
                                           applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO hookgate_migrations (version) SELECT generate_series(1, 6);
         INSERT INTO webhook_events (provider, event_key, status, attempts, last_path, mode,
                                     dead_reason, next_attempt_at, created_at, updated_at)
         SELECT '{PROVIDER}', 'old' || g,
                CASE g % 10 WHEN 0 THEN 'failed' WHEN 1 THEN 'dead' WHEN 2 THEN 'queued'
                            ELSE 'done' END,
                1, 'first_run', CASE g % 10 WHEN 2 THEN 'queue' ELSE 'sync' END,
                CASE g % 10 WHEN 1 THEN 'non_retryable' END,
                CASE g % 10 WHEN 2 THEN now() END,
                now() - (g % 2) * interval '8 days', now() - (g % 2) * interval '8 days'
         FROM generate_series(1, {UPGRADED_ROWS}) g;
         INSERT INTO webhook_attempts (provider, event_key, attempt, path, node, mode, outcome,
                                       started_at, ended_at, target_status)
         SELECT provider, event_key, 1, 'first_run', 'old-node', mode, 'dead', updated_at,
                updated_at, 400
         FROM webhook_events WHERE status = 'dead'"
    ))
    .await;

    // The online steps, while the previous release claims; its statements never wait on
    // the unique index's build, which waits for a report's snapshot.
    let report = db.hold_snapshot().await;
    let upgrading = hookgate::store::open(&db.store_config()).await.unwrap();
    let online = upgrading.migrate_online(&|_: &hookgate::store::MigrationWait| {});
    let meanwhile = async {
        eventually(
            "the concurrent index build to wait for the report",
            || async {
                db.query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE query LIKE 'CREATE UNIQUE INDEX CONCURRENTLY%'
                   AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .get::<_, i64>(0)
                    > 0
            },
        )
        .await;
        for n in 0..50 {
            claim_as_the_previous_release(&db, &format!("live{n}")).await;
        }
        report.release().await;
    };
    let (online, ()) = futures_util::join!(online, meanwhile);
    online.expect("the online steps");
    assert_eq!(db.migrations().await, (1..=9).collect::<Vec<i64>>());
    claim_as_the_previous_release(&db, "live_after").await;
    let before = db.count_rows().await;
    assert_eq!(before, UPGRADED_ROWS + 51);

    // The new version starts: the last step, then the promise on every kept row.
    let store = db.store().await;
    assert_eq!(db.migrations().await, db.all_migrations());
    assert_eq!(db.count_rows().await, before);
    let in_slot_0 = db
        .query_one("SELECT count(*) FROM webhook_events WHERE slot = 0", &[])
        .await
        .get::<_, i64>(0);
    assert_eq!(in_slot_0, before);
    assert_eq!(db.current_slot().await, 1);
    let lease = Duration::from_secs(30);
    let done = store
        .claim(&EventId::new(PROVIDER, "old4"), None, lease, None)
        .await
        .unwrap();
    assert!(
        matches!(
            done,
            ClaimResult::Existing(RowState {
                status: Status::Done,
                ..
            })
        ),
        "{done:?}"
    );
    let retried = store
        .claim(&EventId::new(PROVIDER, "old10"), None, lease, None)
        .await
        .unwrap();
    assert!(
        matches!(retried, ClaimResult::Won { attempts: 2, .. }),
        "{retried:?}"
    );
    assert_eq!(db.slots_of(PROVIDER, "old10").await, vec![0]);
    let new = store
        .claim(&EventId::new(PROVIDER, "brand_new"), None, lease, None)
        .await
        .unwrap();
    assert!(
        matches!(new, ClaimResult::Won { attempts: 1, .. }),
        "{new:?}"
    );
    assert_eq!(db.slots_of(PROVIDER, "brand_new").await, vec![1]);

    // Slot 0 loses its expired done rows one by one: the 8 000 done eight days ago.
    pass(&store).await;
    assert_eq!(db.count_rows().await, before + 1 - 8_000);
    // Once slot 0's time is up it is emptied: what it must keep (not final, dead letters
    // inside their retention) moves to the current slot with its history.
    db.advance_clock(retention().done + turn()).await;
    pass(&store).await;
    pass(&store).await;
    let ring = db.ring().await;
    assert_eq!(ring[0], (0, "empty".to_owned()), "{ring:?}");
    let keepers = db
        .query_one(
            "SELECT count(*) FILTER (WHERE status IN ('failed', 'queued', 'in_progress', 'dead')),
                    count(*), count(*) FILTER (WHERE slot = 0)
             FROM webhook_events",
            &[],
        )
        .await;
    let (kept, all, left): (i64, i64, i64) = (keepers.get(0), keepers.get(1), keepers.get(2));
    assert_eq!((kept, all, left), (all, all, 0));
    assert_eq!(
        kept,
        3 * UPGRADED_ROWS / 10 + 51 + 1,
        "every unfinished row and dead letter"
    );
    let history = db
        .query_one("SELECT count(*) FROM webhook_attempts WHERE slot <> 0", &[])
        .await
        .get::<_, i64>(0);
    assert_eq!(
        history,
        UPGRADED_ROWS / 10,
        "the dead letters' history moved with them"
    );
}

on_both_stores!(a_schema_of_the_last_release_upgrades_and_keeps_its_rows,);
