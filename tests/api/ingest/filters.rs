//! A target's `filter`: an event it does not accept is answered 200 `filtered`, recorded
//! once, delivered nowhere, and its redeliveries are duplicates — in parallel, from the row,
//! in queue mode and under a pause; a filter written wrong stops the node, named.

use futures_util::future::join_all;
use hookgate::claim::Mode;
use hookgate::config::Config;
use hookgate::filter::{Condition, Filter, Scalar};
use hookgate::secret::Secret;

use crate::helpers::{bearer, spawn_app_on, Backend, TestApp, PROVIDER};

const FILTERED: &str = r#"{"status":"filtered"}"#;

/// The target takes only `invoice.paid` and `invoice.payment_failed`.
fn invoices_only(c: &mut Config) {
    c.providers[0].target.filter = Some(Filter {
        all: vec![Condition {
            json: Some("/type".into()),
            one_of: Some(vec![
                Scalar::Str("invoice.paid".into()),
                Scalar::Str("invoice.payment_failed".into()),
            ]),
            ..Condition::default()
        }],
    });
}

fn event(key: &str, kind: &str) -> String {
    format!(r#"{{"id":"{key}","type":"{kind}"}}"#)
}

async fn a_filtered_event_is_recorded_once_and_delivered_nowhere(backend: Backend) {
    // No done cache: every redelivery is answered from the row.
    let app = spawn_app_on(backend, |c| {
        invoices_only(c);
        c.cache.capacity = 0;
    })
    .await;
    let first = app
        .deliver("evt_f1", &event("evt_f1", "invoice.created"))
        .await;
    assert_eq!(
        (first.status, first.path.as_str()),
        (200, "filtered"),
        "{first:?}"
    );
    assert_eq!(first.body, FILTERED);
    assert_eq!(first.attempt, Some(1));
    app.wait_status("evt_f1", "done").await;
    // The row tells it whole, as a plain first run's does: its path, no history row.
    let id = hookgate::key::EventId::new(PROVIDER, "evt_f1");
    let row = app.store.lookup(&id).await.unwrap().unwrap();
    assert_eq!(row.last_path, Some(hookgate::claim::Path::Filtered));
    let history = app.store.operator().history(&id, None, 10).await.unwrap();
    assert!(history.attempts.is_empty(), "{history:?}");
    let again = app
        .deliver("evt_f1", &event("evt_f1", "invoice.created"))
        .await;
    assert_eq!((again.status, again.path.as_str()), (200, "duplicate_done"));
    assert_eq!(again.body, FILTERED);
    assert_eq!(app.target.count(&TestApp::idem("evt_f1")), 0);

    let paid = app
        .deliver("evt_f2", &event("evt_f2", "invoice.paid"))
        .await;
    assert_eq!(
        (paid.status, paid.path.as_str()),
        (201, "first_run"),
        "{paid:?}"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_f2")), 1);
    // A body that is not JSON has no `/type`: the filter does not accept it.
    let other = app.deliver("evt_f3", "not json at all").await;
    assert_eq!(
        (other.status, other.path.as_str()),
        (200, "filtered"),
        "{other:?}"
    );
    assert_eq!(app.target.total(), 1);
}

async fn parallel_deliveries_of_filtered_and_accepted_keys_each_count_once(backend: Backend) {
    let app = spawn_app_on(backend, invoices_only).await;
    let deliveries = (0..40).map(|i| {
        let (key, kind) = match i % 2 {
            0 => ("evt_pf", "customer.created"),
            _ => ("evt_pa", "invoice.payment_failed"),
        };
        let body = event(key, kind);
        let app = &app;
        async move { (key, app.deliver(key, &body).await) }
    });
    let answers = join_all(deliveries).await;
    let won = |key: &str, path: &str| {
        answers
            .iter()
            .filter(|(k, a)| *k == key && a.path == path)
            .count()
    };
    assert_eq!(won("evt_pf", "filtered"), 1, "{answers:?}");
    assert_eq!(won("evt_pa", "first_run"), 1, "{answers:?}");
    for (key, a) in &answers {
        match (a.status, a.path.as_str()) {
            (200, "filtered" | "duplicate_done") if *key == "evt_pf" => {
                assert_eq!(a.body, FILTERED)
            }
            (201, "first_run" | "duplicate_done") if *key == "evt_pa" => {}
            (409, "in_progress_elsewhere") => {}
            _ => panic!("unexpected answer for {key}: {a:?}"),
        }
    }
    assert_eq!(app.target.count(&TestApp::idem("evt_pf")), 0);
    assert_eq!(app.target.count(&TestApp::idem("evt_pa")), 1);
}

/// A queue-mode provider answers a filtered event 200 at once, never 202: nothing is
/// queued for a target that does not want it.
async fn a_queue_provider_answers_a_filtered_event_at_once(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        c.providers[0].mode = Some(Mode::Queue);
        c.queue.poll_interval = std::time::Duration::from_secs(3600);
        c.providers[0].target.filter = Some(Filter {
            all: vec![Condition {
                header: Some("X-Event".into()),
                equals: Some(Scalar::Str("push".into())),
                ..Condition::default()
            }],
        });
    })
    .await;
    let post = |key: &'static str, kind: &'static str| {
        let path = format!("/webhooks/{PROVIDER}");
        let app = &app;
        async move {
            let headers = [("X-Idempotency-Key", key), ("X-Event", kind)];
            app.post(&path, &headers, "{}".into()).await
        }
    };
    let ping = post("evt_qping", "ping").await;
    assert_eq!(
        (ping.status, ping.path.as_str()),
        (200, "filtered"),
        "{ping:?}"
    );
    let push = post("evt_qpush", "push").await;
    assert_eq!(
        (push.status, push.path.as_str()),
        (202, "queued"),
        "{push:?}"
    );
    // Queue mode delivers a new event at once; a scheduler pass would take what is left.
    app.scheduler.run_once().await.unwrap();
    app.wait_status("evt_qpush", "done").await;
    assert_eq!(app.target.count(&TestApp::idem("evt_qpush")), 1);
    assert_eq!(app.target.count(&TestApp::idem("evt_qping")), 0);
    let again = post("evt_qping", "ping").await;
    assert_eq!((again.status, again.path.as_str()), (200, "duplicate_done"));
    assert_eq!(app.target.total(), 1);
}

