//! `hookgate dead list|show|replay`: dead letters, and replaying them from this process,
//! one (through the one attempt home, as a shard would) or in bulk (as a job). With
//! `[tracing]` on, each replay is a trace of its own, as a node's is, and the command
//! sends its spans before it ends.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;

use super::args::DeadCommand;
use super::events::show;
use crate::claim::Status;
use crate::config::Config;
use crate::key::EventId;
use crate::metrics::{Metrics, TraceCounters};
use crate::provider::Provider;
use crate::shard::{replay_attempt, Event, Reply, Traced};
use crate::store;
use crate::trace::Tracer;
use crate::worker::{Delivery, HttpDelivery};

pub(super) async fn dead(config: &Config, command: DeadCommand) -> anyhow::Result<()> {
    match command {
        DeadCommand::List { provider, limit } => {
            let store = store::open(&config.store).await?;
            let filter = crate::store::operator::SearchFilter {
                provider,
                status: Some(Status::Dead),
                ..Default::default()
            };
            let page = store.operator().search(&filter, None, limit).await?;
            let dead = &page.rows;
            for r in dead {
                out!(
                    "{}\t{}\t{}\tattempts={}\t{}",
                    r.id.provider,
                    r.id.key,
                    r.dead_reason.as_deref().unwrap_or("-"),
                    r.attempts,
                    r.last_error.as_deref().unwrap_or("-"),
                )?;
            }
            eprintln!("{} dead letter(s)", dead.len());
            if page.scan_stopped {
                eprintln!(
                    "(the search stopped after reading the {} most recently changed rows; \
                     the console and the admin API go on from there)",
                    crate::store::SCAN_BUDGET
                );
            }
            Ok(())
        }
        DeadCommand::Show { provider, key } => {
            show(config, EventId::new(provider, key), true).await
        }
        DeadCommand::Replay {
            provider: Some(provider),
            key: Some(key),
            ..
        } => {
            let line = replay(config, EventId::new(provider, key)).await?;
            out!("{line}")?;
            Ok(())
        }
        DeadCommand::Replay {
            only_provider,
            reason,
            since,
            rate,
            ..
        } => {
            let since = since
                .map(|t| {
                    humantime::parse_rfc3339_weak(&t).with_context(|| format!("--since {t:?}"))
                })
                .transpose()?
                .map(|t| {
                    t.duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64())
                });
            let filter = crate::store::operator::SearchFilter {
                provider: only_provider,
                reason,
                updated_after: since,
                ..Default::default()
            };
            bulk_replay(config, filter, rate).await
        }
    }
}

/// `dead replay --all`: the bulk replay job the admin API starts, created and run here —
/// each dead letter through [`replay`], at most `rate` a second. This process takes its
/// own job by its id and no other; a node that took it first (or took it over, had this
/// process's hold lapsed) runs it while this process follows it to its end, taking it up
/// again should that node's hold lapse. No node runs it at the same time.
pub async fn bulk_replay(
    config: &Config,
    filter: crate::store::operator::SearchFilter,
    rate: f64,
) -> anyhow::Result<()> {
    let filter =
        crate::operator_work::jobs::normalize(filter).context("a bulk replay of dead letters")?;
    anyhow::ensure!(rate.is_finite() && rate > 0.0, "--rate must be above 0");
    let tracing = Tracing::start(config)?;
    let replayed = run_bulk_replay(config, filter, rate, tracing.as_ref()).await;
    if let Some(tracing) = tracing {
        tracing.finish().await;
    }
    replayed
}

