//! Routes: one event, several applications, each (event, route) pair with the whole
//! promise on its own — its own row, claim, attempts and dead letter.
//!
//! * `delivery.rs` — each route gets each event once, under parallel redeliveries, in
//!   either mode; a failing route is retried alone; filters choose the routes.
//! * `changes.rs` — routes added and removed under existing rows; their config rules.
//! * `console.rs` — the console shows an event's routes, in a real browser.
//! * `operators.rs` — an event shows its routes; search, pauses and replays take a route.
//! * `redeliveries.rs` — a redelivery whose headers or body would pick other routes changes
//!   none of the event's routes.
//! * `resilience.rs` — a node killed mid-delivery of a route, a route slower than the lease.

mod changes;
mod console;
mod delivery;
mod operators;
mod redeliveries;
mod resilience;

use hookgate::config::{Config, TargetConfig};
use hookgate::filter::{Condition, Filter};

use crate::helpers::{TestApp, TestTarget};

/// The scope of the `analytics` route's rows.
const ANALYTICS: &str = "stripe.analytics";
/// The scope of the `crm` route's rows.
const CRM: &str = "stripe.crm";

/// Two more applications beside the test app's own target (the main route): `analytics`
/// takes every event, `crm` only `invoice.*` ones.
struct Routes {
    analytics: TestTarget,
    crm: TestTarget,
}

impl Routes {
    async fn start() -> Self {
        Self {
            analytics: TestTarget::start().await,
            crm: TestTarget::start().await,
        }
    }

    /// Both routes as the provider's `routes` in a config file.
    fn toml(&self) -> String {
        format!(
            r#"routes = [{{ name = "analytics", url = "{}" }},
                         {{ name = "crm", url = "{}", filter = {{ json = "/type", prefix = "invoice." }} }}]"#,
            self.analytics.url, self.crm.url
        )
    }

    /// Adds both routes to the provider.
    fn add(&self, c: &mut Config) {
        let p = &mut c.providers[0];
        p.routes
            .push(route(&p.target, "analytics", &self.analytics, None));
        p.routes.push(route(
            &p.target,
            "crm",
            &self.crm,
            Some(prefix("/type", "invoice.")),
        ));
    }
}

/// A route like `main` (its timeout), named `name`, delivering to `target`.
fn route(
    main: &TargetConfig,
    name: &str,
    target: &TestTarget,
    filter: Option<Filter>,
) -> TargetConfig {
    TargetConfig {
        name: Some(name.into()),
        url: target.url.clone(),
        filter,
        ..main.clone()
    }
}

/// A filter: the JSON value at `pointer` starts with `prefix`.
fn prefix(pointer: &str, prefix: &str) -> Filter {
    Filter {
        all: vec![Condition {
            json: Some(pointer.into()),
            prefix: Some(prefix.into()),
            ..Condition::default()
        }],
    }
}

/// An event with this id and type.
fn event(key: &str, kind: &str) -> String {
    format!(r#"{{"id":"{key}","type":"{kind}"}}"#)
}

/// How many times `target` received `key` (of the provider, whatever the route).
fn count(target: &TestTarget, key: &str) -> usize {
    target.count(&TestApp::idem(key))
}

/// Waits until the row of `key` in `scope` is `status`.
async fn wait_row(app: &TestApp, scope: &str, key: &str, status: &str) {
    crate::helpers::eventually(&format!("{scope}:{key} to be {status}"), || async {
        app.db.status(scope, key).await.as_deref() == Some(status)
    })
    .await;
}
