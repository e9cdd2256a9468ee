//! Operators and routes: an event shows its row on every route; search, pause and resume,
//! one replay and a bulk replay each take a route and touch only it; a replay of one
//! route's dead letter racing the scheduler delivers it once; a job gives old events to a
//! route added later.

use std::time::Duration;

use futures_util::future::join_all;
use hookgate::config::KeepPayload;
use hookgate::secret::Secret;
use serde_json::json;

use super::{count, event, wait_row, Routes, ANALYTICS, CRM};
use crate::helpers::{Backend, Behaviour, PROVIDER};
use crate::operators::common::{admin_app, auth, get_json, post_json, TOKEN};

/// The event's answer lists its routes, each with its own row (or none: a filter did not
/// take it); the search narrowed to a route finds that route's rows only; stats list
/// every route.
async fn an_event_shows_its_routes_and_a_search_takes_one(backend: Backend) {
    let routes = Routes::start().await;
    let app = admin_app(backend, |c| routes.add(c)).await;
    routes.analytics.set(Behaviour::Status(400));
    for (key, kind) in [("evt_oi", "invoice.paid"), ("evt_oc", "customer.created")] {
        assert_eq!(app.deliver(key, &event(key, kind)).await.status, 201);
    }
    wait_row(&app, ANALYTICS, "evt_oc", "dead").await;
    wait_row(&app, ANALYTICS, "evt_oi", "dead").await;
    wait_row(&app, CRM, "evt_oi", "done").await;

    let shown = get_json(&app, "/admin/api/event?provider=stripe&key=evt_oc").await;
    assert_eq!(shown["route"], "main");
    let by_route = |shown: &serde_json::Value| {
        shown["routes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["route"].clone(), r["status"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        by_route(&shown),
        vec![
            (json!("main"), json!("done")),
            (json!("analytics"), json!("dead")),
            (json!("crm"), json!(null)),
        ]
    );
    // The route's own row, by `route` or by its scope: the same answer.
    let analytics = get_json(
        &app,
        "/admin/api/event?provider=stripe&route=analytics&key=evt_oc",
    )
    .await;
    assert_eq!(
        (&analytics["route"], &analytics["status"]),
        (&json!("analytics"), &json!("dead"))
    );
    assert_eq!(
        analytics["attempts"].as_array().unwrap().len(),
        1,
        "{analytics}"
    );
    let scoped = get_json(&app, "/admin/api/events/stripe.analytics/evt_oc").await;
    assert_eq!(scoped["provider"], ANALYTICS);

    let found = get_json(&app, "/admin/api/events?provider=stripe&route=analytics").await;
    let keys: Vec<&str> = found["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "{found}");
    assert!(found["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["provider"] == ANALYTICS));
    let main = get_json(&app, "/admin/api/events?provider=stripe&status=dead").await;
    assert_eq!(main["events"].as_array().unwrap().len(), 0, "{main}");

    let stats = get_json(&app, "/admin/api/stats").await;
    let names: Vec<&str> = stats["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec![PROVIDER, ANALYTICS, CRM]);
}

/// A paused route holds only its own deliveries (the sender is answered by the main
/// route); resumed, it delivers what waited. A paused provider holds every route.
async fn a_route_is_paused_and_resumed_alone(backend: Backend) {
    let routes = Routes::start().await;
    let app = admin_app(backend, |c| routes.add(c)).await;
    let (status, paused) = post_json(
        &app,
        "/admin/api/providers/stripe/pause?route=analytics",
        json!({}),
    )
    .await;
    assert_eq!(
        (status, &paused["provider"]),
        (200, &json!(ANALYTICS)),
        "{paused}"
    );
    let first = app
        .deliver("evt_op", &event("evt_op", "invoice.paid"))
        .await;
    assert_eq!((first.status, first.path.as_str()), (201, "first_run"));
    wait_row(&app, CRM, "evt_op", "done").await;
    app.scheduler.run_once().await.unwrap();
    assert_eq!(
        app.db.status(ANALYTICS, "evt_op").await.as_deref(),
        Some("queued")
    );
    assert_eq!(count(&routes.analytics, "evt_op"), 0);

    let (status, _) = post_json(
        &app,
        "/admin/api/providers/stripe.analytics/resume",
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    wait_row(&app, ANALYTICS, "evt_op", "done").await;
    assert_eq!(count(&routes.analytics, "evt_op"), 1);

    let (status, _) = post_json(&app, "/admin/api/providers/stripe/pause", json!({})).await;
    assert_eq!(status, 200);
    let held = app
        .deliver("evt_oh", &event("evt_oh", "invoice.paid"))
        .await;
    assert_eq!((held.status, held.path.as_str()), (503, "paused"));
    let (unknown, _) = post_json(
        &app,
        "/admin/api/providers/stripe/pause?route=nope",
        json!({}),
    )
    .await;
    assert_eq!(unknown, 404, "a route the provider does not have");
}

/// One route's dead letter replayed while passes of the scheduler run: delivered once more,
/// to that route only; a bulk replay that takes a route replays that route's dead letters.
async fn a_routes_dead_letters_are_replayed_to_it_alone(backend: Backend) {
    let routes = Routes::start().await;
    let app = admin_app(backend, |c| routes.add(c)).await;
    routes.analytics.set(Behaviour::Status(400));
    for key in ["evt_od1", "evt_od2"] {
        assert_eq!(
            app.deliver(key, &event(key, "invoice.paid")).await.status,
            201
        );
        wait_row(&app, ANALYTICS, key, "dead").await;
        wait_row(&app, CRM, key, "done").await;
    }
    routes.analytics.set(Behaviour::Accept);
    let token = auth();
    let headers = [("Authorization", token.as_str())];
    let replay = app.post(
        "/admin/api/event/replay?provider=stripe&route=analytics&key=evt_od1",
        &headers,
        String::new(),
    );
    let passes = join_all((0..4).map(|_| app.scheduler.run_once()));
    let (replayed, _) = futures_util::join!(replay, passes);
    assert_eq!(replayed.status, 200, "{replayed:?}");
    wait_row(&app, ANALYTICS, "evt_od1", "done").await;
    app.scheduler.run_once().await.unwrap();
    assert_eq!(
        count(&routes.analytics, "evt_od1"),
        2,
        "dead once, replayed once"
    );

    let request =
        json!({ "filter": { "provider": "stripe", "status": "dead" }, "route": "analytics" });
    let (_, plan) = post_json(&app, "/admin/api/replays/plan", request.clone()).await;
    assert_eq!(plan["count"], 1, "{plan}");
    let (status, job) = post_json(&app, "/admin/api/replays", request).await;
    assert_eq!(status, 201, "{job}");
    app.operator_work.run_once().await.unwrap();
    wait_row(&app, ANALYTICS, "evt_od2", "done").await;
    assert_eq!(count(&routes.analytics, "evt_od2"), 2);
    for key in ["evt_od1", "evt_od2"] {
        assert_eq!(count(&app.target, key), 1, "main, {key}");
        assert_eq!(count(&routes.crm, key), 1, "crm, {key}");
    }
}

/// The command line: `events show` lists the event's routes; `dead replay` of a route's
/// scope replays that route's dead letter to its own target, alone.
async fn the_command_line_shows_routes_and_replays_one(backend: Backend) {
    let routes = Routes::start().await;
    let app = admin_app(backend, |c| routes.add(c)).await;
    routes.crm.set(Behaviour::Status(400));
    let key = "evt_cli";
    assert_eq!(
        app.deliver(key, &event(key, "invoice.paid")).await.status,
        201
    );
    wait_row(&app, CRM, key, "dead").await;
    wait_row(&app, ANALYTICS, key, "done").await;

    let out = app
        .run_cli_with(&["events", "show", PROVIDER, key], &routes.toml())
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let statuses: Vec<_> = shown["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["route"].as_str().unwrap().to_owned(), r["status"].clone()))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("main".to_owned(), json!("done")),
            ("analytics".to_owned(), json!("done")),
            ("crm".to_owned(), json!("dead")),
        ]
    );

    routes.crm.set(Behaviour::Accept);
    let out = app
        .run_cli_with(&["dead", "replay", CRM, key], &routes.toml())
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(app.db.status(CRM, key).await.as_deref(), Some("done"));
    assert_eq!(count(&routes.crm, key), 2);
    assert_eq!(count(&routes.analytics, key), 1);
    assert_eq!(count(&app.target, key), 1);
}

/// A route added after events were done gets them only from an operator's job to that
/// route: each event its filter takes once (the job run by two nodes at once, the scheduler
/// delivering beside it), none it does not take, nothing to the other routes; a second job
/// finds the route has them; a job to a route that is not one is refused.
async fn a_job_gives_old_events_to_a_route_added_later(backend: Backend) {
    let routes = Routes::start().await;
    let keep = |c: &mut hookgate::config::Config| {
        c.providers[0].keep_payload = KeepPayload::Always;
        c.admin.token = Some(Secret::new(TOKEN));
        // The nodes' own passes leave the job to the test's.
        c.queue.poll_interval = Duration::from_secs(3600);
    };
    let app = admin_app(backend, keep).await;
    let old = [
        ("evt_g1", "invoice.paid"),
        ("evt_g2", "customer.created"),
        ("evt_g3", "invoice.payment_failed"),
    ];
    for (key, kind) in old {
        assert_eq!(app.deliver(key, &event(key, kind)).await.status, 201);
        app.wait_status(key, "done").await;
    }
    let routed = app
        .second_node(|c| {
            keep(c);
            routes.add(c);
        })
        .await;
    let other = app
        .second_node(|c| {
            keep(c);
            routes.add(c);
        })
        .await;
    let request = json!({ "filter": { "provider": PROVIDER }, "to_route": "crm", "rate": 1000 });
    let (_, plan) = post_json(&routed, "/admin/api/replays/plan", request.clone()).await;
    assert_eq!(plan["count"], 3, "{plan}");
    let (status, job) = post_json(&routed, "/admin/api/replays", request.clone()).await;
    assert_eq!(status, 201, "{job}");
    // Both nodes' passes at once (a node's pass at its start may hold the job instead).
    let (a, b, _) = futures_util::join!(
        routed.operator_work.run_once(),
        other.operator_work.run_once(),
        join_all((0..4).map(|_| routed.scheduler.run_once())),
    );
    assert!(!(a.unwrap() && b.unwrap()), "one node ran the job");
    let id = job["id"].as_i64().unwrap();
    let path = format!("/admin/api/replays/{id}");
    crate::helpers::eventually("the job to end", || async {
        get_json(&routed, &path).await["status"] == "done"
    })
    .await;
    let job = get_json(&routed, &path).await;
    assert_eq!(job["replayed"], 2, "{job}");
    let outcome = |key: &str| {
        let items = job["items"].as_array().unwrap();
        let item = items.iter().find(|i| i["key"] == key).unwrap();
        item["outcome"].as_str().unwrap().to_owned()
    };
    assert_eq!(outcome("evt_g1"), "queued");
    assert_eq!(outcome("evt_g2"), "skipped");
    assert_eq!(outcome("evt_g3"), "queued");
    wait_row(&routed, CRM, "evt_g1", "done").await;
    wait_row(&routed, CRM, "evt_g3", "done").await;
    join_all((0..4).map(|_| routed.scheduler.run_once())).await;
    assert_eq!(count(&routes.crm, "evt_g1"), 1);
    assert_eq!(count(&routes.crm, "evt_g3"), 1);
    assert_eq!(count(&routes.crm, "evt_g2"), 0);
    assert_eq!(
        routes.analytics.total(),
        0,
        "the job gave nothing to analytics"
    );
    assert_eq!(app.db.status(CRM, "evt_g2").await, None);
    for (key, _) in old {
        assert_eq!(app.target.count(&crate::helpers::TestApp::idem(key)), 1);
    }

    // Again: the route has them; nothing is delivered twice.
    let (status, again) = post_json(&routed, "/admin/api/replays", request).await;
    assert_eq!(status, 201, "{again}");
    assert!(routed.operator_work.run_once().await.unwrap());
    let again = get_json(&routed, &format!("/admin/api/replays/{}", again["id"])).await;
    assert_eq!(again["replayed"], 0, "{again}");
    routed.scheduler.run_once().await.unwrap();
    assert_eq!(count(&routes.crm, "evt_g1"), 1);

    // Refused, with nothing written: no such route, no provider, the filter's own route.
    for bad in [
        json!({ "filter": { "provider": PROVIDER }, "to_route": "nope" }),
        json!({ "filter": {}, "to_route": "crm" }),
        json!({ "filter": { "provider": PROVIDER }, "to_route": "main" }),
    ] {
        let (status, answer) = post_json(&routed, "/admin/api/replays", bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {answer}");
    }
    let jobs = get_json(&routed, "/admin/api/replays").await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 2);
}

on_both_stores!(
    a_job_gives_old_events_to_a_route_added_later,
    the_command_line_shows_routes_and_replays_one,
    an_event_shows_its_routes_and_a_search_takes_one,
    a_route_is_paused_and_resumed_alone,
    a_routes_dead_letters_are_replayed_to_it_alone,
);
