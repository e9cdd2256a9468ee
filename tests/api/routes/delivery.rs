//! Each route gets each event once: under parallel redeliveries in sync and queue mode, with
//! one route failing (retried alone, the others not called again), with the answering
//! (main) route failing (the sender's redelivery retries only it), and with filters choosing
//! which routes get an event.

use futures_util::future::join_all;
use hookgate::claim::Mode;

use super::{count, event, prefix, wait_row, Routes, ANALYTICS, CRM};
use crate::helpers::{spawn_app_on, Backend, Behaviour, PROVIDER};

/// Parallel deliveries of two events (20 each): every route that accepts an event gets it
/// exactly once, under the provider's key (`stripe:evt_…`, whatever the route); `crm` gets
/// only the invoice, and has no row for the other.
async fn parallel_redeliveries_reach_each_route_once(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| routes.add(c)).await;
    let deliveries = (0..40).map(|i| {
        let (key, kind) = match i % 2 {
            0 => ("evt_ri", "invoice.paid"),
            _ => ("evt_rc", "customer.created"),
        };
        let body = event(key, kind);
        let app = &app;
        async move { (key, app.deliver(key, &body).await) }
    });
    let answers = join_all(deliveries).await;
    for key in ["evt_ri", "evt_rc"] {
        let first = answers
            .iter()
            .filter(|(k, a)| *k == key && a.path == "first_run")
            .count();
        assert_eq!(first, 1, "one first run of {key}: {answers:?}");
    }
    for (key, a) in &answers {
        match (a.status, a.path.as_str()) {
            (201, "first_run" | "duplicate_done") | (409, "in_progress_elsewhere") => {}
            _ => panic!("unexpected answer for {key}: {a:?}"),
        }
    }
    for key in ["evt_ri", "evt_rc"] {
        wait_row(&app, ANALYTICS, key, "done").await;
    }
    wait_row(&app, CRM, "evt_ri", "done").await;
    for key in ["evt_ri", "evt_rc"] {
        assert_eq!(count(&app.target, key), 1, "main, {key}");
        assert_eq!(count(&routes.analytics, key), 1, "analytics, {key}");
    }
    assert_eq!(count(&routes.crm, "evt_ri"), 1);
    assert_eq!(routes.crm.total(), 1, "crm takes invoices only");
    assert_eq!(app.db.status(CRM, "evt_rc").await, None, "no crm row");
}

/// A route that fails is retried on its own schedule; the sender's redelivery answers from
/// the main route's row and calls nobody again.
async fn a_failing_route_is_retried_alone(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        routes.add(c);
        c.retry.base = std::time::Duration::from_secs(600);
        c.retry.cap = std::time::Duration::from_secs(1200);
    })
    .await;
    routes.analytics.set(Behaviour::Status(500));
    let body = event("evt_rf", "invoice.paid");
    let first = app.deliver("evt_rf", &body).await;
    assert_eq!((first.status, first.path.as_str()), (201, "first_run"));
    wait_row(&app, ANALYTICS, "evt_rf", "failed").await;
    wait_row(&app, CRM, "evt_rf", "done").await;
    let again = app.deliver("evt_rf", &body).await;
    assert_eq!((again.status, again.path.as_str()), (201, "duplicate_done"));
    assert_eq!(
        app.db.status(ANALYTICS, "evt_rf").await.as_deref(),
        Some("failed")
    );

    routes.analytics.set(Behaviour::Accept);
    app.scheduler.by_hand().await;
    app.db.make_due(ANALYTICS, "evt_rf").await;
    app.scheduler.run_once().await.unwrap();
    wait_row(&app, ANALYTICS, "evt_rf", "done").await;
    assert_eq!(
        count(&routes.analytics, "evt_rf"),
        2,
        "failed once, then delivered"
    );
    assert_eq!(count(&app.target, "evt_rf"), 1, "main not called again");
    assert_eq!(count(&routes.crm, "evt_rf"), 1, "crm not called again");
}

/// The answering route fails: the other routes' rows were written with its claim and are
/// delivered once; the sender's redelivery retries only the answering route.
async fn a_redelivery_retries_only_the_answering_route(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| routes.add(c)).await;
    app.target.set(Behaviour::Status(500));
    let body = event("evt_ra", "invoice.paid");
    let failed = app.deliver("evt_ra", &body).await;
    assert_eq!(failed.path, "first_run", "{failed:?}");
    assert!(failed.status >= 500, "{failed:?}");
    wait_row(&app, ANALYTICS, "evt_ra", "done").await;
    wait_row(&app, CRM, "evt_ra", "done").await;

    app.target.set(Behaviour::Accept);
    let retried = app.deliver("evt_ra", &body).await;
    assert_eq!(
        (retried.status, retried.path.as_str()),
        (201, "retry_after_failure"),
        "{retried:?}"
    );
    assert_eq!(count(&app.target, "evt_ra"), 2);
    assert_eq!(count(&routes.analytics, "evt_ra"), 1);
    assert_eq!(count(&routes.crm, "evt_ra"), 1);
}

