//! What the keepers scenario prints and how it is judged: one line per window
//! ([`Sample`]), then the checks ([`Rules::checks`]), each with the numbers it compared.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::keepers_db::Look;
use crate::soak_report::Check;
use crate::soak_target::Tally;

/// The ring has stopped turning once one slot stays current over more turns of aging
/// than this (one late turn is a pass that came late; more, a ring that cannot turn).
const STUCK_TURNS: u32 = 2;

/// The longest waits the probe may see: a turn or an emptying holds the lock for a few
/// statements (docs/design.md: at most 25 ms in a soak at 1 500/s), so a p99 past 50 ms is
/// work per row under the lock, and 200 ms a claim visibly held.
const PROBE_P99_MS: f64 = 50.0;
const PROBE_MAX_MS: f64 = 200.0;

/// One window's figures.
pub struct Sample {
    /// The end of the window, since ingest started.
    pub at: Duration,
    /// How far the clock was moved forward by then.
    pub aged: Duration,
    pub look: Look,
    /// The probe's waits in the window, in ms.
    pub lock_p99: f64,
    pub lock_max: f64,
    /// Ingest: its answers' p99 and max in ms, 2xx answers, the other answers by status
    /// and path (`503/store_unavailable`), requests with no answer.
    pub p99: f64,
    pub max: f64,
    pub accepted: u64,
    pub refused_by: BTreeMap<String, u64>,
    pub errors: u64,
    /// At the target, since the start.
    pub tally: Tally,
    /// The node's `hookgate_retention_backlog_seconds`, as of its last successful pass.
    pub backlog_s: f64,
}

impl Sample {
    /// The window as one line.
    pub fn line(&self) -> String {
        let mut answers = vec![format!("2xx:{}", self.accepted)];
        answers.extend(self.refused_by.iter().map(|(k, n)| format!("{k}:{n}")));
        format!(
            "t={:>4.0}s aged={:>4}h {} dead={} past_retention={} lock_wait_p99={:.1}ms \
             lock_wait_max={:.0}ms p99={:.1}ms max={:.0}ms answers={{{}}} errors={} \
             deliveries={} duplicates={} backlog={:.0}s",
            self.at.as_secs_f64(),
            self.aged.as_secs() / 3600,
            self.look.ring.line(),
            self.look.dead_line(),
            self.look.past_retention,
            self.lock_p99,
            self.lock_max,
            self.p99,
            self.max,
            answers.join(","),
            self.errors,
            self.tally.deliveries,
            self.tally.duplicates,
            self.backlog_s,
        )
    }

    /// Answers other than 2xx, and requests with no answer.
    fn not_accepted(&self) -> u64 {
        self.refused_by.values().sum::<u64>() + self.errors
    }
}

/// What the checks compare against.
pub struct Rules {
    /// Dead letters the outage was to leave.
    pub dead: u64,
    /// New events a second, and the window (a turn of aging).
    pub rate: u64,
    pub window: Duration,
    pub sweep_interval: Duration,
    /// The node's `retention.dead`: dead letters younger than it must stay.
    pub dead_retention: Duration,
    /// Windows the clock was held while the dead letters moved (`--hold-while-moving`):
    /// the current slot keeps taking events through them, so it may gather that many more
    /// windows' ingest than a turn's.
    pub held: u32,
}

impl Rules {
    /// Every check, in the order printed; `waits` are the probe's, in µs.
    pub fn checks(
        &self,
        before: &Look,
        samples: &[Sample],
        waits: &mut [u32],
        tally: Tally,
    ) -> Vec<Check> {
        vec![
            Check {
                name: "the outage left its dead letters",
                passed: Some(before.dead_letters() == self.dead),
                detail: format!(
                    "{} dead letters in slot(s) {}, {} sent",
                    before.dead_letters(),
                    before.dead_line(),
                    self.dead
                ),
            },
            self.turning(samples),
            self.past_retention(samples),
            self.answers(samples),
            Check {
                name: "no key delivered twice",
                passed: Some(tally.duplicates == 0 && tally.foreign == 0),
                detail: format!(
                    "{} duplicate(s) and {} delivery(ies) of keys never sent, in {} deliveries",
                    tally.duplicates, tally.foreign, tally.deliveries
                ),
            },
            probe(waits),
            self.kept(samples),
            moved(before, samples),
        ]
    }

    /// No slot stays current over more than [`STUCK_TURNS`] turns of aging after the one
    /// it opened in (a window whose clock was held ages nothing).
    fn turning(&self, samples: &[Sample]) -> Check {
        let mut worst: Option<(i16, u32, Duration)> = None;
        let mut run: Option<(i16, u32)> = None;
        let mut aged = Duration::ZERO;
        for s in samples {
            let turned = u32::from(s.aged > aged);
            aged = s.aged;
            run = match (run, s.look.ring.current) {
                (Some((slot, turns)), Some(current)) if slot == current => {
                    Some((slot, turns + turned))
                }
                (_, current) => current.map(|slot| (slot, 0)),
            };
            if let Some((slot, turns)) = run {
                if worst.is_none_or(|(_, most, _)| turns > most) {
                    worst = Some((slot, turns, s.at));
                }
            }
        }
        let no_current = samples
            .iter()
            .filter(|s| s.look.ring.current.is_none())
            .count();
        let (slot, turns, at) = worst.unwrap_or((-1, 0, Duration::ZERO));
        Check {
            name: "the ring keeps turning",
            passed: Some(turns <= STUCK_TURNS && no_current == 0 && !samples.is_empty()),
            detail: format!(
                "longest a slot stayed current: slot {slot} over {turns} turn(s) of aging after \
                 its own (at most {STUCK_TURNS}), until t={:.0}s; {no_current} window(s) with no \
                 current slot",
                at.as_secs_f64()
            ),
        }
    }

