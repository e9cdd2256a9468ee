//! Retention as an operator sees it: the sweeper deletes only expired rows, and one pass
//! removes a backlog of any size, publishing the backlog and the tables' sizes; a pass
//! that fails is counted and keeps the backlog rising.

use std::sync::Arc;
use std::time::Duration;

use hookgate::metrics::Metrics;
use hookgate::retention::{SweepReport, Sweeper};

use crate::helpers::dead_letter;
use crate::helpers::{
    eventually, spawn_app, Backend, CapturedLog, FaultyStore, StoreProxy, TestDb, PROVIDER,
};

/// The value of `name`'s sample (a family without labels) in the text `/metrics` serves.
fn sample(metrics: &Metrics, name: &str) -> f64 {
    let text = metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

const FAILED: &str = "hookgate_retention_failed_passes_total";
const BACKLOG: &str = "hookgate_retention_backlog_seconds";
const LOCK: &str = "hookgate_retention_lock_seconds";

#[actix_web::test]
async fn the_sweeper_deletes_only_expired_rows() {
    let app = spawn_app().await;
    app.deliver("evt_keep", "{}").await;
    dead_letter(&app, "evt_dead").await;
    let mut retention = hookgate::config::RetentionConfig::default();
    let sweeper = |retention| {
        Sweeper::new(
            Arc::clone(&app.store),
            retention,
            Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
    };
    assert_eq!(
        sweeper(retention.clone()).run_once().await.unwrap(),
        SweepReport::default()
    );
    retention.done = Duration::ZERO;
    let report = sweeper(retention.clone()).run_once().await.unwrap();
    assert_eq!(report, SweepReport { done: 1, dead: 0 });
    retention.dead = Duration::ZERO;
    let report = sweeper(retention).run_once().await.unwrap();
    assert_eq!(report, SweepReport { done: 0, dead: 1 });
    assert_eq!(app.db.count_rows().await, 0);
}

/// A backlog of expired rows larger than any fixed number of batches a pass once allowed
/// (100 batches of `sweep_batch`) is removed by one pass, which then reports no backlog;
/// the backlog and the tables' sizes are metrics. The rows age with the store's clock (on
/// Postgres the ring's slot that took them ages too, as it would have had no pass run for
/// a week); a pass that cannot remove them shows how far behind it is.
async fn one_retention_pass_removes_a_backlog_of_any_size(backend: Backend) {
    // A store without a node: no sweeper of a node's own runs beside the test's passes.
    let db = TestDb::on(backend).await;
    let store = db.store().await;
    // Past retention (a week) and its last turn (a quarter more), where a ring keeps rows.
    let week = Duration::from_secs(10 * 24 * 3600);
    db.insert_done_rows(PROVIDER, "old_", 2_500, Duration::ZERO)
        .await;
    db.advance_clock(week).await;
    db.insert_done_rows(PROVIDER, "new_", 10, Duration::ZERO)
        .await;
    let retention = hookgate::config::RetentionConfig {
        sweep_batch: 10,
        ..hookgate::config::RetentionConfig::default()
    };
    let metrics = Arc::new(Metrics::new());
    let sweeper = Sweeper::new(
        Arc::clone(&store),
        retention.clone(),
        Arc::clone(&metrics),
        hookgate::logging::discard(),
    );
    let report = sweeper.run_once().await.unwrap();
    assert_eq!(
        report,
        SweepReport {
            done: 2_500,
            dead: 0
        }
    );
    assert_eq!(db.count_rows().await, 10, "the rows inside retention stay");
    let text = metrics.render();
    assert!(
        text.contains("hookgate_retention_backlog_seconds 0.0"),
        "{text}"
    );
    let events = text
        .lines()
        .find(|l| l.starts_with("hookgate_table_bytes{table=\"webhook_events\"}"))
        .unwrap_or_else(|| panic!("{text}"));
    let bytes: u64 = events.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes > 0, "{events}");

    // Rows left past retention show as the backlog: on SQLite a pass with no time to
    // delete more than a row; on Postgres a pass whose truncation cannot have its lock (a
    // long report reads the table).
    db.insert_done_rows(PROVIDER, "late_", 5, Duration::ZERO)
        .await;
    db.advance_clock(week).await;
    let behind = hookgate::config::RetentionConfig {
        sweep_interval: Duration::ZERO,
        sweep_batch: 1,
        ..hookgate::config::RetentionConfig::default()
    };
    let sweeper = |retention| {
        Sweeper::new(
            Arc::clone(&store),
            retention,
            Arc::clone(&metrics),
            hookgate::logging::discard(),
        )
    };
    let reader = match backend {
        Backend::Postgres => Some(db.read_in_open_transaction("webhook_events").await),
        Backend::Sqlite => None,
    };
    sweeper(behind).run_once().await.unwrap();
    let backlog = || {
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with("hookgate_retention_backlog_seconds "))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .unwrap()
    };
    assert!(
        backlog() > 3600.0,
        "a day past retention shows: {}",
        backlog()
    );
    if let Some(reader) = reader {
        reader.release().await;
    }
    sweeper(retention).run_once().await.unwrap();
    assert_eq!(backlog(), 0.0, "caught up");
    assert_eq!(db.count_rows().await, 0, "every row was past retention");
}