/// Queue mode: every route's row is written before the 202; parallel redeliveries reach
/// each route once.
async fn a_queue_provider_queues_every_route_before_its_202(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        c.providers[0].mode = Some(Mode::Queue);
        routes.add(c);
    })
    .await;
    let body = event("evt_rq", "invoice.paid");
    let answers = join_all((0..20).map(|_| app.deliver("evt_rq", &body))).await;
    let queued = answers.iter().filter(|a| a.path == "queued").count();
    assert_eq!(queued, 1, "{answers:?}");
    for a in &answers {
        assert!(matches!(a.status, 202 | 201 | 409), "{a:?}");
    }
    for scope in [PROVIDER, ANALYTICS, CRM] {
        wait_row(&app, scope, "evt_rq", "done").await;
    }
    assert_eq!(count(&app.target, "evt_rq"), 1);
    assert_eq!(count(&routes.analytics, "evt_rq"), 1);
    assert_eq!(count(&routes.crm, "evt_rq"), 1);
}

/// The main route's filter does not take an event that another route does: the main
/// route's row records the event (`filtered`, done at once, nothing delivered to it) and
/// answers the sender 202 — crm's row was written with that claim and hookgate delivers
/// it; a redelivery is a duplicate of the record. An event no route takes is `filtered`
/// too, answered 200.
async fn filters_choose_the_routes_and_the_main_route_records_the_event(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        routes.add(c);
        c.providers[0].target.filter = Some(prefix("/type", "customer."));
        c.providers[0].routes[0].filter = Some(prefix("/type", "charge."));
    })
    .await;
    let invoice = app
        .deliver("evt_fi", &event("evt_fi", "invoice.paid"))
        .await;
    assert_eq!(
        (invoice.status, invoice.path.as_str(), invoice.body.as_str()),
        (202, "filtered", r#"{"status":"queued"}"#),
        "crm has it, hookgate delivers it: {invoice:?}"
    );
    wait_row(&app, CRM, "evt_fi", "done").await;
    assert_eq!(count(&routes.crm, "evt_fi"), 1);
    assert_eq!(
        app.db.status(PROVIDER, "evt_fi").await.as_deref(),
        Some("done"),
        "the main route's row is the event's record"
    );
    assert_eq!(app.db.status(ANALYTICS, "evt_fi").await, None);
    let again = app
        .deliver("evt_fi", &event("evt_fi", "invoice.paid"))
        .await;
    assert_eq!((again.status, again.path.as_str()), (202, "duplicate_done"));

    let nobody = app.deliver("evt_fn", &event("evt_fn", "payout.paid")).await;
    assert_eq!(
        (nobody.status, nobody.path.as_str()),
        (200, "filtered"),
        "{nobody:?}"
    );
    assert_eq!(
        app.db.status(PROVIDER, "evt_fn").await.as_deref(),
        Some("done")
    );
    assert_eq!(app.db.status(CRM, "evt_fn").await, None);
    assert_eq!(
        app.target.total() + routes.analytics.total() + routes.crm.total(),
        1
    );
}

/// Two nodes on one store, parallel redeliveries of each event to both: every route gets
/// each event once, whichever node won its claim.
async fn two_nodes_deliver_each_route_once(backend: Backend) {
    let routes = Routes::start().await;
    let a = spawn_app_on(backend, |c| routes.add(c)).await;
    let b = a.second_node(|c| routes.add(c)).await;
    let keys: Vec<String> = (0..6).map(|n| format!("evt_2n{n}")).collect();
    let deliveries = keys.iter().flat_map(|key| {
        let body = event(key, "invoice.paid");
        [&a, &b, &a, &b].map(move |node| {
            let body = body.clone();
            async move { node.deliver(key, &body).await }
        })
    });
    let answers = join_all(deliveries).await;
    let first = answers.iter().filter(|a| a.path == "first_run").count();
    assert_eq!(first, keys.len(), "{answers:?}");
    for key in &keys {
        wait_row(&a, ANALYTICS, key, "done").await;
        wait_row(&a, CRM, key, "done").await;
        assert_eq!(count(&a.target, key), 1, "main, {key}");
        assert_eq!(count(&routes.analytics, key), 1, "analytics, {key}");
        assert_eq!(count(&routes.crm, key), 1, "crm, {key}");
    }
}

on_both_stores!(
    two_nodes_deliver_each_route_once,
    parallel_redeliveries_reach_each_route_once,
    a_failing_route_is_retried_alone,
    a_redelivery_retries_only_the_answering_route,
    a_queue_provider_queues_every_route_before_its_202,
    filters_choose_the_routes_and_the_main_route_records_the_event,
);
