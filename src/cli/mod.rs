//! The command line: every subcommand is a variant of [`Command`] (`hookgate --help` lists
//! them; `scripts/check-docs.sh` checks each one the documents show).
//!
//! Each command loads the config the same way (`--config FILE`, then env overrides) and
//! fails with a message naming what to fix.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// `println!` for a command's answer, failing with the write's error instead of panicking
/// when stdout has gone (`hookgate events list | head`); `main` ends quietly on a broken
/// pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::claim::Status;
use crate::config::{Config, DEFAULT_PATH};
use crate::http::event_json;
use crate::key::EventId;
use crate::metrics::Metrics;
use crate::provider::Provider;
use crate::shard::{replay_attempt, Event, Reply};
use crate::startup::Application;
use crate::store;
use crate::worker::{Delivery, HttpDelivery};

mod check;
mod send;

/// hookgate: claim before work, one record, every attempt labelled.
#[derive(Debug, Parser)]
#[command(name = "hookgate", version, about)]
pub struct Cli {
    /// Config file (TOML); `HOOKGATE_<SECTION>__<KEY>` env vars override its keys.
    #[arg(long, global = true, default_value = DEFAULT_PATH)]
    pub config: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the receiver until SIGTERM or SIGINT.
    Serve,
    /// Validate the config, print it (secrets redacted) and the rules it checked.
    CheckConfig,
    /// Create or upgrade the store's schema.
    Migrate {
        /// Apply only the steps that nodes of the previous release run beside (on
        /// Postgres: a column with a default, a check, unique indexes built concurrently,
        /// however long the tables), then stop: the last step, which the new version's
        /// nodes apply at start in a moment, needs the old nodes stopped.
        #[arg(long)]
        online: bool,
    },
    /// Post a test event signed with the provider's secret and scheme to this node.
    Send(send::SendArgs),
    /// Read and replay dead letters.
    Dead {
        /// What to do.
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// Inspect events.
    Events {
        /// What to inspect.
        #[command(subcommand)]
        command: EventsCommand,
    },
}

/// `hookgate dead ...`
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead letters, newest first.
    List {
        /// Only this provider's.
        #[arg(long)]
        provider: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Print one dead letter with its payload and headers.
    Show {
        /// The provider's name.
        provider: String,
        /// The idempotency key.
        key: String,
    },
    /// Deliver a dead letter once more (path `replay`); it ends done, or dead again. With
    /// `--all`, every dead letter the filter matches, as one bulk replay job.
    Replay {
        /// The provider's name.
        #[arg(required_unless_present = "all")]
        provider: Option<String>,
        /// The idempotency key.
        #[arg(required_unless_present = "all")]
        key: Option<String>,
        /// Replay every dead letter matching `--provider`, `--reason` and `--since`.
        #[arg(long, conflicts_with_all = ["provider", "key"])]
        all: bool,
        /// With `--all`: only this provider's.
        #[arg(long = "provider", requires = "all")]
        only_provider: Option<String>,
        /// With `--all`: only dead letters of this reason.
        #[arg(long, requires = "all")]
        reason: Option<String>,
        /// With `--all`: only those that died at or after this instant (RFC 3339).
        #[arg(long, requires = "all")]
        since: Option<String>,
        /// With `--all`: replays a second at most.
        #[arg(long, default_value_t = 10.0, requires = "all")]
        rate: f64,
    },
}

/// `hookgate events ...`
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Rows by status, least recently changed first: what is stuck.
    List {
        /// Only this provider's.
        #[arg(long)]
        provider: Option<String>,
        /// Only this status: queued, in_progress, done, failed or dead.
        #[arg(long)]
        status: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Print one event's latest attempts, oldest first: its timeline.
    History {
        /// The provider's name.
        provider: String,
        /// The idempotency key.
        key: String,
        /// At most this many attempts (the latest; at most 500).
        #[arg(long, default_value_t = crate::store::operator::HISTORY_PAGE)]
        limit: u32,
        /// Only attempts numbered below this one (older ones).
        #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
        before: Option<i32>,
    },
    /// Print one event's row.
    Show {
        /// The provider's name.
        provider: String,
        /// The idempotency key.
        key: String,
    },
}

/// Parses the command line and runs it.
pub async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig => {
            return check::check_config(&Config::load_unchecked(&cli.config)?).await
        }
        // Only `[store]` matters: providers need not be valid, nor their secrets set.
        Command::Migrate { online } => {
            let mut config = Config::load_unchecked(&cli.config)?;
            config.settle();
            return migrate(&config, online).await;
        }
        _ => {}
    }
    let config = Config::load(&cli.config)?;
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Send(args) => send::send(&config, args).await,
        Command::CheckConfig | Command::Migrate { .. } => Ok(()),
        Command::Events {
            command: EventsCommand::Show { provider, key },
        } => show(&config, EventId::new(provider, key), false).await,
        Command::Events {
            command:
                EventsCommand::History {
                    provider,
                    key,
                    limit,
                    before,
                },
        } => {
            let id = EventId::new(provider, key);
            for line in history(&config, id, before, limit).await? {
                out!("{line}")?;
            }
            Ok(())
        }
        Command::Events {
            command:
                EventsCommand::List {
                    provider,
                    status,
                    limit,
                },
        } => {
            for line in list(&config, provider.as_deref(), status.as_deref(), limit).await? {
                out!("{line}")?;
            }
            Ok(())
        }
        Command::Dead { command } => dead(&config, command).await,
    }
}

