//! An event's key as the sender wrote it: ids that differ only past a float's precision
//! (or as `1` and `1.0`) are two events, and a non-ASCII key reaches the target as
//! unambiguous ASCII.

use crate::helpers::{spawn_app_on, Backend, TestApp, PROVIDER};

/// Two events whose ids differ only past a float's precision are two events, and a key
/// with non-ASCII characters reaches the target as unambiguous ASCII.
async fn neighbouring_big_integer_ids_are_two_events(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let hook = format!("/webhooks/{PROVIDER}");
    let a = app
        .post(&hook, &[], r#"{"id":18446744073709551616}"#.into())
        .await;
    let b = app
        .post(&hook, &[], r#"{"id":18446744073709551617}"#.into())
        .await;
    assert_eq!(
        (a.path.as_str(), b.path.as_str()),
        ("first_run", "first_run")
    );
    assert_eq!(app.target.count(&TestApp::idem("18446744073709551616")), 1);
    assert_eq!(app.target.count(&TestApp::idem("18446744073709551617")), 1);
    let one = app.post(&hook, &[], r#"{"id":1.0}"#.into()).await;
    let other = app.post(&hook, &[], r#"{"id":1}"#.into()).await;
    assert_eq!(
        (one.path.as_str(), other.path.as_str()),
        ("first_run", "first_run")
    );

    let accented = app.post(&hook, &[], r#"{"id":"évt_1"}"#.into()).await;
    assert_eq!(accented.status, 201);
    assert_eq!(app.target.count(&TestApp::idem("%C3%A9vt_1")), 1);
    assert_eq!(
        app.db.status(PROVIDER, "évt_1").await.as_deref(),
        Some("done")
    );
}

on_both_stores!(neighbouring_big_integer_ids_are_two_events);