/// A store that cannot be reached fails every pass: each is counted and logged, and the
/// backlog rises with the time since the last good pass instead of reading zero. Once the
/// store answers again, a good pass counts nothing and publishes the store's own backlog.
#[actix_web::test]
async fn passes_against_an_unreachable_store_are_counted_and_keep_the_backlog_rising() {
    let db = TestDb::new().await;
    let proxy = StoreProxy::start(&db.url).await;
    let mut config = db.store_config();
    config.url = proxy.url_for(&db.url);
    let store = db.store_with(config).await;
    let metrics = Arc::new(Metrics::new());
    let log = CapturedLog::default();
    let sweeper = Sweeper::new(
        Arc::clone(&store),
        hookgate::config::RetentionConfig::default(),
        Arc::clone(&metrics),
        log.logger(),
    );
    sweeper.run_once().await.expect("a good pass");
    assert_eq!(sample(&metrics, FAILED), 0.0);
    assert_eq!(sample(&metrics, BACKLOG), 0.0);

    proxy.cut();
    sweeper.run_once().await.expect_err("the store is gone");
    assert_eq!(sample(&metrics, FAILED), 1.0);
    let first = sample(&metrics, BACKLOG);
    assert!(first > 0.0, "a failed pass is not retention keeping up");
    sweeper.run_once().await.expect_err("the store is gone");
    assert_eq!(sample(&metrics, FAILED), 2.0);
    assert!(
        sample(&metrics, BACKLOG) > first,
        "the backlog rises while passes fail: {} after {first}",
        sample(&metrics, BACKLOG)
    );
    let failed: Vec<_> = log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "retention.pass_failed")
        .collect();
    assert_eq!(failed.len(), 2, "{:?}", log.lines());
    assert!(
        failed
            .iter()
            .all(|l| !l["error"].as_str().unwrap().is_empty()),
        "{failed:?}"
    );

    proxy.restore();
    eventually("the store to answer again", || async {
        store.ping().await.is_ok()
    })
    .await;
    sweeper.run_once().await.expect("a good pass");
    assert_eq!(sample(&metrics, FAILED), 2.0, "a good pass counts nothing");
    assert_eq!(
        sample(&metrics, BACKLOG),
        0.0,
        "the store's own figure again"
    );
}

/// A pass that removed what it could but says one of its steps failed (an emptying the
/// database refused) is counted as failed, and publishes at least the time since the last
/// good pass even though the store's own backlog reads zero; it publishes the longest lock
/// it held. A good pass after it counts nothing and publishes the store's own figures.
async fn a_pass_with_a_failed_step_is_counted_and_never_reads_as_keeping_up(backend: Backend) {
    let db = TestDb::on(backend).await;
    let store = Arc::new(FaultyStore::new(db.store().await));
    db.insert_done_rows(PROVIDER, "old_", 3, Duration::ZERO)
        .await;
    db.advance_clock(Duration::from_secs(10 * 24 * 3600)).await;
    let metrics = Arc::new(Metrics::new());
    let log = CapturedLog::default();
    let sweeper = Sweeper::new(
        Arc::clone(&store) as Arc<dyn hookgate::store::Store>,
        hookgate::config::RetentionConfig::default(),
        Arc::clone(&metrics),
        log.logger(),
    );
    assert_eq!(
        sample(&metrics, FAILED),
        0.0,
        "served from the first scrape"
    );
    assert_eq!(sample(&metrics, LOCK), 0.0, "served from the first scrape");

    store.edit_retained(Some(|mut retained| {
        retained.failed = Some("canceling statement due to statement timeout".into());
        retained.longest_lock = Duration::from_millis(1_500);
        Ok(retained)
    }));
    let report = sweeper.run_once().await.expect("the pass answered");
    assert_eq!(
        report,
        SweepReport { done: 3, dead: 0 },
        "the rest of it ran"
    );
    assert_eq!(db.count_rows().await, 0);
    assert_eq!(sample(&metrics, FAILED), 1.0);
    assert!(
        sample(&metrics, BACKLOG) > 0.0,
        "the store reads zero, but the pass failed"
    );
    assert_eq!(sample(&metrics, LOCK), 1.5);
    assert_eq!(log.count("retention.pass_failed"), 1, "{:?}", log.lines());
    let swept: Vec<_> = log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "retention.swept")
        .collect();
    assert_eq!(swept.len(), 1, "{:?}", log.lines());
    assert_eq!(swept[0]["longest_lock_ms"], 1_500);
    let failed = log
        .lines()
        .into_iter()
        .find(|l| l["msg"] == "retention.pass_failed")
        .unwrap();
    assert_eq!(
        failed["error"],
        "canceling statement due to statement timeout"
    );

    store.edit_retained(None);
    sweeper.run_once().await.expect("a good pass");
    assert_eq!(sample(&metrics, FAILED), 1.0, "a good pass counts nothing");
    assert_eq!(
        sample(&metrics, BACKLOG),
        0.0,
        "the store's own figure again"
    );
    assert!(
        sample(&metrics, LOCK) < 1.0,
        "the last pass's own lock: {}",
        sample(&metrics, LOCK)
    );
}

on_both_stores!(
    one_retention_pass_removes_a_backlog_of_any_size,
    a_pass_with_a_failed_step_is_counted_and_never_reads_as_keeping_up,
);