async fn migrate(config: &Config, online: bool) -> anyhow::Result<()> {
    let store = store::open(&config.store)
        .await
        .with_context(|| format!("opening {}", config.store.redacted_url()))?;
    let on_wait = |wait: &crate::store::MigrationWait| {
        eprintln!(
            "a table is locked by another transaction ({}); trying again in {} ms (try {})",
            wait.error,
            wait.retry_in.as_millis(),
            wait.attempt
        );
    };
    if online {
        store
            .migrate_online(&on_wait)
            .await
            .context("migrating the store (online steps)")?;
        out!(
            "applied the online steps to {}; stop the older nodes, then start this version",
            config.store.redacted_url()
        )?;
        return Ok(());
    }
    store
        .migrate_reporting(&on_wait)
        .await
        .context("migrating the store")?;
    out!("migrated {}", config.store.redacted_url())?;
    Ok(())
}

async fn show(config: &Config, id: EventId, dead_only: bool) -> anyhow::Result<()> {
    let store = store::open(&config.store).await?;
    match store.operator().event(&id).await? {
        Some(record) if dead_only && record.status != Status::Dead => {
            anyhow::bail!("{id} is {}, not a dead letter", record.status.as_str())
        }
        Some(record) => {
            out!("{}", serde_json::to_string_pretty(&event_json(&record))?)?;
            Ok(())
        }
        None => anyhow::bail!("no event {id}"),
    }
}

