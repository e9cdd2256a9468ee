//! One case of the runner-faults generator: its keys, weather and targets, and its runners
//! — each a node's store behind the chaos wrapper — taking, claiming and replaying, every
//! attempt run through `Attempt::run` as the shard and the command line run it.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use hookgate::claim::{ClaimResult, Mode};
use hookgate::key::EventId;
use hookgate::outcome::Verdict;
use hookgate::provider::Target;
use hookgate::retry::RetryPolicy;
use hookgate::shard::{replay_attempt, Attempt, Event, Recorded};
use hookgate::store::{Fenced, Store, Taken};
use tokio::sync::Notify;

use crate::helpers::{AttemptNote, Backend, ChaosStore, Journal, Outage, Weather, PROVIDER};

use super::script::{deliver, Reply, Script};
use super::{CHAOS, LEASE, QUEUE_TIMEOUT, REPLAYS, SYNC_TIMEOUT};

/// One case's parameters and what its runners share.
pub(super) struct Case {
    pub(super) seed: u64,
    pub(super) backend: Backend,
    /// Key names, and whether each is a queue key (else sync).
    pub(super) keys: Vec<(String, bool)>,
    pub(super) weather: Weather,
    pub(super) crash_percent: u32,
    pub(super) policy: RetryPolicy,
    pub(super) journal: Arc<Journal>,
    pub(super) queue_target: Arc<Target>,
    pub(super) sync_target: Arc<Target>,
    pub(super) chaos: Cell<bool>,
    pub(super) replays_left: Cell<u32>,
    pub(super) log: slog::Logger,
}

pub(super) struct Runner {
    pub(super) index: usize,
    pub(super) store: Arc<ChaosStore>,
    pub(super) rng: fastrand::Rng,
}

fn target(timeout: Duration) -> Arc<Target> {
    Arc::new(Target {
        url: "http://target.invalid/".into(),
        timeout,
        keep_headers: Vec::new(),
        signing_key: None,
        tls: None,
        horizon: Duration::from_secs(3600),
        keep_payload: false,
        filter: None,
    })
}

