//! Structured logs: one JSON object a line on stdout (or human-readable lines), written
//! in batches by a background thread (`writer`) so that a slow stdout never stalls
//! request handling. Every event name, with its meaning, is in [`EVENTS`]. Callers must
//! never log a payload or a secret.

use std::str::FromStr;

use slog::{o, Drain, Level, Logger};

use crate::config::{LogConfig, LogFormat};

mod events;
mod writer;

pub use events::EVENTS;
pub use writer::dropped_total;

/// Lines buffered for the writer thread; beyond that, lines are dropped and the drop is
/// reported, because blocking a shard on stdout would be worse than losing a log line.
const CHANNEL_SIZE: usize = 16 * 1024;

/// Keeps the writer thread alive; dropping it writes the last lines.
pub struct LogGuard(#[allow(dead_code)] writer::Guard);

/// The level `log.level` names, or why it names none (`init` and `check-config` both ask).
pub fn level(config: &LogConfig) -> Result<Level, String> {
    Level::from_str(&config.level).map_err(|()| {
        format!(
            "log.level {:?} is not a level (critical, error, warning, info, debug, trace)",
            config.level
        )
    })
}

/// Builds the root logger described by `[log]`.
pub fn init(config: &LogConfig) -> anyhow::Result<(Logger, LogGuard)> {
    let level = level(config).map_err(anyhow::Error::msg)?;
    let format = config.format;
    let format = move |lines: writer::Lines| -> Box<dyn Drain<Ok = (), Err = slog::Never>> {
        match format {
            LogFormat::Json => Box::new(
                slog_json::Json::new(lines)
                    .add_default_keys()
                    .build()
                    .fuse(),
            ),
            LogFormat::Term => {
                let decorator = slog_term::PlainDecorator::new(lines);
                Box::new(slog_term::FullFormat::new(decorator).build().fuse())
            }
        }
    };
    let (drain, guard) = writer::start(format, std::io::stdout(), CHANNEL_SIZE)?;
    // The level is checked on the caller's thread: a record below it is dropped there,
    // never copied into the channel nor woken the writer thread for.
    let log = Logger::root(
        drain.filter_level(level).fuse(),
        o!("service" => "hookgate"),
    );
    Ok((log, LogGuard(guard)))
}

/// A logger that writes nothing (tests, benches).
pub fn discard() -> Logger {
    Logger::root(slog::Discard, o!())
}

/// Routes panic messages through the logger as one JSON line instead of raw stderr.
pub fn install_panic_hook(log: Logger) {
    std::panic::set_hook(Box::new(move |info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        slog::crit!(log, "panic"; "message" => message, "location" => location,
            "thread" => std::thread::current().name().unwrap_or("unnamed").to_owned());
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_below_the_level_are_dropped_before_the_writer_thread() {
        let config = LogConfig {
            level: "warning".into(),
            ..LogConfig::default()
        };
        let (log, _guard) = init(&config).unwrap();
        assert!(!log.is_enabled(Level::Info));
        assert!(log.is_enabled(Level::Warning));
    }
}
