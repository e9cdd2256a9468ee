//! Idempotency under concurrency: parallel deliveries of one key, then a count at the
//! target. One node, and several nodes on one database; every test runs on both stores.

use std::time::Duration;

use futures_util::future::join_all;

use crate::helpers::{spawn_app_on, Backend, Behaviour, TestApp, PROVIDER};

async fn fifty_parallel_first_deliveries_of_one_key_run_the_target_once(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let answers = join_all((0..50).map(|_| app.deliver("evt_par", r#"{"id":"evt_par"}"#))).await;
    assert_eq!(app.target.count(&TestApp::idem("evt_par")), 1);
    let won = answers.iter().filter(|a| a.path == "first_run").count();
    assert_eq!(won, 1, "{answers:?}");
    for a in &answers {
        match a.status {
            201 => assert!(a.path == "first_run" || a.path == "duplicate_done", "{a:?}"),
            409 => assert_eq!(a.path, "in_progress_elsewhere"),
            _ => panic!("unexpected answer {a:?}"),
        }
    }
}

async fn racing_payloads_under_one_new_key_deliver_one_and_never_cross(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    let bodies = [r#"{"amount":1}"#, r#"{"amount":2}"#];
    let answers = join_all((0..40).map(|i| app.deliver("evt_race", bodies[i % 2]))).await;
    assert_eq!(
        app.target.count(&TestApp::idem("evt_race")),
        1,
        "{answers:?}"
    );
    let winner = answers
        .iter()
        .position(|a| a.path == "first_run")
        .expect("one request won");
    for (i, a) in answers.iter().enumerate() {
        let same_body = i % 2 == winner % 2;
        match (same_body, a.status) {
            (true, 201) => assert!(a.path == "first_run" || a.path == "duplicate_done"),
            (_, 409) => assert_eq!(a.path, "in_progress_elsewhere"),
            (false, 422) => assert_eq!(a.path, "payload_mismatch"),
            _ => panic!("request {i} (same body as the winner: {same_body}) got {a:?}"),
        }
    }
}

async fn concurrent_redeliveries_after_failure_run_the_target_once_more(backend: Backend) {
    let app = spawn_app_on(backend, |_| {}).await;
    app.target.set(Behaviour::Status(500));
    assert_eq!(app.deliver("evt_rf", "{}").await.status, 503);
    assert_eq!(app.target.count(&TestApp::idem("evt_rf")), 1);

    app.target.set(Behaviour::Accept);
    let answers = join_all((0..20).map(|_| app.deliver("evt_rf", "{}"))).await;
    assert_eq!(app.target.count(&TestApp::idem("evt_rf")), 2, "{answers:?}");
    let retried = answers
        .iter()
        .filter(|a| a.path == "retry_after_failure")
        .count();
    assert_eq!(retried, 1, "{answers:?}");
    assert_eq!(
        app.db.status(PROVIDER, "evt_rf").await.as_deref(),
        Some("done")
    );
}

async fn parallel_deliveries_across_two_nodes_on_one_database_run_the_target_once(
    backend: Backend,
) {
    let a = spawn_app_on(backend, |_| {}).await;
    let b = a.second_node(|_| {}).await;
    let mut requests = Vec::new();
    for i in 0..40 {
        let node = if i % 2 == 0 { &a } else { &b };
        requests.push(node.deliver("evt_2n", "{}"));
    }
    let answers = join_all(requests).await;
    assert_eq!(a.target.count(&TestApp::idem("evt_2n")), 1, "{answers:?}");
    assert_eq!(answers.iter().filter(|x| x.path == "first_run").count(), 1);
    assert!(answers.iter().all(|x| x.status == 201 || x.status == 409));
}

async fn parallel_failures_and_retries_across_two_nodes_deliver_once_per_won_claim(
    backend: Backend,
) {
    let a = spawn_app_on(backend, |_| {}).await;
    let b = a.second_node(|_| {}).await;
    let node = |i: usize| if i % 2 == 0 { &a } else { &b };
    let key = TestApp::idem("evt_2f");

    // While the target fails, a redelivery that arrives after a failure was recorded is a
    // new attempt; every won claim delivers exactly once, with its own attempt number.
    a.target.set(Behaviour::Status(503));
    let first = join_all((0..10).map(|i| node(i).deliver("evt_2f", "{}"))).await;
    let mut attempts: Vec<i32> = first
        .iter()
        .filter(|x| x.path == "first_run" || x.path == "retry_after_failure")
        .map(|x| x.attempt.expect("attempt"))
        .collect();
    attempts.sort_unstable();
    let expected: Vec<i32> = (1..=attempts.len() as i32).collect();
    assert_eq!(attempts, expected, "{first:?}");
    assert_eq!(a.target.count(&key), attempts.len(), "{first:?}");

    a.target.set(Behaviour::Accept);
    let second = join_all((0..10).map(|i| node(i).deliver("evt_2f", "{}"))).await;
    let won = second
        .iter()
        .filter(|x| x.path == "retry_after_failure")
        .count();
    assert_eq!(won, 1, "{second:?}");
    assert_eq!(a.target.count(&key), attempts.len() + 1, "{second:?}");
}

/// Many failed events, each redelivered by two senders at once through two nodes: the
/// retries of different keys share claim batches (on Postgres, whose report branch reads
/// each row as it stood before the retake); every key is retried exactly once.
async fn retries_of_many_failed_events_across_two_nodes_run_each_target_once_more(
    backend: Backend,
) {
    // 96 deliveries at once on two nodes: under the whole suite's load a claim may wait for
    // its batch past the default `pool_timeout` and be answered `overloaded` (seen once on
    // SQLite). What this test holds is each key's retry, not the nodes' speed.
    let patient = |c: &mut hookgate::config::Config| c.store.pool_timeout = Duration::from_secs(60);
    let a = spawn_app_on(backend, patient).await;
    let b = a.second_node(patient).await;
    let keys: Vec<String> = (0..24).map(|i| format!("evt_mf{i}")).collect();
    a.target.set(Behaviour::Status(503));
    for answer in join_all(keys.iter().map(|k| a.deliver(k, "{}"))).await {
        assert_eq!((answer.status, answer.path.as_str()), (503, "first_run"));
    }

    a.target.set(Behaviour::Accept);
    let retries = keys
        .iter()
        .flat_map(|k| [a.deliver(k, "{}"), b.deliver(k, "{}")]);
    let answers = join_all(retries).await;
    for (key, pair) in keys.iter().zip(answers.chunks(2)) {
        let won = pair
            .iter()
            .filter(|x| x.path == "retry_after_failure")
            .count();
        assert_eq!(won, 1, "{key}: {pair:?}");
        assert_eq!(a.target.count(&TestApp::idem(key)), 2, "{key}");
    }
    assert_eq!(a.target.total(), 2 * keys.len());
}

async fn a_done_event_is_replayed_even_long_after_its_lease_expired(backend: Backend) {
    let app = spawn_app_on(backend, |c| c.cache.capacity = 0).await;
    assert_eq!(app.deliver("evt_old", "{}").await.status, 201);
    app.db.expire_lease(PROVIDER, "evt_old").await;
    let answers = join_all((0..10).map(|_| app.deliver("evt_old", "{}"))).await;
    assert!(
        answers
            .iter()
            .all(|a| a.path == "duplicate_done" && a.status == 201),
        "{answers:?}"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_old")), 1);
}

on_both_stores!(
    racing_payloads_under_one_new_key_deliver_one_and_never_cross,
    fifty_parallel_first_deliveries_of_one_key_run_the_target_once,
    concurrent_redeliveries_after_failure_run_the_target_once_more,
    parallel_deliveries_across_two_nodes_on_one_database_run_the_target_once,
    parallel_failures_and_retries_across_two_nodes_deliver_once_per_won_claim,
    retries_of_many_failed_events_across_two_nodes_run_each_target_once_more,
    a_done_event_is_replayed_even_long_after_its_lease_expired,
);