impl Case {
    pub(super) fn new(backend: Backend, seed: u64) -> (Self, usize) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let n = rng.usize(2..=4);
        let mut keys: Vec<(String, bool)> = (0..n)
            .map(|i| (format!("k{i}"), rng.u32(0..100) < 70))
            .collect();
        keys[0].1 = true;
        let runners = rng.usize(2..=3);
        let case = Self {
            seed,
            backend,
            keys,
            weather: Weather {
                rate: 0.1 + rng.f64() * 0.35,
                lease: LEASE,
            },
            crash_percent: rng.u32(0..=35),
            policy: RetryPolicy::new(Duration::from_secs(1), 1.0, Duration::from_secs(2), 0.0, 4),
            journal: Arc::new(Journal::default()),
            queue_target: target(QUEUE_TIMEOUT),
            sync_target: target(SYNC_TIMEOUT),
            chaos: Cell::new(true),
            replays_left: Cell::new(REPLAYS),
            log: hookgate::logging::discard(),
        };
        (case, runners)
    }

    pub(super) fn describe(&self, runners: usize) -> String {
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|(k, q)| format!("{k} {}", if *q { "queue" } else { "sync" }))
            .collect();
        format!(
            "{:?}, seed {}: keys [{}], {runners} runners, fault rate {:.2}, kills after {} % \
             of 2xx, lease {} ms",
            self.backend,
            self.seed,
            keys.join(", "),
            self.weather.rate,
            self.crash_percent,
            LEASE.as_millis()
        )
    }

    /// A runner's outage, if it has one (four runners in five): somewhere in the contention, between 0.6 and 1.6
    /// leases long, its calls refused or held throughout.
    pub(super) fn outage(&self, rng: &mut fastrand::Rng) -> Option<Outage> {
        if rng.u32(0..100) >= 80 {
            return None;
        }
        let from = self.journal.start + CHAOS.mul_f64(rng.f64() * 0.9);
        let until = from + LEASE.mul_f64(0.6 + rng.f64());
        let hold = rng.bool();
        let ms = |t: Instant| self.journal.ms(t);
        let kind = if hold { "held" } else { "refused" };
        self.journal.note(format!(
            "outage planned: {} .. {} ms, calls {kind}",
            ms(from),
            ms(until)
        ));
        Some(Outage { from, until, hold })
    }

    fn event(&self, id: EventId, body: Bytes, content_type: Option<String>, mode: Mode) -> Event {
        let target = match mode {
            Mode::Queue => &self.queue_target,
            Mode::Sync => &self.sync_target,
        };
        Event {
            id,
            body,
            content_type,
            fingerprint: None,
            target: Arc::clone(target),
            headers: Default::default(),
            mode,
            filtered: false,
            others: Vec::new(),
            fingerprinter: None,
            trace: None,
        }
    }

    /// One action of a runner: take a due queue row, claim a sync key, or replay a key
    /// that may be a dead letter (while faults last).
    pub(super) async fn step(&self, r: &mut Runner) {
        let roll = r.rng.u32(0..100);
        let sync: Vec<&String> = self.keys.iter().filter(|k| !k.1).map(|k| &k.0).collect();
        if roll >= 75 && self.chaos.get() && self.replays_left.get() > 0 {
            let key = self.keys[r.rng.usize(..self.keys.len())].0.clone();
            self.replay(r, &key).await;
        } else if roll >= 60 && !sync.is_empty() {
            let key = sync[r.rng.usize(..sync.len())].clone();
            self.claim(r, &key).await;
        } else if r.rng.bool() {
            // As a node's scheduler takes rows: the due ones, in one statement.
            let sent = Instant::now();
            let Ok(taken) = r.store.take_due(PROVIDER, 1, LEASE, &[]).await else {
                return;
            };
            if let Some(taken) = taken.into_iter().next() {
                self.run_taken(r, taken, sent).await;
            }
        } else {
            let Ok(due) = r.store.due(PROVIDER, 10).await else {
                return;
            };
            if !due.is_empty() {
                let id = due[r.rng.usize(..due.len())].clone();
                self.take(r, id).await;
            }
        }
    }

    /// Takes a due queue row and runs its attempt, as a shard's `answer_take` builds it.
    pub(super) async fn take(&self, r: &mut Runner, id: EventId) {
        let sent = Instant::now();
        let Ok(Some(taken)) = r.store.take(&id, LEASE).await else {
            return;
        };
        self.run_taken(r, taken, sent).await;
    }

    /// Runs the attempt of a taken row, as a shard builds it.
    async fn run_taken(&self, r: &mut Runner, taken: Taken, sent: Instant) {
        let event = self.event(taken.id, taken.payload, taken.content_type, Mode::Queue);
        let horizon_left = event.target.horizon.saturating_sub(taken.age);
        let attempt = Attempt::held(Arc::new(event), taken.attempts, taken.path, sent, LEASE)
            .renewed(LEASE, taken.tries, horizon_left);
        self.run(r, attempt, true).await;
    }

    /// Claims a sync key (a sender's delivery) and runs its attempt if won.
    pub(super) async fn claim(&self, r: &mut Runner, key: &str) {
        let id = EventId::new(PROVIDER, key);
        let sent = Instant::now();
        let Ok(ClaimResult::Won { attempts, path }) = r.store.claim(&id, None, LEASE, None).await
        else {
            return;
        };
        let body = Bytes::from(format!(r#"{{"id":"{key}"}}"#));
        let event = self.event(id, body, Some("application/json".into()), Mode::Sync);
        let attempt = Attempt::held(Arc::new(event), attempts, path, sent, LEASE);
        self.run(r, attempt, true).await;
    }

    /// Replays a key if it is a dead letter: half the time as the command line does (no
    /// worker, so no late-start check), half as the admin API does (through a worker).
    async fn replay(&self, r: &mut Runner, key: &str) {
        let id = EventId::new(PROVIDER, key);
        let sent = Instant::now();
        let Ok(Some(row)) = r.store.replay(&id, LEASE).await else {
            return;
        };
        self.replays_left
            .set(self.replays_left.get().saturating_sub(1));
        let event = self.event(id, row.payload, row.content_type, row.mode);
        let attempt = replay_attempt(Arc::new(event), row.attempts, sent, LEASE);
        let through_a_worker = r.rng.bool();
        self.run(r, attempt, through_a_worker).await;
    }

    /// Runs one won attempt through `Attempt::run` with a scripted delivery; kills the
    /// runner after the target's 2xx when the dice say so.
    async fn run(&self, r: &mut Runner, attempt: Attempt, through_a_worker: bool) {
        let chaos = self.chaos.get();
        let script = Script::draw(&mut r.rng, chaos);
        let kill =
            chaos && matches!(script.reply, Reply::Ok) && r.rng.u32(0..100) < self.crash_percent;
        let restart = Duration::from_millis(r.rng.u64(0..300));
        let note = self.journal.began(AttemptNote {
            runner: r.index,
            key: attempt.event.id.key.to_string(),
            attempts: attempt.attempts,
            queue: attempt.renew.is_some(),
            path: attempt.path.as_str(),
            began: Instant::now(),
            lease_ends: attempt.lease_ends,
            ended: None,
            crashed: None,
            result: "running".into(),
        });
        let killed = Notify::new();
        let delivery = deliver(
            &self.journal,
            r.index,
            &attempt.event.id.key,
            attempt.request(),
            through_a_worker.then(|| attempt.start_by()),
            script,
            kill.then_some((&*r.store, &killed)),
        );
        let run = attempt.run(delivery, &*r.store, &self.policy, &self.log);
        tokio::select! {
            biased;
            () = killed.notified() => {
                self.journal.crashed(note);
                tokio::time::sleep(restart).await;
                r.store.revive();
            }
            recorded = run => self.journal.ended(note, recorded_text(&recorded)),
        }
    }
}

fn recorded_text(recorded: &Recorded) -> String {
    let verdict = match &recorded.verdict {
        Verdict::Done(_) => "done".to_owned(),
        Verdict::Retry { error, .. } => format!("retry ({error})"),
        Verdict::Dead { reason, .. } => format!("dead ({})", reason.as_str()),
        Verdict::Throttled { .. } => "throttled".to_owned(),
        Verdict::Release { error } => format!("release ({error})"),
        Verdict::Unknown { error } => format!("unknown ({error})"),
    };
    let written = match &recorded.written {
        None => "nothing written".to_owned(),
        Some(Ok(Fenced::Applied)) => "written".to_owned(),
        Some(Ok(Fenced::Stale)) => "stale".to_owned(),
        Some(Err(e)) => format!("NOT written: {e}"),
    };
    format!("{verdict}, {written}")
}
