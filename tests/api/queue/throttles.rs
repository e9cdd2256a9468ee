//! A target that asks for time (`Retry-After`): the wait is read as RFC 9110 says and
//! bounded, a throttled try uses up no attempt, and an event throttled past its
//! provider's horizon becomes a dead letter.

use std::time::{Duration, SystemTime};

use hookgate::key::EventId;

use crate::helpers::long_deliveries;
use crate::helpers::{eventually, spawn_app_on, Backend, Behaviour, TestApp, PROVIDER};

/// The target's `Retry-After` on a 503, read as RFC 9110 says (delay-seconds or an
/// HTTP-date) and held within `[1 s, retry.cap]`: the row's next try is due within those
/// bounds, the shard answers on, the node stays ready.
async fn a_targets_retry_after_is_bounded_and_can_never_take_a_shard_down(backend: Backend) {
    let in_ten_seconds =
        actix_web::http::header::HttpDate::from(SystemTime::now() + Duration::from_secs(10))
            .to_string();
    let date: &'static str = Box::leak(in_ten_seconds.into_boxed_str());
    let cases: [(&'static str, f64, f64); 5] = [
        ("18446744073709551615", 1.0, 30.0),
        ("31536000", 1.0, 30.0),
        ("0", 1.0, 30.0),
        ("soon", 1.0, 30.0),
        (date, 5.0, 11.0),
    ];
    for (value, low, high) in cases {
        let app = spawn_app_on(backend, long_deliveries).await;
        app.target.set(Behaviour::Throttle(503, value));
        assert_eq!(app.deliver("evt_ra", "{}").await.status, 202);
        app.wait_status("evt_ra", "failed").await;
        let backoff = app.db.backoff(PROVIDER, "evt_ra").await;
        assert!(
            (low - 0.01..=high + 0.01).contains(&backoff),
            "Retry-After: {value} gave a backoff of {backoff} s, not {low}..{high}"
        );
        let again = app.deliver("evt_ra", "{}").await;
        assert_eq!(
            (again.status, again.path.as_str()),
            (202, "duplicate_queued"),
            "the shard still answers after Retry-After: {value}"
        );
        assert_eq!(app.get("/readyz").await.status, 200);
    }
}

/// Four throttled tries (503 with `Retry-After: 1`) use none of the three attempts: after
/// them one real failure (500) leaves the event `failed`, waiting for its retry.
async fn throttled_tries_do_not_use_up_the_attempts(backend: Backend) {
    let app = spawn_app_on(backend, |c| {
        long_deliveries(c);
        c.retry.max_attempts = 3;
    })
    .await;
    let idem = TestApp::idem("evt_th");
    app.target.set(Behaviour::Throttle(503, "1"));
    assert_eq!(app.deliver("evt_th", "{}").await.status, 202);
    for n in 1..=5 {
        if n == 5 {
            app.target.set(Behaviour::Status(500));
        }
        if n > 1 {
            app.db.make_due(PROVIDER, "evt_th").await;
            // The node holds the provider back for the second the target asked for.
            eventually("the next try", || async {
                app.scheduler.run_once().await.unwrap();
                app.target.count(&idem) >= n
            })
            .await;
        }
        app.target.wait_for(&idem, n).await;
        app.wait_status("evt_th", "failed").await;
    }
    let row = app.store.lookup(&EventId::new(PROVIDER, "evt_th")).await;
    let row = row.unwrap().expect("row");
    assert_eq!((row.status.as_str(), row.attempts), ("failed", 5));
}

/// A target that always says "later" cannot keep an event forever: a throttled try of an
/// event older than its provider's horizon makes it a dead letter with its own reason.
async fn an_event_throttled_past_its_horizon_is_a_dead_letter(backend: Backend) {
    let app = spawn_app_on(backend, long_deliveries).await;
    let idem = TestApp::idem("evt_old");
    app.target.set(Behaviour::Throttle(429, "1"));
    assert_eq!(app.deliver("evt_old", "{}").await.status, 202);
    app.wait_status("evt_old", "failed").await;
    app.db.age(PROVIDER, "evt_old", 30).await;
    app.db.make_due(PROVIDER, "evt_old").await;
    eventually("the next try", || async {
        app.scheduler.run_once().await.unwrap();
        app.target.count(&idem) >= 2
    })
    .await;
    app.wait_status("evt_old", "dead").await;
    let dead = app
        .store
        .dead_letters(Some(PROVIDER), None, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].dead_reason.as_deref(), Some("throttled_too_long"));
}

on_both_stores!(
    a_targets_retry_after_is_bounded_and_can_never_take_a_shard_down,
    throttled_tries_do_not_use_up_the_attempts,
    an_event_throttled_past_its_horizon_is_a_dead_letter,
);
