//! Upgrading a store's schema: a migration waiting for a long reader holds no claim behind
//! it, a schema of the last release upgrades and keeps its rows, a populated Postgres
//! database of the previous schema becomes the slot ring in place while the previous
//! release goes on claiming, that release's statements keep working beside the online
//! steps, and what an earlier build's online steps left beside it is repaired.

use std::time::Duration;

use hookgate::claim::{ClaimResult, RowState, Status};
use hookgate::key::EventId;

use super::{pass, previous_release, retention, turn};
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

/// Rows of the previous schema: 20 000 events over the statuses (7 in 10 done, half of
/// them done eight days ago, past retention), with a history row for each dead letter.
const UPGRADED_ROWS: i64 = 20_000;

/// A populated database of the previous schema (migrations 1 to 6) upgrades in place. The
/// online steps (`hookgate migrate --online`) run while a node of the previous release goes
/// on claiming, even while the unique index's concurrent build waits for a long report's
/// snapshot, and its statements keep working on the schema they leave (a key's life, its
/// sweep and its next life); the last step runs at the new version's start. Every row is kept, in slot 0,
/// and answers as before; retention removes slot 0's expired rows row by row, and empties
/// the slot (its keepers moved out) once its time is up.
#[actix_web::test]
async fn a_populated_database_of_the_previous_schema_upgrades_in_place() {
    let db = TestDb::new().await;
    previous_release::schema(&db).await;
    db.apply_sql(&format!(
        "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path, mode,
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
    previous_release::prepare(&db).await;
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
            let key = format!("live{n}");
            assert_eq!(previous_release::claim(&db, &key, false).await, (true, 1));
        }
        report.release().await;
    };
    let (online, ()) = futures_util::join!(online, meanwhile);
    online.expect("the online steps");
    // The previous release's claims, outcomes with history and sweep on the schema the
    // online steps left.
    previous_release::serves(&db, "served_beside").await;
    assert_eq!(db.migrations().await, online_migrations());
    let live_after = previous_release::claim(&db, "live_after", false).await;
    assert_eq!(live_after, (true, 1));
    let before = db.count_rows().await;
    assert_eq!(before, UPGRADED_ROWS + 51 + 1);

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

/// The migrations `hookgate migrate --online` applies to the previous schema: every one
/// but the last step (10), which the repairs of issue 55 (11 and 12) run before.
fn online_migrations() -> Vec<i64> {
    (1..=9).chain([11, 12]).collect()
}

/// The previous release keeps serving beside the online steps: its statements, prepared
/// before the upgrade as its nodes hold them, claim, record outcomes with their history
/// and sweep on the schema `hookgate migrate --online` leaves — a swept event's history
/// goes with it, and a key delivered again after its sweep records its attempts under the
/// same numbers. The same statements on the previous schema itself show the test's own
/// statements right.
#[actix_web::test]
async fn the_previous_release_keeps_serving_beside_the_online_steps() {
    let db = TestDb::new().await;
    previous_release::schema(&db).await;
    previous_release::prepare(&db).await;
    previous_release::serves(&db, "before_the_upgrade").await;
    let upgrading = hookgate::store::open(&db.store_config()).await.unwrap();
    upgrading
        .migrate_online(&|_: &hookgate::store::MigrationWait| {})
        .await
        .expect("the online steps");
    previous_release::serves(&db, "beside_the_upgrade").await;
    assert_eq!(db.migrations().await, online_migrations());
    // The history's own foreign key, untouched: there was nothing to repair.
    let key = db
        .query_one(
            "SELECT string_agg(conname || ' ' || convalidated, ', ') FROM pg_constraint
             WHERE conrelid = 'webhook_attempts'::regclass AND contype = 'f'",
            &[],
        )
        .await
        .get::<_, String>(0);
    assert_eq!(key, "webhook_attempts_provider_event_key_fkey true");
}

/// What the online steps of an earlier build left (issue 55): its 0007 dropped the
/// history's foreign key — the cascade the previous release's sweep relies on — and knew
/// no repair. Beside it the previous release swept two events with history: `orphaned`'s
/// history stayed behind, and `reused`, delivered again, failed to record its first
/// attempt (its history row collided with the one left behind) and stays in progress.
/// Answers after the online steps of this build and that damage.
async fn left_by_an_earlier_builds_online_steps() -> TestDb {
    let db = TestDb::new().await;
    previous_release::schema(&db).await;
    previous_release::prepare(&db).await;
    let upgrading = hookgate::store::open(&db.store_config()).await.unwrap();
    upgrading
        .migrate_online(&|_: &hookgate::store::MigrationWait| {})
        .await
        .expect("the online steps");
    // The earlier build's 0007, in its own words; the repairs it did not have, unapplied.
    db.execute(
        "DO $$
         DECLARE fk text;
         BEGIN
             FOR fk IN SELECT conname FROM pg_constraint
                       WHERE conrelid = 'webhook_attempts'::regclass AND contype = 'f' LOOP
                 EXECUTE format('ALTER TABLE webhook_attempts DROP CONSTRAINT %I', fk);
             END LOOP;
         END $$;
         DELETE FROM hookgate_migrations WHERE version > 9;",
    )
    .await;
    for key in ["orphaned", "reused"] {
        previous_release::life(&db, key).await;
        previous_release::swept(&db, key).await;
    }
    assert_eq!(previous_release::history(&db, "orphaned").await.len(), 2);
    assert_eq!(
        previous_release::claim(&db, "reused", false).await,
        (true, 1)
    );
    let collided = previous_release::fail(&db, "reused", 1).await;
    assert!(
        matches!(&collided, Err(e) if e.contains("webhook_attempts_pkey")),
        "{collided:?}"
    );
    assert_eq!(
        db.status(PROVIDER, "reused").await.as_deref(),
        Some("in_progress")
    );
    db
}

/// A database whose online steps an earlier build ran beside nodes of the previous
/// release is repaired by this build's online steps, while those nodes still serve: the
/// cascade is back, the history they left behind is gone (an event's that was swept, and
/// a reused key's earlier life), the reused key is retaken after its lease and records its
/// outcome, and the previous release serves as before. The last step then finds nothing
/// left to repair.
#[actix_web::test]
async fn an_earlier_builds_online_steps_are_repaired_while_the_previous_release_serves() {
    let db = left_by_an_earlier_builds_online_steps().await;
    let upgrading = hookgate::store::open(&db.store_config()).await.unwrap();
    upgrading
        .migrate_online(&|_: &hookgate::store::MigrationWait| {})
        .await
        .expect("this build's online steps");
    assert_eq!(previous_release::history(&db, "orphaned").await, vec![]);
    assert_eq!(previous_release::history(&db, "reused").await, vec![]);
    assert_eq!(db.migrations().await, online_migrations());
    db.expire_lease(PROVIDER, "reused").await;
    assert_eq!(
        previous_release::claim(&db, "reused", true).await,
        (true, 2)
    );
    assert_eq!(previous_release::fail(&db, "reused", 2).await, Ok(1));
    assert_eq!(
        previous_release::history(&db, "reused").await,
        vec![(2, "failed".to_owned())]
    );
    previous_release::serves(&db, "after_the_repair").await;

    // The last step, at the new version's start: the history's foreign key goes now.
    let store = db.store().await;
    assert_eq!(db.migrations().await, db.all_migrations());
    let keys = db
        .query_one(
            "SELECT count(*) FROM pg_constraint
             WHERE conrelid IN ('webhook_attempts'::regclass, 'webhook_attempts_s0'::regclass)
               AND contype = 'f'",
            &[],
        )
        .await
        .get::<_, i64>(0);
    assert_eq!(keys, 0, "no foreign key on the ring's history");
    let retried = store
        .claim(
            &EventId::new(PROVIDER, "reused"),
            None,
            Duration::from_secs(30),
            None,
        )
        .await
        .unwrap();
    assert!(
        matches!(retried, ClaimResult::Won { attempts: 3, .. }),
        "{retried:?}"
    );
}

/// A ring whose online steps an earlier build ran beside nodes of the previous release,
/// and whose last step it applied too, loses the history those nodes left behind when
/// this build starts: nothing of `orphaned` is left, and `reused` — still in progress in
/// slot 0, where its earlier life's history was — is retaken and records its failure,
/// with its history, under an attempt number its earlier life had used.
#[actix_web::test]
async fn a_ring_made_beside_the_previous_release_loses_the_history_it_left_behind() {
    let db = left_by_an_earlier_builds_online_steps().await;
    // The earlier build's last step: 0010 (its foreign key already gone).
    db.apply_sql(include_str!(
        "../../../src/store/postgres/migrations/0010_slot_ring.sql"
    ))
    .await;
    db.execute("INSERT INTO hookgate_migrations (version) VALUES (10)")
        .await;
    assert_eq!(previous_release::history(&db, "orphaned").await.len(), 2);

    let store = db.store().await;
    assert_eq!(previous_release::history(&db, "orphaned").await, vec![]);
    assert_eq!(previous_release::history(&db, "reused").await, vec![]);
    assert_eq!(db.migrations().await, db.all_migrations());
    assert_eq!(db.slots_of(PROVIDER, "reused").await, vec![0]);
    db.expire_lease(PROVIDER, "reused").await;
    let id = EventId::new(PROVIDER, "reused");
    let retaken = store
        .claim(&id, None, Duration::from_secs(30), None)
        .await
        .unwrap();
    assert!(
        matches!(retaken, ClaimResult::Won { attempts: 2, .. }),
        "{retaken:?}"
    );
    let failure = hookgate::store::Failure {
        history: Some(hookgate::store::History {
            path: hookgate::claim::Path::LeaseRetake,
            node: "this-build".into(),
            outcome: "failed",
            took: Duration::from_millis(5),
            target_status: Some(503),
            error: Some("target answered 503".into()),
            answer: None,
        }),
        ..crate::helpers::failure(None)
    };
    let failed = store.fail(&id, 2, &failure).await;
    assert!(
        matches!(failed, Ok(hookgate::store::Fenced::Applied)),
        "{failed:?}"
    );
    assert_eq!(
        previous_release::history(&db, "reused").await,
        vec![(2, "failed".to_owned())]
    );
}
