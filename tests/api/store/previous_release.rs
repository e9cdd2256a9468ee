//! The previous release's statements (`previous_release.sql`), replayed on the test's own
//! connection as that release's nodes send them, against whatever schema an upgrade's
//! online steps leave: its claims, its outcomes with history and its sweep must keep
//! working there, since its nodes go on serving until the last (offline) step. Every
//! migration a later issue adds to the online steps is held to this by the upgrade tests
//! that call [`serves`].

use crate::helpers::{TestDb, PROVIDER};

/// The previous release's statements, prepared on the test's connection as
/// `previous_<name>`.
const STATEMENTS: &str = include_str!("previous_release.sql");

/// The previous release's retention of done rows (its default, 7 days), in ms.
const RETENTION_DONE_MS: i64 = 7 * 24 * 3600 * 1000;

/// The previous release's schema (migrations 1 to 6, as their files say, and their
/// bookkeeping) in the test's schema, with no rows.
pub(super) async fn schema(db: &TestDb) {
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
    db.apply_sql(
        "CREATE TABLE hookgate_migrations (version integer PRIMARY KEY,
                                           applied_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO hookgate_migrations (version) SELECT generate_series(1, 6);",
    )
    .await;
}

/// Prepares the previous release's statements on the test's connection (once per
/// [`TestDb`]).
pub(super) async fn prepare(db: &TestDb) {
    db.execute(STATEMENTS).await;
}

/// The previous release's claim of `key` (`previous_claim`, or its batch), answering
/// `(won, attempts)`.
pub(super) async fn claim(db: &TestDb, key: &str, batch: bool) -> (bool, i32) {
    let sql = if batch {
        format!(
            "EXECUTE previous_claim_batch(ARRAY['{PROVIDER}'], ARRAY['{key}'], '{{NULL}}',
                                          ARRAY[30000], '{{NULL}}', '{{NULL}}', '{{NULL}}')"
        )
    } else {
        format!("EXECUTE previous_claim('{PROVIDER}', '{key}', NULL, 30000, NULL, NULL, NULL)")
    };
    let rows = db
        .try_query(&sql)
        .await
        .expect("the previous release's claim");
    assert_eq!(rows.len(), 1, "one answer for {key}");
    (rows[0].get("won"), rows[0].get("attempts"))
}

/// The previous release's retryable failure of attempt `attempt` of `key`, with its
/// history row: how many rows it changed, or the error Postgres answered.
pub(super) async fn fail(db: &TestDb, key: &str, attempt: i32) -> Result<i64, String> {
    let sql = format!(
        "EXECUTE previous_fail('{PROVIDER}', '{key}', {attempt}, 'failed', 'target answered 503',
                               NULL, NULL, NULL, NULL, NULL, 0,
                               'first_run', 'previous-node', 'failed', 5, 503, NULL)"
    );
    let rows = db.try_query(&sql).await.map_err(|e| format!("{e:?}"))?;
    Ok(rows[0].get("changed"))
}

/// The previous release's completion of attempt `attempt` of `key` with its history row
/// (`previous_complete`, or its batch): how many rows it changed, or the error.
async fn complete(db: &TestDb, key: &str, attempt: i32, batch: bool) -> Result<i64, String> {
    let sql = if batch {
        format!(
            "EXECUTE previous_complete_batch(ARRAY['{PROVIDER}'], ARRAY['{key}'],
                 ARRAY[{attempt}], ARRAY[200], ARRAY['application/json'], '{{NULL}}',
                 ARRAY['retry_after_failure'], ARRAY['previous-node'], ARRAY[5], '{{NULL}}')"
        )
    } else {
        format!(
            "EXECUTE previous_complete('{PROVIDER}', '{key}', {attempt}, 200,
                 'application/json', NULL, 'retry_after_failure', 'previous-node', 5, NULL)"
        )
    };
    let rows = db.try_query(&sql).await.map_err(|e| format!("{e:?}"))?;
    Ok(if batch {
        rows.len() as i64
    } else {
        rows[0].get("changed")
    })
}

/// `key`'s history as `(attempt, outcome)`, in attempt order.
pub(super) async fn history(db: &TestDb, key: &str) -> Vec<(i32, String)> {
    db.try_query(&format!(
        "SELECT attempt, outcome FROM webhook_attempts
         WHERE provider = '{PROVIDER}' AND event_key = '{key}' ORDER BY attempt"
    ))
    .await
    .expect("the history")
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// One life of `key` under the previous release: claimed, failed, retried and completed,
/// each outcome written with its history row (attempts 1 and 2). `key` has no row yet.
pub(super) async fn life(db: &TestDb, key: &str) {
    assert_eq!(claim(db, key, true).await, (true, 1), "{key} claimed");
    assert_eq!(fail(db, key, 1).await, Ok(1), "attempt 1 of {key} failed");
    assert_eq!(claim(db, key, false).await, (true, 2), "{key} retried");
    assert_eq!(
        complete(db, key, 2, true).await,
        Ok(1),
        "attempt 2 of {key} done"
    );
    assert_eq!(history(db, key).await, both_attempts());
}

/// The history [`life`] writes.
fn both_attempts() -> Vec<(i32, String)> {
    vec![(1, "failed".to_owned()), (2, "done".to_owned())]
}

/// `key`, done, made older than any other row and swept by the previous release's sweep
/// (its first row: it goes oldest first); the event is gone after it.
pub(super) async fn swept(db: &TestDb, key: &str) {
    db.execute(&format!(
        "UPDATE webhook_events SET updated_at = now() - interval '3650 days'
         WHERE provider = '{PROVIDER}' AND event_key = '{key}'"
    ))
    .await;
    db.try_query(&format!(
        "EXECUTE previous_sweep('done', {RETENTION_DONE_MS}, 1)"
    ))
    .await
    .expect("the previous release's sweep");
    let left = db
        .query_one(
            "SELECT count(*) FROM webhook_events WHERE provider = $1 AND event_key = $2",
            &[&PROVIDER, &key],
        )
        .await
        .get::<_, i64>(0);
    assert_eq!(left, 0, "the sweep removed {key}");
}

/// The previous release serves on this schema: a key lives its [`life`], is swept past
/// retention — its history goes with it — and, delivered again under the same key, lives
/// the same life with the same attempt numbers (its outcomes and their history rows
/// written, none refused as a duplicate). The statements were prepared by [`prepare`];
/// `key` must be new to the database.
pub(super) async fn serves(db: &TestDb, key: &str) {
    life(db, key).await;
    swept(db, key).await;
    assert_eq!(
        history(db, key).await,
        vec![],
        "{key}'s history went with its event"
    );
    life(db, key).await;
}
