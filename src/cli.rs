//! The command line: `serve`, `check-config`, `migrate`, `events show`.
//!
//! Each command loads the config the same way (`--config FILE`, then env overrides) and
//! fails with a message naming what to fix.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::config::{Config, DEFAULT_PATH};
use crate::key::EventId;
use crate::startup::Application;
use crate::store::{self, EventRecord};
use crate::worker::HttpDelivery;

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
    Migrate,
    /// Inspect events.
    Events {
        /// What to inspect.
        #[command(subcommand)]
        command: EventsCommand,
    },
}

/// `hookgate events ...`
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
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
    let config = Config::load(&cli.config)?;
    match cli.command {
        Command::Serve => serve(config).await,
        Command::CheckConfig => {
            check_config(&config);
            Ok(())
        }
        Command::Migrate => {
            let store = store::open(&config.store).await?;
            store.migrate().await.context("migrating the store")?;
            println!("migrated {}", config.store.redacted_url());
            Ok(())
        }
        Command::Events {
            command: EventsCommand::Show { provider, key },
        } => {
            let store = store::open(&config.store).await?;
            let id = EventId::new(provider, key);
            match store.lookup(&id).await? {
                Some(record) => {
                    println!("{}", serde_json::to_string_pretty(&record_json(&record))?);
                    Ok(())
                }
                None => anyhow::bail!("no event {id}"),
            }
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let (log, _guard) = crate::logging::init(&config.log)?;
    crate::logging::install_panic_hook(log.clone());
    let store = store::open(&config.store).await?;
    store
        .migrate()
        .await
        .with_context(|| format!("migrating {}", config.store.redacted_url()))?;
    let app = Application::build(&config, store, Arc::new(HttpDelivery), log).await?;
    app.run_until_stopped().await
}

fn check_config(config: &Config) {
    println!("# effective configuration (secrets redacted)\n{config:#?}\n");
    println!("# rules checked");
    for rule in config.validate().unwrap_or_default() {
        println!("{rule}");
    }
}

fn record_json(r: &EventRecord) -> serde_json::Value {
    let time = |secs: f64| {
        humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(secs.max(0.0)),
        )
        .to_string()
    };
    serde_json::json!({
        "provider": &*r.id.provider,
        "event_key": &*r.id.key,
        "status": r.status.as_str(),
        "attempts": r.attempts,
        "last_path": r.last_path.map(|p| p.as_str()),
        "fingerprint": r.fingerprint,
        "result_status": r.result.as_ref().map(|x| x.status),
        "payload_bytes": r.payload.as_ref().map(Vec::len),
        "last_error": r.last_error,
        "dead_reason": r.dead_reason,
        "lease_left_s": r.lease_left.as_secs_f64(),
        "created_at": time(r.created_at),
        "updated_at": time(r.updated_at),
    })
}
