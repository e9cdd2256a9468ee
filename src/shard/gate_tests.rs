//! The gate under test: its limits, its pauses and holds, and the ramp after a pause,
//! with time a parameter (a bucket's `now`) where a pause must end.

use super::*;

/// The node's workers in these tests.
const WORKERS: usize = 16;

fn gate(rate: Option<f64>, in_flight: Option<usize>) -> Gate {
    let gate = Gate::new(WORKERS);
    gate.configure(&Arc::from("p"), rate, in_flight);
    gate
}

#[test]
fn in_flight_is_capped_and_released() {
    let g = gate(None, Some(2));
    assert!(g.try_acquire("p") && g.try_acquire("p"));
    assert!(!g.try_acquire("p"));
    assert_eq!(g.available("p"), 0);
    g.release("p");
    assert_eq!(g.available("p"), 1);
}

#[test]
fn the_rate_allows_a_seconds_burst_then_refills() {
    let g = gate(Some(3.0), None);
    assert_eq!(g.available("p"), 3);
    for _ in 0..3 {
        assert!(g.try_acquire("p"));
    }
    assert!(!g.try_acquire("p"), "the bucket is empty");
}

#[test]
fn a_gate_without_room_says_when_it_has_some() {
    let g = gate(Some(2.0), Some(5));
    assert_eq!(g.reserve("p", 10), 2);
    match g.next_room("p") {
        NextRoom::After(d) => assert!(d > Duration::ZERO && d <= Duration::from_millis(500)),
        other => panic!("the next token, not {other:?}"),
    }
    let capped = gate(None, Some(1));
    assert_eq!(capped.reserve("p", 10), 1);
    assert_eq!(capped.next_room("p"), NextRoom::Freed);
    capped.hold("p", true);
    assert_eq!(capped.next_room("p"), NextRoom::Resumed);
    let paused = gate(None, None);
    paused.pause("p", Duration::from_secs(30));
    assert!(matches!(paused.next_room("p"), NextRoom::After(d) if d > Duration::from_secs(29)));
}

#[test]
fn a_reservation_holds_its_room_until_given_back() {
    let g = gate(Some(3.0), Some(2));
    assert_eq!(g.reserve("p", 10), 2);
    assert!(!g.try_acquire("p"), "the reserved slots are spoken for");
    g.unreserve("p", 1);
    assert_eq!(g.available("p"), 1);
    assert!(g.try_acquire("p"));
    assert_eq!(g.available("p"), 0);
    g.release("p");
    g.release("p");
    // Two tokens spent (one reserved and kept, one acquired), one given back.
    assert_eq!(g.available("p"), 1);
    assert_eq!(g.reserve("other", 7), 7, "an unknown provider is unlimited");
}

#[test]
fn a_hold_names_the_operators_pause_first_and_a_targets_pause_ends_on_demand() {
    let g = gate(None, None);
    assert_eq!(g.hold_of("p"), None);
    g.pause("p", Duration::from_secs(60));
    assert!(matches!(g.hold_of("p"), Some(Hold::Target(left)) if left <= Duration::from_secs(60)));
    g.hold("p", true);
    assert_eq!(g.hold_of("p"), Some(Hold::Operator));
    g.hold("p", false);
    g.end_target_pause("p");
    assert_eq!(g.hold_of("p"), None);
    assert_eq!(g.target_pause_left("p"), None);
    assert!(!g.stopped("p"));
}

#[test]
fn a_pause_stops_every_start_and_unknown_providers_are_unlimited() {
    let g = gate(None, None);
    assert!(!g.stopped("p"));
    g.pause("p", Duration::from_secs(60));
    assert!(g.stopped("p"));
    assert_eq!(g.available("p"), 0);
    assert!(!g.try_acquire("p"));
    assert!(g.try_acquire("other"));
}

#[test]
fn a_pause_that_ended_leaves_room_for_one_delivery() {
    let g = gate(None, Some(8));
    g.pause("p", Duration::ZERO);
    assert_eq!(g.reserve("p", 10), 1, "the probe, alone");
    assert!(!g.try_acquire("p"));
    assert_eq!(g.next_room("p"), NextRoom::Freed, "room comes when it ends");
}

