//! Parsing the command line and running its command; `serve` (a node) and `migrate`.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;

use super::args::{Cli, Command, EventsCommand, StoreCommand};
use super::dead::dead;
use super::events::{history, list, show};
use super::{check, rekey, send};
use crate::config::Config;
use crate::key::EventId;
use crate::startup::Application;
use crate::store;
use crate::worker::HttpDelivery;

/// Parses the command line and runs it.
pub async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { rows } => {
            return check::check_config(&Config::load_unchecked(&cli.config)?, rows).await
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
        Command::CheckConfig { .. } | Command::Migrate { .. } => Ok(()),
        Command::Store {
            command: StoreCommand::Rekey { batch, rate, check },
        } => rekey::rekey(&config, batch, rate, check).await,
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
