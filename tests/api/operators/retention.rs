//! Retention as an operator sees it: the sweeper deletes only expired rows, and one pass
//! removes a backlog of any size, publishing the backlog and the tables' sizes.

use std::sync::Arc;
use std::time::Duration;

use hookgate::metrics::Metrics;
use hookgate::retention::{SweepReport, Sweeper};

use crate::helpers::dead_letter;
use crate::helpers::{spawn_app, Backend, TestDb, PROVIDER};

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

on_both_stores!(one_retention_pass_removes_a_backlog_of_any_size,);
