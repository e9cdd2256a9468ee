//! The way back from a pause: when a pause of a queue provider ends — the one its target
//! asked for with `Retry-After`, or an operator's, by a resume — its held deliveries do not
//! all start at once. One goes first; each success lets one more start beside it, so the
//! target, counting the requests it has open at once, never has more open than one plus
//! the successes it has answered; a failed first delivery pauses the provider again, and
//! the held rows wait. The scheduler's passes are driven by hand.

use std::time::Duration;

use hookgate::secret::Secret;

use crate::helpers::{
    eventually, queue_mode, spawn_app_on, Arrival, Backend, Behaviour, TestApp, PROVIDER,
};

const TOKEN: &str = "ramp-admin-token";

/// Held events: more than the node's 16 workers (4 shards of 4), so all at once would be
/// 16 at the target.
const HELD: usize = 20;

/// How long the target takes to accept a delivery once its pause is over: long enough
/// that the deliveries a pass starts together are open at the target together, even on a
/// machine starved of CPU.
const SLOW: Duration = Duration::from_millis(400);

/// Queue mode with the admin API on; the scheduler is driven by hand.
async fn queue_app(backend: Backend) -> TestApp {
    let app = spawn_app_on(backend, |c| {
        queue_mode(c);
        c.admin.token = Some(Secret::new(TOKEN));
    })
    .await;
    app.scheduler.by_hand().await;
    app
}

async fn admin_post(app: &TestApp, path: &str) {
    let auth = format!("Bearer {TOKEN}");
    let answer = app
        .post(path, &[("Authorization", &auth)], String::new())
        .await;
    assert_eq!(answer.status, 200, "{path}: {answer:?}");
}

/// `evt_00` is throttled (`Retry-After: retry_after`), which pauses the provider on this
/// node; then `evt_01` … are accepted while it is paused, and held.
async fn held_by_a_targets_pause(app: &TestApp, retry_after: &'static str, events: usize) {
    app.target.set(Behaviour::Throttle(503, retry_after));
    assert_eq!(app.deliver("evt_00", "{}").await.status, 202);
    app.wait_ended("evt_00", "failed", 1).await;
    for i in 1..events {
        assert_eq!(app.deliver(&format!("evt_{i:02}"), "{}").await.status, 202);
    }
}

/// Passes until every one of the `HELD` events is done.
async fn deliver_the_held_events(app: &TestApp) {
    eventually("every held event to be delivered", || async {
        app.scheduler.run_once().await.unwrap();
        app.db.count_status("done").await == HELD as i64
    })
    .await;
}

/// No request found more requests open at the target than one plus the successes the
/// target had answered before it (the window after a pause), and the window did widen.
fn assert_ramped(arrivals: &[Arrival]) {
    for (n, arrival) in arrivals.iter().enumerate() {
        assert!(
            arrival.open as u64 <= 1 + arrival.succeeded,
            "delivery {n} after the pause found {} open at the target after {} successes: \
             {arrivals:?}",
            arrival.open,
            arrival.succeeded
        );
    }
    let widest = arrivals.iter().map(|a| a.open).max().unwrap_or(0);
    assert!(
        widest >= 4,
        "never more than {widest} at once: {arrivals:?}"
    );
}

/// The provider's `family` gauge on this node, as `/metrics` shows it.
async fn gauge(app: &TestApp, family: &str) -> f64 {
    let metrics = app.get("/metrics").await.body;
    let series = format!("{family}{{provider=\"{PROVIDER}\",route=\"main\"}}");
    let line = metrics.lines().find(|l| l.starts_with(&series));
    let value = line
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok());
    value.unwrap_or_else(|| panic!("no {series} in {metrics}"))
}

/// The target asked for time (503, `Retry-After: 2`) while twenty events queued up; when
/// the pause ends it is accepting again, slowly. The first delivery is alone at the target,
/// and each success lets one more start: the target never has more open than one plus the
/// successes it answered, and it does get several at once by the end.
async fn a_targets_pause_ends_with_one_delivery_then_widens_as_deliveries_succeed(
    backend: Backend,
) {
    let app = queue_app(backend).await;
    held_by_a_targets_pause(&app, "2", HELD).await;
    app.target.set(Behaviour::Slow(SLOW));
    app.target.reset();
    deliver_the_held_events(&app).await;
    assert_ramped(&app.target.arrivals());
}

/// An operator paused the provider while twenty events queued up; the resume ramps as the
/// end of a target's pause does: one delivery first, one more beside it per success.
/// `/metrics` shows the window, and that the ramp ended.
async fn an_operators_resume_starts_one_held_delivery_then_widens(backend: Backend) {
    let app = queue_app(backend).await;
    admin_post(&app, &format!("/admin/api/providers/{PROVIDER}/pause")).await;
    for i in 0..HELD {
        assert_eq!(app.deliver(&format!("evt_{i:02}"), "{}").await.status, 202);
    }
    assert_eq!(app.scheduler.run_once().await.unwrap().taken, 0, "held");
    assert_eq!(app.target.total(), 0);
    app.target.set(Behaviour::Slow(SLOW));
    admin_post(&app, &format!("/admin/api/providers/{PROVIDER}/resume")).await;
    assert_eq!(gauge(&app, "hookgate_gate_window").await, 1.0);
    deliver_the_held_events(&app).await;
    assert_ramped(&app.target.arrivals());
    // Fifteen successes took the window to the node's 16 workers: the ramp is over.
    assert_eq!(gauge(&app, "hookgate_gate_window").await, 0.0);
}

/// The target's pause ends, and the first delivery fails — throttled again, or a 500: the
/// provider is paused again (for that event's own wait, at most `queue.max_target_pause`)
/// after that one delivery, and the other held rows are not tried.
async fn a_failed_first_delivery_after_a_pause_pauses_its_provider_again(backend: Backend) {
    for probe in [Behaviour::Throttle(503, "30"), Behaviour::Status(500)] {
        let app = queue_app(backend).await;
        held_by_a_targets_pause(&app, "1", 10).await;
        app.target.set(probe);
        // A slow machine may have let the pause end while the events arrived: a delivery
        // then ended throttled for one more second, and is counted here.
        let before = app.target.total();
        eventually(
            &format!("the first delivery after the pause ({probe:?})"),
            || async {
                app.scheduler.run_once().await.unwrap();
                app.target.total() > before
            },
        )
        .await;
        eventually(
            &format!("a pause again, or more deliveries ({probe:?})"),
            || async {
                app.scheduler.run_once().await.unwrap();
                gauge(&app, "hookgate_target_pause_seconds").await > 5.0
                    || app.target.total() > before + 1
            },
        )
        .await;
        let tried = app.target.total() - before;
        assert_eq!(tried, 1, "{probe:?}: the held rows were tried");
        assert_eq!(
            app.scheduler.run_once().await.unwrap().taken,
            0,
            "{probe:?}"
        );
        assert_eq!(app.db.count_status("done").await, 0, "{probe:?}");
    }
}

on_both_stores!(
    a_targets_pause_ends_with_one_delivery_then_widens_as_deliveries_succeed,
    an_operators_resume_starts_one_held_delivery_then_widens,
    a_failed_first_delivery_after_a_pause_pauses_its_provider_again,
);
