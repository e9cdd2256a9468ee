//! A provider's config changes under its rows: queue rows accepted before it left queue
//! mode are still delivered, and the rows of a provider removed from every node become
//! `provider_removed` dead letters.

use std::sync::Arc;
use std::time::Duration;

use hookgate::key::EventId;
use hookgate::metrics::Metrics;
use hookgate::retention::Sweeper;

use crate::helpers::long_deliveries;
use crate::helpers::{
    base_config, eventually, spawn_app_on, Backend, Behaviour, TestApp, PROVIDER,
};

/// A row keeps the mode it was accepted in: a node whose provider is now in sync mode
/// still delivers the queue rows accepted before.
async fn queue_rows_are_delivered_after_their_provider_left_queue_mode(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_mv", "{}").await.status, 202);
    app.wait_status("evt_mv", "failed").await;
    let sync_node = app
        .second_node(|c| c.queue.poll_interval = Duration::from_secs(3600))
        .await;
    app.target.set(Behaviour::Accept);
    app.db.make_due(PROVIDER, "evt_mv").await;
    eventually("the sync node to deliver the queue row", || async {
        sync_node.scheduler.run_once().await.unwrap();
        app.db.status(PROVIDER, "evt_mv").await.as_deref() == Some("done")
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_mv")), 2);
}

/// Queue rows whose provider is no longer configured become dead letters that say so.
async fn queue_rows_of_a_removed_provider_become_dead_letters(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_rm", "{}").await.status, 202);
    app.wait_status("evt_rm", "failed").await;
    let config = base_config(&app.db, &app.target);
    let sweeper = |providers: &[&str]| {
        let horizons = providers
            .iter()
            .map(|p| ((*p).to_owned(), Duration::from_secs(3600)))
            .collect();
        Sweeper::new(
            app.store.clone(),
            config.retention.clone(),
            Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
        .with_horizons(horizons)
        .with_orphan_grace(Duration::ZERO)
    };
    assert_eq!(sweeper(&[PROVIDER]).abandon_once().await.unwrap(), 0);
    // A node that knows of no provider at all (a sweeper built without any) orphans nothing.
    app.db.make_due(PROVIDER, "evt_rm").await;
    assert_eq!(sweeper(&[]).abandon_once().await.unwrap(), 0);
    assert_eq!(
        app.db.status(PROVIDER, "evt_rm").await.as_deref(),
        Some("failed")
    );
    assert_eq!(sweeper(&["github"]).abandon_once().await.unwrap(), 1);
    let dead = app
        .store
        .dead_letters(Some(PROVIDER), None, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].dead_reason.as_deref(), Some("provider_removed"));
}

/// A sync row of a provider since removed from every node (a failed one, or one whose
/// attempt crashed): its sender now gets 404 and no sweep of a configured provider sees it,
/// so it too becomes a `provider_removed` dead letter — once no attempt holds its lease.
async fn sync_rows_of_a_removed_provider_become_dead_letters(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_srm", "{}").await.status, 503);
    assert_eq!(
        app.db.status(PROVIDER, "evt_srm").await.as_deref(),
        Some("failed")
    );
    let config = base_config(&app.db, &app.target);
    let sweeper = |grace| {
        Sweeper::new(
            app.store.clone(),
            config.retention.clone(),
            Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
        .with_horizons(vec![("github".to_owned(), Duration::from_secs(3600))])
        .with_orphan_grace(grace)
    };
    assert_eq!(
        sweeper(Duration::from_secs(3600))
            .abandon_once()
            .await
            .unwrap(),
        0,
        "within its grace"
    );
    assert_eq!(sweeper(Duration::ZERO).abandon_once().await.unwrap(), 1);
    let row = app
        .store
        .lookup(&EventId::new(PROVIDER, "evt_srm"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.status.as_str(), "dead");
    assert_eq!(row.dead_reason.as_deref(), Some("provider_removed"));
    assert_eq!(row.payload.as_deref(), Some(&b"{}"[..]), "kept to replay");
}

on_both_stores!(
    queue_rows_are_delivered_after_their_provider_left_queue_mode,
    queue_rows_of_a_removed_provider_become_dead_letters,
    sync_rows_of_a_removed_provider_become_dead_letters,
);
