//! Setups several test files share: config edits, a dead letter made through a sender's
//! delivery, a failed sync row met by a queue-mode node, an admin token's header.

use std::time::Duration;

use hookgate::claim::Mode;
use hookgate::config::Config;

use super::{Backend, Behaviour, TestApp};

/// An `Authorization` header's value for `token`.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Makes `key` a dead letter through a sender's delivery refused with 400.
pub async fn dead_letter(app: &TestApp, key: &str) {
    app.target.set(Behaviour::Status(400));
    let answer = app.deliver(key, r#"{"id":"x"}"#).await;
    assert_eq!(answer.body, r#"{"status":"dead_lettered"}"#);
    app.target.set(Behaviour::Accept);
}

/// The base test node with its provider in queue mode (the scheduler driven by hand).
pub fn queue_mode(c: &mut Config) {
    c.providers[0].mode = Some(Mode::Queue);
    c.queue.poll_interval = Duration::from_secs(3600);
}

/// Queue mode with a lease (2 s) shorter than the target's timeout (30 s): every long
/// delivery lives on renewals.
pub fn long_deliveries(c: &mut Config) {
    queue_mode(c);
    c.lease.duration = Duration::from_secs(2);
    c.retry.base = Duration::from_secs(3);
    c.retry.cap = Duration::from_secs(30);
    c.store.statement_timeout = Some(Duration::from_secs(1));
    c.providers[0].target.timeout = Duration::from_secs(30);
}

/// A sync node whose target failed `key` (a `failed` sync row), and a second node on the
/// same schema where the provider is in queue mode (the scheduler driven by hand), with
/// `edit` made to its config.
pub async fn failed_sync_row_and_a_queue_node(
    backend: Backend,
    key: &str,
    edit: impl FnOnce(&mut Config),
) -> (TestApp, TestApp) {
    let app = super::spawn_app_on(backend, |_| {}).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver(key, "{}").await.status, 503);
    app.wait_status(key, "failed").await;
    let node = app
        .second_node(|c| {
            queue_mode(c);
            edit(c);
        })
        .await;
    (app, node)
}
