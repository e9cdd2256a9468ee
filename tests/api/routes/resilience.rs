//! A route's attempt under failure: a node killed (SIGKILL) while one route's delivery
//! hangs leaves that route's row to the next node after its lease, and the other routes are
//! not called again; a route slower than the lease lives on renewals, untaken by any node.

use hookgate::key::EventId;

use super::{count, wait_row, Routes, ANALYTICS, CRM};
use crate::helpers::{
    base_config, eventually, long_deliveries, queue_mode, spawn_app_on, start_node, Backend,
    Behaviour, BinaryNode, TestApp, TestDb, PROVIDER,
};

#[actix_web::test]
async fn a_node_killed_mid_delivery_of_one_route_leaves_it_to_the_next_node() {
    let db = TestDb::new().await;
    let target = crate::helpers::TestTarget::start().await;
    let routes = Routes::start().await;
    routes.analytics.set(Behaviour::Hang);
    let mut killed = BinaryNode::start_queue_with(&db, &target, &routes.toml()).await;
    let key = "evt_k9r";
    assert_eq!(killed.deliver(key).await, Some(202));
    routes.analytics.wait_for(&TestApp::idem(key), 1).await;
    // The body `{}` has no type: crm's filter does not take it; main is done.
    eventually("main to be done", || async {
        db.status(PROVIDER, key).await.as_deref() == Some("done")
    })
    .await;
    killed.kill9();
    routes.analytics.set(Behaviour::Accept);

    let mut config = base_config(&db, &target);
    queue_mode(&mut config);
    routes.add(&mut config);
    let next = start_node(
        db.attach().await,
        target.clone(),
        config,
        std::sync::Arc::new(hookgate::worker::HttpDelivery),
    )
    .await;
    next.scheduler.by_hand().await;
    next.scheduler.run_once().await.unwrap();
    assert_eq!(count(&routes.analytics, key), 1, "the lease still holds");
    next.db.expire_lease(ANALYTICS, key).await;
    next.db.make_due(ANALYTICS, key).await;
    next.scheduler.run_once().await.unwrap();
    wait_row(&next, ANALYTICS, key, "done").await;
    let row = next
        .store
        .lookup(&EventId::new(ANALYTICS, key))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.attempts, 2);
    assert_eq!(row.last_path.map(|p| p.as_str()), Some("lease_retake"));
    assert_eq!(count(&routes.analytics, key), 2, "cut once, delivered once");
    assert_eq!(count(&target, key), 1, "main not called again");
    assert_eq!(next.db.status(CRM, key).await, None);
    assert_eq!(routes.crm.total(), 0);
}

/// A route whose application takes longer than the lease: its attempt outlives the first
/// lease on renewals, no node's scheduler takes its row meanwhile, and it is delivered once.
async fn a_route_slower_than_the_lease_lives_on_renewals(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        long_deliveries(c);
        routes.add(c);
    })
    .await;
    routes.analytics.set(Behaviour::Hang);
    let key = "evt_slow";
    let body = super::event(key, "invoice.paid");
    assert_eq!(app.deliver(key, &body).await.status, 202);
    routes.analytics.wait_for(&TestApp::idem(key), 1).await;
    eventually("the route's attempt to outlive its first lease", || async {
        app.db.lease_state(ANALYTICS, key).await.2 > 2.5
    })
    .await;
    let (status, attempts, _, left) = app.db.lease_state(ANALYTICS, key).await;
    assert_eq!((status.as_str(), attempts), ("in_progress", 1));
    assert!(left > 0.0, "the lease was renewed: {left} s left");
    let other = app
        .second_node(|c| {
            long_deliveries(c);
            routes.add(c);
        })
        .await;
    assert_eq!(other.scheduler.run_once().await.unwrap().taken, 0);
    routes.analytics.release();
    wait_row(&app, ANALYTICS, key, "done").await;
    wait_row(&app, CRM, key, "done").await;
    assert_eq!(count(&routes.analytics, key), 1);
    assert_eq!(count(&routes.crm, key), 1);
    assert_eq!(count(&app.target, key), 1);
}

on_both_stores!(a_route_slower_than_the_lease_lives_on_renewals);
