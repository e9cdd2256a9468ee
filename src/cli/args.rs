//! The command line's grammar: [`Cli`] and its subcommands, parsed by clap.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::send;
use crate::config::DEFAULT_PATH;

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
    CheckConfig {
        /// Also read the store's rows: how many bodies each key sealed other than the
        /// sealing one (and how many are plaintext); fails when one needs a key that is
        /// not configured.
        #[arg(long)]
        rows: bool,
    },
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
    /// Work on the store's rows.
    Store {
        /// What to do.
        #[command(subcommand)]
        command: StoreCommand,
    },
}

/// `hookgate store ...`
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Seal every stored body under the first `[store.encryption]` key: plaintext ones and
    /// those sealed by older keys. Safe beside live traffic, on several nodes at once, to
    /// interrupt and to run again.
    Rekey {
        /// Rows read per page.
        #[arg(long, default_value_t = crate::operator_work::rekey::DEFAULT_BATCH,
              value_parser = clap::value_parser!(u32).range(1..=10_000))]
        batch: u32,
        /// Rows read a second, at most.
        #[arg(long, default_value_t = crate::operator_work::rekey::DEFAULT_RATE)]
        rate: f64,
        /// Only count what needs sealing anew, by the key that sealed it; change nothing.
        #[arg(long)]
        check: bool,
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
