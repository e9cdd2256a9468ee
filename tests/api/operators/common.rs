//! Shared by the operators' tests of history, searches, bulk replays and pauses: a node
//! with the admin API on, and JSON calls to it with the token.

use hookgate::secret::Secret;
use serde_json::Value;

use crate::helpers::{spawn_app_on, Backend, TestApp};

pub(crate) const TOKEN: &str = "history-admin-token";

pub(crate) fn auth() -> String {
    format!("Bearer {TOKEN}")
}

pub(crate) async fn admin_app(
    backend: Backend,
    edit: impl FnOnce(&mut hookgate::config::Config),
) -> TestApp {
    spawn_app_on(backend, |c| {
        c.admin.token = Some(Secret::new(TOKEN));
        edit(c);
    })
    .await
}

pub(crate) async fn get_json(app: &TestApp, path: &str) -> Value {
    let answer = app.get_with(path, &auth()).await;
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

pub(crate) async fn post_json(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let answer = app
        .post(path, &[("Authorization", &auth())], body.to_string())
        .await;
    (
        answer.status,
        serde_json::from_str(&answer.body).unwrap_or(Value::Null),
    )
}