/// An operator's pause holds every delivery of a sync provider (503 `paused`), filtered or
/// not: whether a delivery of a known key is filtered is its row's to say (a retry of a
/// failed event the main route has is delivered there, whatever the filter says of it).
/// Once resumed, the filtered event is recorded, delivered nowhere.
async fn a_pause_holds_every_delivery_filtered_or_not(backend: Backend) {
    const TOKEN: &str = "filters-admin-token";
    let app = spawn_app_on(backend, |c| {
        invoices_only(c);
        c.admin.token = Some(Secret::new(TOKEN));
    })
    .await;
    let auth = bearer(TOKEN);
    let pause = format!("/admin/api/providers/{PROVIDER}/pause");
    let paused = app
        .post(&pause, &[("Authorization", &auth)], String::new())
        .await;
    assert_eq!(paused.status, 200, "{paused:?}");
    let held = app
        .deliver("evt_hp", &event("evt_hp", "invoice.paid"))
        .await;
    assert_eq!(
        (held.status, held.path.as_str()),
        (503, "paused"),
        "{held:?}"
    );
    let skipped = event("evt_hs", "charge.refunded");
    let also = app.deliver("evt_hs", &skipped).await;
    assert_eq!(
        (also.status, also.path.as_str()),
        (503, "paused"),
        "{also:?}"
    );
    let resume = format!("/admin/api/providers/{PROVIDER}/resume");
    let resumed = app
        .post(&resume, &[("Authorization", &auth)], String::new())
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let filtered = app.deliver("evt_hs", &skipped).await;
    assert_eq!(
        (filtered.status, filtered.path.as_str()),
        (200, "filtered"),
        "{filtered:?}"
    );
    assert_eq!(app.target.total(), 0);
}

on_both_stores!(
    a_filtered_event_is_recorded_once_and_delivered_nowhere,
    parallel_deliveries_of_filtered_and_accepted_keys_each_count_once,
    a_queue_provider_answers_a_filtered_event_at_once,
    a_pause_holds_every_delivery_filtered_or_not,
);

/// A filter written wrong stops the node with the key to change and what is wrong; one
/// written right is what `check-config` prints.
#[test]
fn a_filter_written_wrong_stops_the_node_naming_it() {
    let config = |filter: &str| {
        Config::from_toml(&format!(
            r#"
            [[providers]]
            name = "gh"
            preset = "none"
            key = [{{ header = "X-Id" }}]
            target = {{ url = "http://127.0.0.1:9/", filter = {filter} }}
            "#
        ))
    };
    let error = config(r#"{ json = "type", equals = "push" }"#)
        .unwrap_err()
        .to_string();
    assert!(error.contains("providers.gh.target.filter"), "{error}");
    assert!(error.contains("`/type`"), "{error}");
    let error = config(r#"{ header = "X-Event", in = [] }"#)
        .unwrap_err()
        .to_string();
    assert!(error.contains("1 to 64"), "{error}");
    let error = config(r#"{ header = "X-Event", is = "push" }"#)
        .unwrap_err()
        .to_string();
    assert!(error.contains("found `is`"), "{error}");
    assert!(error.contains("target.filter"), "{error}");

    let good = config(
        r#"[{ header = "X-Event", in = ["push"] }, { json = "/ref", prefix = "refs/heads/" }]"#,
    )
    .expect("a good filter");
    let printed = good
        .rules()
        .iter()
        .map(ToString::to_string)
        .find(|r| r.contains("target.filter"))
        .expect("check-config's line for the filter");
    assert!(
        printed.contains(r#"header X-Event in ["push"] and json /ref starts with "refs/heads/""#),
        "{printed}"
    );
}