    /// Done rows past retention stay within what arrives in a turn and a sweep interval:
    /// by design the ring holds up to a turn's worth past retention (docs/design.md,
    /// "What retention keeps"), a pass late for the turn adds a sweep interval's, and each
    /// window the clock was held adds a window's.
    fn past_retention(&self, samples: &[Sample]) -> Check {
        let windows = self.window * (1 + self.held);
        let limit =
            (self.rate as f64 * (windows + self.sweep_interval).as_secs_f64()).ceil() as u64;
        let (most, at) = samples
            .iter()
            .map(|s| (s.look.past_retention, s.at))
            .max_by_key(|(n, _)| *n)
            .unwrap_or((0, Duration::ZERO));
        Check {
            name: "rows past retention stay within a turn's ingest",
            passed: Some(most <= limit),
            detail: format!(
                "most {most} at t={:.0}s, at most {limit} ({}/s × ({} window(s) + sweep \
                 interval))",
                at.as_secs_f64(),
                self.rate,
                1 + self.held
            ),
        }
    }

    /// Every ingest request is answered 2xx.
    fn answers(&self, samples: &[Sample]) -> Check {
        let accepted: u64 = samples.iter().map(|s| s.accepted).sum();
        let mut other = BTreeMap::<&str, u64>::new();
        for (answer, n) in samples.iter().flat_map(|s| &s.refused_by) {
            *other.entry(answer).or_default() += n;
        }
        let errors: u64 = samples.iter().map(|s| s.errors).sum();
        let not: u64 = samples.iter().map(Sample::not_accepted).sum();
        let first = samples.iter().find(|s| s.not_accepted() > 0);
        Check {
            name: "every event is answered 2xx",
            passed: Some(accepted > 0 && not == 0),
            detail: format!(
                "{accepted} answered 2xx; otherwise {{{}}}, {errors} with no answer{}",
                other
                    .iter()
                    .map(|(k, n)| format!("{k}:{n}"))
                    .collect::<Vec<_>>()
                    .join(","),
                first.map_or(String::new(), |s| format!(
                    " (the first in the window ending t={:.0}s)",
                    s.at.as_secs_f64()
                ))
            ),
        }
    }

    /// Every dead letter stays while it is inside `retention.dead` (windows aged less).
    fn kept(&self, samples: &[Sample]) -> Check {
        let judged: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.aged < self.dead_retention)
            .collect();
        let fewest = judged.iter().map(|s| s.look.dead_letters()).min();
        Check {
            name: "the dead letters are kept",
            passed: Some(fewest.is_none_or(|n| n == self.dead)),
            detail: format!(
                "fewest {} in the {} window(s) aged less than retention.dead, {} expected",
                fewest.map_or("-".into(), |n| n.to_string()),
                judged.len(),
                self.dead
            ),
        }
    }
}

/// The probe waited at most [`PROBE_P99_MS`] at p99 and [`PROBE_MAX_MS`] at worst.
fn probe(waits: &mut [u32]) -> Check {
    let (p99, max) = (quantile_ms(waits, 0.99), quantile_ms(waits, 1.0));
    Check {
        name: "claims do not wait behind the ring",
        passed: Some(!waits.is_empty() && p99 <= PROBE_P99_MS && max <= PROBE_MAX_MS),
        detail: format!(
            "the probe's lock wait p99 {p99:.1}ms (at most {PROBE_P99_MS}), longest {max:.0}ms \
             (at most {PROBE_MAX_MS}), {} samples",
            waits.len()
        ),
    }
}

/// The dead letters moved out of their slot at least once: an emptying held them as
/// keepers. A run in which they never moved asserts nothing about keepers.
fn moved(before: &Look, samples: &[Sample]) -> Check {
    let slots = |look: &Look| look.dead.iter().map(|(s, _)| *s).collect::<Vec<_>>();
    let first = slots(before);
    let at = samples
        .iter()
        .find(|s| !s.look.dead.is_empty() && slots(&s.look) != first);
    Check {
        name: "the dead letters' slot is emptied",
        passed: Some(at.is_some()),
        detail: match at {
            Some(s) => format!(
                "moved from slot(s) {} to {} by t={:.0}s",
                before.dead_line(),
                s.look.dead_line(),
                s.at.as_secs_f64()
            ),
            None => format!(
                "still in slot(s) {} after {} window(s) (their slot is due in the fifth)",
                before.dead_line(),
                samples.len()
            ),
        },
    }
}

/// The `p` quantile of `values` (sorted here), µs in, ms out; 0 if there are none.
pub fn quantile_ms(values: &mut [u32], p: f64) -> f64 {
    values.sort_unstable();
    match values.len() {
        0 => 0.0,
        n => f64::from(values[((n - 1) as f64 * p).round() as usize]) / 1000.0,
    }
}
