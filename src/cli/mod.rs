//! The command line: every subcommand is a variant of [`Command`] (`hookgate --help` lists
//! them; `scripts/check-docs.sh` checks each one the documents show).
//!
//! Each command loads the config the same way (`--config FILE`, then env overrides) and
//! fails with a message naming what to fix. This file only re-exports (and defines the
//! `out!` its commands print with, which must come before them).

/// `println!` for a command's answer, failing with the write's error instead of panicking
/// when stdout has gone (`hookgate events list | head`); `main` ends quietly on a broken
/// pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod args;
mod check;
mod dead;
mod events;
mod rekey;
mod run;
mod send;

pub use args::{Cli, Command, DeadCommand, EventsCommand, StoreCommand};
pub use dead::{bulk_replay, replay};
pub use events::{history, list};
pub use run::run;