#[test]
fn the_window_after_a_pause_widens_by_one_per_success_up_to_max_in_flight() {
    let now = Instant::now();
    let later = now + Duration::from_secs(1);
    let mut b = Bucket::new(None, Some(4), WORKERS, now);
    assert_eq!(b.available(now), 4, "no pause, no ramp");
    b.pause_until(later);
    assert_eq!(b.available(now), 0);
    assert_eq!(b.available(later), 1, "the probe");
    b.in_flight = 1;
    assert_eq!(b.available(later), 0, "the probe alone");
    b.report(Report::Answered, later);
    assert_eq!(b.available(later), 1, "two at once");
    b.report(Report::Answered, later);
    b.in_flight = 0;
    assert_eq!(b.available(later), 3);
    b.report(Report::Nothing, later);
    assert_eq!(b.available(later), 3, "a crash says nothing of the target");
    b.report(Report::Answered, later);
    assert_eq!(
        b.ramp, None,
        "the window reached max_in_flight: the ramp is over"
    );
    assert_eq!(b.available(later), 4);
    b.report(Report::Failed(Duration::from_secs(30)), later);
    assert_eq!(
        b.available(later),
        4,
        "past the ramp a failure changes nothing"
    );
}

#[test]
fn a_failed_probe_pauses_again_for_its_wait_and_a_pause_ignores_earlier_deliveries() {
    let now = Instant::now();
    let secs = Duration::from_secs;
    let mut b = Bucket::new(None, None, WORKERS, now);
    b.pause_until(now + secs(1));
    // Deliveries that started before the pause end during it: they move no window.
    b.report(Report::Answered, now);
    b.report(Report::Failed(secs(600)), now);
    let ended = now + secs(1);
    assert_eq!(b.available(ended), 1);
    b.report(Report::Failed(secs(30)), ended);
    assert_eq!(b.available(ended + secs(29)), 0, "paused again");
    assert_eq!(b.available(ended + secs(30)), 1, "then one probe again");
    // Failures halve a wider window; at one, the next pauses.
    let resumed = ended + secs(30);
    for _ in 0..7 {
        b.report(Report::Answered, resumed);
    }
    assert_eq!(b.available(resumed), 8);
    b.report(Report::Failed(secs(5)), resumed);
    assert_eq!(b.available(resumed), 4);
    for _ in 0..2 {
        b.report(Report::Failed(secs(5)), resumed);
    }
    assert_eq!(b.available(resumed), 1);
    b.report(Report::Failed(secs(5)), resumed);
    assert_eq!(b.available(resumed), 0);
    assert_eq!(b.available(resumed + secs(5)), 1);
}

#[test]
fn without_max_in_flight_the_ramp_ends_at_the_nodes_workers() {
    let now = Instant::now();
    let mut b = Bucket::new(None, None, WORKERS, now);
    b.pause_until(now);
    for _ in 2..WORKERS {
        b.report(Report::Answered, now);
    }
    assert_eq!(b.available(now), WORKERS - 1);
    b.report(Report::Answered, now);
    assert_eq!(b.ramp, None);
    assert_eq!(b.available(now), MAX_TAKE);
    let above = Bucket::new(None, Some(1000), WORKERS, now);
    assert_eq!(
        above.ceiling, WORKERS,
        "past the workers a window holds nothing back"
    );
}

#[test]
fn an_operators_resume_ramps_as_the_end_of_a_targets_pause_does() {
    let g = gate(None, Some(8));
    g.hold("p", false);
    assert_eq!(
        g.window("p"),
        None,
        "a poll that finds no pause starts no ramp"
    );
    g.hold("p", true);
    assert_eq!(g.reserve("p", 10), 0);
    g.hold("p", false);
    assert_eq!(g.window("p"), Some(1));
    assert!(g.try_acquire("p"), "the probe");
    assert!(!g.try_acquire("p"));
    g.release("p");
    g.report("p", Report::Answered);
    assert_eq!((g.window("p"), g.reserve("p", 10)), (Some(2), 2));
    g.report("other", Report::Answered);
    assert_eq!(g.window("other"), None, "an unknown provider has no ramp");
}