/// [`bulk_replay`]'s job, its replays traced by `tracing`.
async fn run_bulk_replay(
    config: &Config,
    filter: crate::store::operator::SearchFilter,
    rate: f64,
    tracing: Option<&Tracing>,
) -> anyhow::Result<()> {
    use crate::operator_work::jobs::{self, ItemOutcome};
    /// How often a job another process runs is looked at: its progress changes about as
    /// often, and half a second is nothing beside a bulk replay.
    const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
    let store = store::open(&config.store).await?;
    let operator = store.operator();
    let total = operator.count(&filter).await?;
    let id = operator
        .create_job(&serde_json::to_string(&filter)?, total, rate)
        .await?;
    eprintln!("replay job {id}: {total} dead letter(s) match");
    let node = crate::node::name();
    let lease = std::time::Duration::from_secs(120);
    let store_ref = &*store;
    let replay_one = |event: EventId| async move {
        match paused(store_ref, &event.provider).await {
            Ok(Some(why)) => return ItemOutcome::Paused(why),
            Ok(None) => {}
            Err(e) => return ItemOutcome::Unavailable(format!("{e:#}")),
        }
        match replay_traced(config, event, tracing).await {
            Ok(line) if line.ends_with("; done") => ItemOutcome::Done,
            Ok(line) => ItemOutcome::Dead(line),
            Err(e) => ItemOutcome::Error(format!("{e:#}")),
        }
    };
    let mut told = false;
    let job = loop {
        if let Some(job) = operator.claim_job_by_id(id, &node, lease).await? {
            // Its own job replays dead letters: it gives nothing to a route.
            let give = |_: EventId, _: String| async {
                ItemOutcome::Skipped("not a job to a route".into())
            };
            jobs::run(&*store, &job, &node, lease, replay_one, give).await?;
        }
        let job = operator.job(id).await?.context("the job is gone")?;
        if job.status != "running" {
            break job;
        }
        if !told {
            eprintln!(
                "replay job {id} is run by {}; following it to its end",
                job.owner.as_deref().unwrap_or("another node")
            );
            told = true;
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    };
    out!(
        "replay job {id}: {} replayed, {} failed of {} ({})",
        job.replayed,
        job.failed,
        job.total,
        job.status
    )?;
    Ok(())
}

/// Replays a dead letter from this process: reopen (of concurrent replays the store lets
/// one win), then run it as one [`Attempt`](crate::shard::Attempt) — the same delivery,
/// judgement and fenced write as a shard's, and for a queue event the same lease renewal
/// (hanging up if it cannot be confirmed), so no scheduler takes the row meanwhile. With
/// tracing on it is a trace of its own, sent before this returns.
pub async fn replay(config: &Config, id: EventId) -> anyhow::Result<String> {
    let tracing = Tracing::start(config)?;
    let replayed = replay_traced(config, id, tracing.as_ref()).await;
    if let Some(tracing) = tracing {
        tracing.finish().await;
    }
    replayed
}

/// [`replay`], its attempt the root of a trace of `tracing`'s.
async fn replay_traced(
    config: &Config,
    id: EventId,
    tracing: Option<&Tracing>,
) -> anyhow::Result<String> {
    let provider = config
        .provider(crate::key::provider_of(&id.provider))
        .with_context(|| format!("no provider {:?} in the config", id.provider))?;
    let horizon = config.sender_horizon(provider);
    let runtime = Provider::from_config(provider, horizon).map_err(anyhow::Error::msg)?;
    // A route's dead letter (its scope, `provider.route`) goes to that route's target.
    let route = runtime
        .routes
        .iter()
        .find(|r| *r.scope == *id.provider)
        .with_context(|| format!("no route {:?} in the config", id.provider))?;
    let store = store::open(&config.store).await?;
    if let Some(why) = paused(&*store, &id.provider).await? {
        anyhow::bail!("{id} not replayed: {why}; resume it to replay its events");
    }
    let lease = config.lease.duration;
    let sent = Instant::now();
    let Some(reopened) = store.replay(&id, lease).await? else {
        match store.lookup(&id).await? {
            Some(r) => anyhow::bail!(
                "{id} is {}, not dead; only dead letters can be replayed",
                r.status.as_str()
            ),
            None => anyhow::bail!("no event {id}"),
        }
    };
    let attempt = replay_attempt(
        Arc::new(Event {
            id: id.clone(),
            body: reopened.payload,
            content_type: reopened.content_type,
            fingerprint: reopened.fingerprint,
            target: Arc::clone(&route.target),
            headers: Default::default(),
            mode: reopened.mode,
            filtered: false,
            others: Vec::new(),
            fingerprinter: None,
            // An operator's replay starts a trace of its own, as a node's does.
            trace: tracing.map(|t| Traced::root(&t.tracer)),
        }),
        reopened.attempts,
        sent,
        lease,
    );
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let delivery = HttpDelivery.deliver(attempt.request());
    let recorded = attempt
        .run(delivery, &*store, &config.retry.policy(), &log)
        .await;
    let attempts = attempt.attempts;
    let answer = attempt.answer(recorded, lease, &Metrics::new(), &log);
    Ok(match answer.reply {
        Reply::Result(result) => format!(
            "replayed {id} (attempt {attempts}): target answered {}; done",
            result.status
        ),
        Reply::DeadLettered => {
            let row = store.lookup(&id).await?;
            let error = row.and_then(|r| r.last_error).unwrap_or_default();
            format!("replayed {id} (attempt {attempts}): {error}; dead again")
        }
        Reply::RetryLater { reason, .. } => anyhow::bail!(
            "replayed {id} (attempt {attempts}): {}; the row is retaken after its lease \
             or can be replayed again",
            reason.as_str()
        ),
        other => anyhow::bail!("replayed {id} (attempt {attempts}): unexpected {other:?}"),
    })
}

/// This process's trace exporter while it replays (`[tracing]` on), started as a node's
/// is; [`Tracing::finish`] sends what is still queued before the command ends.
struct Tracing {
    tracer: Arc<Tracer>,
    counters: TraceCounters,
    /// How long the last flush may wait (`tracing.timeout`).
    within: std::time::Duration,
}

impl Tracing {
    /// The exporter for `config`'s `[tracing]`; `None` while it names no endpoint.
    fn start(config: &Config) -> anyhow::Result<Option<Self>> {
        if config.tracing.endpoint.is_none() {
            return Ok(None);
        }
        let counters = Metrics::new().trace_counters();
        // Its log lines would mix with the command's answer on stdout: what it could not
        // send is told on stderr by `finish`.
        let tracer = crate::trace::start(
            &config.tracing,
            &crate::node::name(),
            counters.clone(),
            crate::logging::discard(),
        )
        .map_err(anyhow::Error::msg)?;
        Ok(Some(Self {
            tracer,
            counters,
            within: config.tracing.timeout,
        }))
    }

    /// Sends every span still queued, waiting at most `tracing.timeout`; says on stderr
    /// how many spans the collector did not take.
    async fn finish(self) {
        self.tracer.flush(self.within).await;
        let lost = self.counters.failed.get() + self.counters.dropped.get();
        if lost > 0 {
            eprintln!(
                "tracing: {lost} span(s) not exported (the collector refused them or did not \
                 answer within {} s)",
                self.within.as_secs()
            );
        }
    }
}

/// Why `provider`'s deliveries are held for every node, if an operator paused it (a
/// target's own pause is a node's, and this process is none).
async fn paused(store: &dyn store::Store, provider: &str) -> anyhow::Result<Option<String>> {
    let paused = store.operator().paused().await?;
    let whole = crate::key::provider_of(provider);
    Ok(paused
        .iter()
        .find(|p| *p == provider || *p == whole)
        .map(|p| format!("provider {p} is paused by an operator")))
}