/// `events list`: one line a row, least recently changed first — provider, key, status,
/// mode, attempts, age, last error.
pub async fn list(
    config: &Config,
    provider: Option<&str>,
    status: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<String>> {
    let status = match status {
        Some(text) => Some(Status::parse(text).with_context(|| {
            format!("unknown status {text:?} (queued, in_progress, done, failed or dead)")
        })?),
        None => None,
    };
    let store = store::open(&config.store).await?;
    let rows = store.list(provider, status, limit).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    Ok(rows
        .iter()
        .map(|r| {
            format!(
                "{}\t{}\t{}\t{}\tattempts={}\tage={}s\t{}",
                r.id.provider,
                r.id.key,
                r.status.as_str(),
                r.mode,
                r.attempts,
                (now - r.created_at).max(0.0).round(),
                r.last_error.as_deref().unwrap_or("-"),
            )
        })
        .collect())
}

async fn dead(config: &Config, command: DeadCommand) -> anyhow::Result<()> {
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

/// `events history`: one line an attempt, oldest first, the latest `limit` (at most
/// [`MAX_HISTORY_PAGE`](crate::store::operator::MAX_HISTORY_PAGE)) numbered below `before`;
/// then how many older ones it did not show.
pub async fn history(
    config: &Config,
    id: EventId,
    before: Option<i32>,
    limit: u32,
) -> anyhow::Result<Vec<String>> {
    let store = store::open(&config.store).await?;
    let Some(row) = store.operator().event(&id).await? else {
        anyhow::bail!("no event {id}");
    };
    let limit = limit.clamp(1, crate::store::operator::MAX_HISTORY_PAGE);
    let page = store.operator().history(&id, before, limit).await?;
    let attempts = &page.attempts;
    let mut lines = vec![format!(
        "{id}: {} after {} attempt(s), last path {}",
        row.status.as_str(),
        row.attempts,
        row.last_path.map_or("-", |p| p.as_str())
    )];
    if attempts.is_empty() && row.attempts > 0 {
        lines.push("  (no history rows: a first run that ended done tells its story whole)".into());
    }
    for a in attempts {
        let json = crate::http::attempt_json(a);
        lines.push(format!(
            "  #{} {} {} on {} at {} ({} ms){}{}{}",
            a.attempt,
            a.path,
            a.outcome,
            a.node,
            json["started_at"].as_str().unwrap_or("-"),
            json["duration_ms"],
            a.target_status
                .map(|s| format!(", target {s}"))
                .unwrap_or_default(),
            a.error
                .as_deref()
                .map(|e| format!(", {e}"))
                .unwrap_or_default(),
            a.answer
                .as_deref()
                .map(|t| format!(", answered {:?}", t.chars().take(80).collect::<String>()))
                .unwrap_or_default(),
        ));
    }
    if let Some(older) = page.before {
        lines.push(format!(
            "  ({} of {} history row(s) shown; older ones: --before {older})",
            attempts.len(),
            page.total
        ));
    }
    Ok(lines)
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
    use crate::operator_work::jobs::{self, ItemOutcome};
    /// How often a job another process runs is looked at: its progress changes about as
    /// often, and half a second is nothing beside a bulk replay.
    const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
    let filter = jobs::normalize(filter).context("a bulk replay of dead letters")?;
    anyhow::ensure!(rate.is_finite() && rate > 0.0, "--rate must be above 0");
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
        match replay(config, event).await {
            Ok(line) if line.ends_with("; done") => ItemOutcome::Done,
            Ok(line) => ItemOutcome::Dead(line),
            Err(e) => ItemOutcome::Error(format!("{e:#}")),
        }
    };
    let mut told = false;
    let job = loop {
        if let Some(job) = operator.claim_job_by_id(id, &node, lease).await? {
            jobs::run(&*store, &job, &node, lease, replay_one).await?;
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
/// (hanging up if it cannot be confirmed), so no scheduler takes the row meanwhile.
pub async fn replay(config: &Config, id: EventId) -> anyhow::Result<String> {
    let provider = config
        .provider(&id.provider)
        .with_context(|| format!("no provider {:?} in the config", id.provider))?;
    let horizon = config.sender_horizon(provider);
    let runtime = Provider::from_config(provider, horizon).map_err(anyhow::Error::msg)?;
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
            target: runtime.target,
            headers: Default::default(),
            mode: reopened.mode,
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

/// Why `provider`'s deliveries are held for every node, if an operator paused it (a
/// target's own pause is a node's, and this process is none).
async fn paused(store: &dyn store::Store, provider: &str) -> anyhow::Result<Option<String>> {
    let paused = store.operator().paused().await?;
    Ok(paused
        .iter()
        .any(|p| p == provider)
        .then(|| format!("provider {provider} is paused by an operator")))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let (log, _guard) = crate::logging::init(&config.log)?;
    crate::logging::install_panic_hook(log.clone());
    for p in &config.providers {
        for secret in p.secrets.iter().filter(|s| s.demo_in_use()) {
            slog::warn!(log, "config.demo_secret"; "provider" => &p.name, "env" => &secret.env,
                "message" => "the public demo secret from the config signs this provider's events");
        }
    }
    let store = store::open(&config.store).await?;
    let on_wait = |wait: &crate::store::MigrationWait| {
        slog::warn!(log, "store.migration_waiting"; "attempt" => wait.attempt,
            "retry_in_ms" => u64::try_from(wait.retry_in.as_millis()).unwrap_or(u64::MAX),
            "error" => &wait.error);
    };
    store
        .migrate_reporting(&on_wait)
        .await
        .with_context(|| format!("migrating {}", config.store.redacted_url()))?;
    let app = Application::build(&config, store, Arc::new(HttpDelivery), log).await?;
    app.run_until_stopped().await
}
