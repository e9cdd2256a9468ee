//! The console shows an event's routes, in a real browser: the event page lists each route
//! with its own row (or that it did not take the event), a route's link opens that route's
//! row, the overview has a card per route, and a job to a route names its route.

use std::path::Path;

use crate::helpers::webdriver::{self, Browser};
use crate::helpers::{Backend, Behaviour};
use crate::operators::common::{admin_app, post_json, TOKEN};

use super::{event, wait_row, Routes, ANALYTICS, CRM};

#[actix_web::test]
async fn the_console_shows_an_events_routes() {
    if webdriver::skip_without_browser() {
        return;
    }
    let routes = Routes::start().await;
    let app = admin_app(Backend::Postgres, |c| routes.add(c)).await;
    routes.analytics.set(Behaviour::Status(400));
    let key = "evt_console";
    assert_eq!(
        app.deliver(key, &event(key, "customer.created"))
            .await
            .status,
        201
    );
    wait_row(&app, ANALYTICS, key, "dead").await;

    let browser = Browser::start(Path::new(env!("CARGO_TARGET_TMPDIR"))).await;
    let console = format!("{}/admin/", app.address);
    browser.goto(&console).await;
    browser.type_into("#token", TOKEN).await;
    browser.click("#login-button").await;
    browser.wait_text("#overview h1", "Overview").await;
    browser
        .wait_count(&format!("section.provider[data-provider='{ANALYTICS}']"), 1)
        .await;
    browser
        .wait_count(&format!("section.provider[data-provider='{CRM}']"), 1)
        .await;

    browser
        .goto(&format!("{console}#/event/stripe/{key}"))
        .await;
    browser.wait_count("#routes tr[data-route]", 3).await;
    browser
        .wait_text("#routes tr[data-route=main]", "done")
        .await;
    browser
        .wait_text("#routes tr[data-route=analytics]", "dead")
        .await;
    browser
        .wait_text("#routes tr[data-route=crm]", "not taken")
        .await;
    browser.click("#routes tr[data-route=analytics] a").await;
    browser.wait_text("#event-row", "analytics").await;
    browser.wait_text("#event-row", "dead").await;
    browser.wait_count("#replay:not([disabled])", 1).await;

    // A job to a route is listed with the route its events go to.
    let request = serde_json::json!({ "filter": { "provider": "stripe" }, "to_route": "crm" });
    let (status, job) = post_json(&app, "/admin/api/replays", request).await;
    assert_eq!(status, 201, "{job}");
    browser.goto(&format!("{console}#/dead")).await;
    browser
        .wait_text("#jobs", "to route crm: provider=stripe")
        .await;
}
