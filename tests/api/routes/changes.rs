//! Routes added and removed under existing rows: a route added later gets no event already
//! done (a redelivery of one is a duplicate), a removed route's undelivered rows become
//! `provider_removed` dead letters after the grace; routes written wrong stop the node,
//! named, and `check-config` prints the routes.

use std::sync::Arc;
use std::time::Duration;

use hookgate::config::Config;
use hookgate::metrics::Metrics;
use hookgate::retention::Sweeper;

use super::{count, event, wait_row, Routes, ANALYTICS, CRM};
use crate::helpers::{spawn_app_on, Backend, Behaviour, PROVIDER};

/// An event done before its provider gained routes: its redelivery to a node that has them
/// is a duplicate, and the new routes get nothing (an operator's replay is how they would).
async fn a_route_added_later_gets_no_event_already_done(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |_| {}).await;
    let body = event("evt_old", "invoice.paid");
    assert_eq!(app.deliver("evt_old", &body).await.status, 201);
    app.wait_status("evt_old", "done").await;
    let routed = app.second_node(|c| routes.add(c)).await;
    let again = routed.deliver("evt_old", &body).await;
    assert_eq!((again.status, again.path.as_str()), (201, "duplicate_done"));
    let new = routed
        .deliver("evt_new", &event("evt_new", "invoice.paid"))
        .await;
    assert_eq!(new.path, "first_run");
    wait_row(&routed, ANALYTICS, "evt_new", "done").await;
    wait_row(&routed, CRM, "evt_new", "done").await;
    assert_eq!(app.db.status(ANALYTICS, "evt_old").await, None);
    assert_eq!(routes.analytics.total() + routes.crm.total(), 2);
    assert_eq!(count(&routes.analytics, "evt_new"), 1);
}

/// A route removed from every node: its rows not yet delivered become dead letters that say
/// so once the grace has passed, as a removed provider's do; the other routes' rows stay.
async fn a_removed_routes_rows_become_dead_letters(backend: Backend) {
    let routes = Routes::start().await;
    let app = spawn_app_on(backend, |c| {
        routes.add(c);
        c.retry.base = Duration::from_secs(600);
        c.retry.cap = Duration::from_secs(1200);
    })
    .await;
    routes.analytics.set(Behaviour::Status(500));
    let body = event("evt_gone", "invoice.paid");
    assert_eq!(app.deliver("evt_gone", &body).await.status, 201);
    wait_row(&app, ANALYTICS, "evt_gone", "failed").await;
    app.db.make_due(ANALYTICS, "evt_gone").await;
    let sweeper = |scopes: &[&str]| {
        let horizons = scopes
            .iter()
            .map(|p| ((*p).to_owned(), Duration::from_secs(3600)))
            .collect();
        Sweeper::new(
            app.store.clone(),
            hookgate::config::RetentionConfig::default(),
            Arc::new(Metrics::new()),
            hookgate::logging::discard(),
        )
        .with_horizons(horizons)
        .with_orphan_grace(Duration::ZERO)
    };
    assert_eq!(
        sweeper(&[PROVIDER, ANALYTICS, CRM])
            .abandon_once()
            .await
            .unwrap(),
        0
    );
    // The config without `analytics`: its row is the only one orphaned.
    assert_eq!(sweeper(&[PROVIDER, CRM]).abandon_once().await.unwrap(), 1);
    let dead = app
        .store
        .dead_letters(Some(ANALYTICS), None, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].dead_reason.as_deref(), Some("provider_removed"));
    assert_eq!(
        app.db.status(CRM, "evt_gone").await.as_deref(),
        Some("done")
    );
    assert_eq!(
        app.db.status(PROVIDER, "evt_gone").await.as_deref(),
        Some("done")
    );
}

on_both_stores!(
    a_route_added_later_gets_no_event_already_done,
    a_removed_routes_rows_become_dead_letters,
);

/// Routes written wrong stop the node with the key to change; routes written right are
/// what `check-config` prints.
#[test]
fn routes_written_wrong_stop_the_node_naming_them() {
    let config = |routes: &str| {
        Config::from_toml(&format!(
            r#"
            [[providers]]
            name = "stripe"
            preset = "none"
            key = [{{ header = "X-Id" }}]
            target = {{ url = "http://127.0.0.1:9/" }}
            {routes}
            "#
        ))
    };
    let error = |routes: &str| config(routes).unwrap_err().to_string();
    let unnamed = error(r#"routes = [{ url = "http://127.0.0.1:10/" }]"#);
    assert!(
        unnamed.contains("providers.stripe.routes[0]: name is unique"),
        "{unnamed}"
    );
    let twice = error(
        r#"routes = [{ name = "a", url = "http://127.0.0.1:10/" },
                     { name = "a", url = "http://127.0.0.1:11/" }]"#,
    );
    assert!(
        twice.contains("providers.stripe.routes.a: name is unique"),
        "{twice}"
    );
    let main = error(r#"routes = [{ name = "main", url = "http://127.0.0.1:10/" }]"#);
    assert!(main.contains("routes.main: name is unique"), "{main}");
    let dotted = error(r#"routes = [{ name = "a.b", url = "http://127.0.0.1:10/" }]"#);
    assert!(
        dotted.contains("routes.a.b: name is unique and URL-safe"),
        "{dotted}"
    );
    let bad_url = error(r#"routes = [{ name = "a", url = "ftp://x/" }]"#);
    assert!(
        bad_url.contains("providers.stripe.routes.a.url is http"),
        "{bad_url}"
    );
    let bad_filter = error(
        r#"routes = [{ name = "a", url = "http://127.0.0.1:10/", filter = { json = "t", equals = 1 } }]"#,
    );
    assert!(
        bad_filter.contains("providers.stripe.routes.a.filter"),
        "{bad_filter}"
    );

    let good = config(
        r#"routes = [{ name = "analytics", url = "http://127.0.0.1:10/" },
                     { name = "crm", url = "http://127.0.0.1:11/", filter = { json = "/type", prefix = "invoice." } }]"#,
    )
    .expect("good routes");
    let printed: Vec<String> = good.rules().iter().map(ToString::to_string).collect();
    let line = |what: &str| {
        printed
            .iter()
            .find(|r| r.contains(what))
            .unwrap_or_else(|| panic!("no line for {what}: {printed:#?}"))
            .clone()
    };
    assert!(
        line("providers.stripe: routes").contains("also delivered to analytics, crm"),
        "{printed:#?}"
    );
    assert!(
        line("routes.crm.filter").contains(r#"json /type starts with "invoice.""#),
        "{printed:#?}"
    );
}
