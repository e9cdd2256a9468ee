//! What a node publishes to be watched: `/metrics` counts the requests made and serves
//! every family the deploy files use from the first scrape, and `/readyz` costs the store
//! at most a ping a second.

use crate::helpers::{spawn_app, Behaviour};

/// `/readyz` answers from a store check at most a second old: unauthenticated callers
/// cannot make it cost a store round trip each.
#[actix_web::test]
async fn readiness_costs_the_store_at_most_a_ping_a_second() {
    use std::sync::atomic::Ordering;
    let db = crate::helpers::TestDb::new().await;
    let target = crate::helpers::TestTarget::start().await;
    let config = crate::helpers::base_config(&db, &target);
    let store = std::sync::Arc::new(crate::helpers::FaultyStore::new(
        db.store_with(config.store.clone()).await,
    ));
    let delivery = std::sync::Arc::new(hookgate::worker::HttpDelivery);
    let app = crate::helpers::start_node_on(db, target, config, delivery, store.clone()).await;
    let started = std::time::Instant::now();
    let before = store.pings.load(Ordering::SeqCst);
    for _ in 0..50 {
        assert_eq!(app.get("/readyz").await.status, 200);
    }
    let pings = store.pings.load(Ordering::SeqCst) - before;
    let seconds = started.elapsed().as_secs() as usize;
    assert!(
        pings <= seconds + 1,
        "{pings} pings in {seconds} s for 50 calls"
    );
}

/// The families the shipped alerts and dashboard read are served from the first scrape,
/// whatever mode the providers are in.
#[actix_web::test]
async fn every_family_the_deploy_files_use_is_served_by_a_sync_only_node() {
    let app = spawn_app().await;
    let metrics = app.get("/metrics").await.body;
    for family in [
        r#"hookgate_queue_rows{provider="stripe",route="main"} 0"#,
        r#"hookgate_queue_oldest_due_seconds{provider="stripe",route="main"} 0"#,
        r#"hookgate_actor_panics_total{actor="shard"} 0"#,
    ] {
        assert!(metrics.contains(family), "missing {family} in\n{metrics}");
    }
}

#[actix_web::test]
async fn metrics_count_the_requests_made() {
    let app = spawn_app().await;
    for key in ["m1", "m2", "m3"] {
        app.deliver(key, "{}").await;
    }
    app.deliver("m1", "{}").await;
    app.deliver("m2", "{}").await;
    app.post("/webhooks/nobody", &[], "{}".into()).await;
    app.target.set(Behaviour::Status(500));
    app.deliver("m4", "{}").await;

    let text = app.get("/metrics").await.body;
    for line in [
        r#"hookgate_attempts_total{provider="stripe",route="main",path="first_run"} 4"#,
        r#"hookgate_attempts_total{provider="stripe",route="main",path="duplicate_done"} 2"#,
        r#"hookgate_rejected_total{provider="unknown",reason="unknown_provider"} 1"#,
        r#"hookgate_deliveries_total{provider="stripe",route="main",outcome="delivered"} 3"#,
        r#"hookgate_deliveries_total{provider="stripe",route="main",outcome="failed"} 1"#,
        r#"hookgate_delivery_seconds_count{provider="stripe",route="main"} 4"#,
        "hookgate_cache_hits_total 2",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}
