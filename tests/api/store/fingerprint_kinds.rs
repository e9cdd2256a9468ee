//! Fingerprints across a key rotation, on both stores: a row fingerprinted under another
//! key than the sealing one (rotated out, or before encryption was on) is still compared —
//! the request's payload is fingerprinted again under the row's kind — so another body is
//! 422 whatever the row's state, never a takeover of a failed row; the same body retries
//! it; and a row whose key is gone cannot be compared, so a redelivery that would take it
//! over is refused 422 rather than delivered unchecked.

use crate::helpers::{seal_config, spawn_app_on, Backend, Behaviour, TestApp};

const BODY: &str = r#"{"id":"x","amount":100}"#;
const OTHER: &str = r#"{"id":"x","amount":999}"#;

/// A node whose rows are fingerprinted under `before` (`&[]`: encryption off), its target
/// failing `failed` and delivering `done`; then a node of `after` keys on the same store.
async fn rotated(backend: Backend, before: &'static [&'static str], after: &[&str]) -> TestApp {
    let app = spawn_app_on(backend, |c| {
        if !before.is_empty() {
            seal_config(c, before, false);
        }
    })
    .await;
    assert_eq!(app.deliver("evt_done", BODY).await.status, 201);
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_failed", BODY).await.status, 503);
    app.wait_status("evt_failed", "failed").await;
    app.target.set(Behaviour::Accept);
    app.second_node(|c| seal_config(c, after, false)).await
}

/// After a rotation (`k2` seals, `k1` still opens) and after encryption was turned on
/// (rows fingerprinted in plain): another body under a failed row's key is 422 and reaches
/// nobody; under a done row's key, 422 too; the same body retries the failed row once.
async fn another_body_is_refused_across_a_rotation_and_the_same_one_retries(backend: Backend) {
    for (before, after) in [(&["k1"][..], &["k2", "k1"][..]), (&[][..], &["k1"][..])] {
        let node = rotated(backend, before, after).await;
        let answer = |a: crate::helpers::Answer| format!("{} {}", a.status, a.path);
        let other = answer(node.deliver("evt_failed", OTHER).await);
        assert_eq!(other, "422 payload_mismatch", "{before:?} -> {after:?}");
        let done = answer(node.deliver("evt_done", OTHER).await);
        assert_eq!(done, "422 payload_mismatch", "{before:?} -> {after:?}");
        assert_eq!(node.target.count(&TestApp::idem("evt_failed")), 1);
        let same = answer(node.deliver("evt_failed", BODY).await);
        assert_eq!(same, "201 retry_after_failure", "{before:?} -> {after:?}");
        let again = answer(node.deliver("evt_done", BODY).await);
        assert_eq!(again, "201 duplicate_done", "{before:?} -> {after:?}");
        assert_eq!(node.target.count(&TestApp::idem("evt_failed")), 2);
        assert_eq!(node.target.count(&TestApp::idem("evt_done")), 1);
    }
}

/// The row's key is no longer configured: its fingerprint cannot be compared, so a
/// redelivery that would take the failed row over is refused 422 (whatever its body),
/// never delivered unchecked.
async fn a_row_whose_key_is_gone_is_not_taken_over_unchecked(backend: Backend) {
    let node = rotated(backend, &["k1"], &["k2"]).await;
    for body in [BODY, OTHER] {
        let a = node.deliver("evt_failed", body).await;
        assert_eq!(
            (a.status, a.path.as_str()),
            (422, "payload_mismatch"),
            "{a:?}"
        );
    }
    assert_eq!(node.target.count(&TestApp::idem("evt_failed")), 1);
}

on_both_stores!(
    another_body_is_refused_across_a_rotation_and_the_same_one_retries,
    a_row_whose_key_is_gone_is_not_taken_over_unchecked,
);
