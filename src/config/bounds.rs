//! Every number in the config has bounds: durations and counts an upper one (no setting
//! can overflow a sum of instants, build a million actors, or make the database reject a
//! timestamp), floats must be finite. One failing rule per setting out of bounds, naming
//! its key; one passing rule when all are in.

use std::time::Duration;

use super::rule::{rule, show, Rule};
use super::settings::Config;

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// A duration setting and the longest it may be.
struct Within {
    key: String,
    value: Duration,
    max: Duration,
}

/// A count setting and the largest it may be.
struct Counted {
    key: String,
    value: u64,
    max: u64,
}

fn within(key: impl Into<String>, value: Duration, max: Duration) -> Within {
    Within {
        key: key.into(),
        value,
        max,
    }
}

fn counted(key: impl Into<String>, value: impl TryInto<u64>, max: u64) -> Counted {
    Counted {
        key: key.into(),
        value: value.try_into().unwrap_or(u64::MAX),
        max,
    }
}

/// The bounds rules of `config`.
pub(super) fn bounds_rules(config: &Config) -> Vec<Rule> {
    let (s, r) = (&config.server, &config.retry);
    let mut durations = vec![
        within("server.admission_wait", s.admission_wait, MINUTE),
        within("server.read_timeout", s.read_timeout, 10 * MINUTE),
        within("server.keep_alive", s.keep_alive, 10 * MINUTE),
        within("store.pool_timeout", config.store.pool_timeout, 10 * MINUTE),
        within(
            "store.statement_timeout",
            config.store.deadline(),
            10 * MINUTE,
        ),
        within("lease.duration", config.lease.duration, DAY),
        within("retry.base", r.base, 7 * DAY),
        within("retry.cap", r.cap, 30 * DAY),
        within("retry.sender_horizon", r.sender_horizon, 365 * DAY),
        within("queue.poll_interval", config.queue.poll_interval, HOUR),
        within("queue.max_target_pause", config.queue.max_target_pause, DAY),
        within("shutdown.grace", config.shutdown.grace, HOUR),
        within("admin.stats_max_age", config.admin.stats_max_age, HOUR),
        within("retention.done", config.retention.done, 3650 * DAY),
        within("retention.dead", config.retention.dead, 3650 * DAY),
        within(
            "retention.sweep_interval",
            config.retention.sweep_interval,
            DAY,
        ),
    ];
    let mut counts = vec![
        counted("server.shards", s.shard_count(), 1024),
        counted("server.workers_per_shard", s.workers_per_shard, 4096),
        counted(
            "server.admission_queue",
            s.admission_queue.unwrap_or(0),
            1 << 20,
        ),
        counted("server.max_connections", s.max_connections, 1 << 20),
        counted("server.mailbox_capacity", s.mailbox_capacity, 1 << 20),
        counted("server.max_body_bytes", s.max_body_bytes, 64 << 20),
        counted(
            "server.max_body_bytes_in_flight",
            s.max_body_bytes_in_flight,
            64 << 30,
        ),
        counted("server.http_workers", s.http_workers.unwrap_or(1), 256),
        counted("store.pool_size", config.store.pool_size, 1024),
        counted(
            "store.operator_pool_size",
            config.store.operator_pool_size,
            1024,
        ),
        // A billion keys: about 1.2 GB of memory per node.
        counted(
            "store.slot_filter_keys",
            config.store.slot_filter_keys,
            1_000_000_000,
        ),
        counted("retry.max_attempts", r.max_attempts, 1000),
        counted("cache.capacity", config.cache.capacity, 100_000_000),
        counted("cache.max_bytes", config.cache.max_bytes, 64 << 30),
        counted(
            "retention.sweep_batch",
            config.retention.sweep_batch,
            100_000,
        ),
    ];
    let mut floats = vec![
        ("retry.factor".to_owned(), r.factor, 1.0, 10.0),
        ("retry.jitter".to_owned(), r.jitter, 0.0, 1.0),
    ];
    for p in &config.providers {
        let key = |k: &str| format!("providers.{}.{k}", p.name);
        durations.push(within(key("target.timeout"), p.target.timeout, HOUR));
        if let Some(t) = p.tolerance {
            durations.push(within(key("tolerance"), t, DAY));
        }
        if let Some(h) = p.sender_horizon {
            durations.push(within(key("sender_horizon"), h, 365 * DAY));
        }
        if let Some(n) = p.target.max_in_flight {
            counts.push(counted(key("target.max_in_flight"), n, 1 << 20));
        }
        if let Some(rate) = p.target.max_rate {
            floats.push((key("target.max_rate"), rate, f64::MIN_POSITIVE, 1e6));
        }
    }
    let mut broken: Vec<Rule> = Vec::new();
    for d in &durations {
        if d.value > d.max {
            let detail = format!("{} = {}: at most {}", d.key, show(d.value), show(d.max));
            broken.push(rule(format!("{} <= {}", d.key, show(d.max)), false, detail));
        }
    }
    for c in &counts {
        if c.value > c.max {
            let detail = format!("{} = {}: at most {}", c.key, c.value, c.max);
            broken.push(rule(format!("{} <= {}", c.key, c.max), false, detail));
        }
    }
    for (key, value, low, high) in &floats {
        if !value.is_finite() || value < low || value > high {
            let detail = format!("{key} = {value}: a finite number from {low} to {high}");
            broken.push(rule(format!("{key} finite, {low}..={high}"), false, detail));
        }
    }
    if broken.is_empty() {
        let n = durations.len() + counts.len() + floats.len();
        vec![rule(
            "every number within its bounds",
            true,
            format!("{n} numeric settings checked"),
        )]
    } else {
        broken
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    /// Every numeric setting, as `(section, key, kind)`; `kind` picks the values tried.
    const SETTINGS: &[(&str, &str, Kind)] = &[
        ("server", "shards", Kind::Count),
        ("server", "workers_per_shard", Kind::Count),
        ("server", "admission_queue", Kind::Count),
        ("server", "admission_wait", Kind::Duration),
        ("server", "read_timeout", Kind::Duration),
        ("server", "keep_alive", Kind::Duration),
        ("server", "max_connections", Kind::Count),
        ("server", "mailbox_capacity", Kind::Count),
        ("server", "max_body_bytes", Kind::Count),
        ("server", "max_body_bytes_in_flight", Kind::Count),
        ("server", "http_workers", Kind::Count),
        ("store", "pool_size", Kind::Count),
        ("store", "operator_pool_size", Kind::Count),
        ("store", "pool_timeout", Kind::Duration),
        ("store", "statement_timeout", Kind::Duration),
        ("lease", "duration", Kind::Duration),
        ("retry", "base", Kind::Duration),
        ("retry", "factor", Kind::Float),
        ("retry", "cap", Kind::Duration),
        ("retry", "jitter", Kind::Float),
        ("store", "slot_filter_keys", Kind::Count),
        ("retry", "max_attempts", Kind::Count),
        ("retry", "sender_horizon", Kind::Duration),
        ("cache", "capacity", Kind::Count),
        ("cache", "max_bytes", Kind::Count),
        ("queue", "poll_interval", Kind::Duration),
        ("queue", "max_target_pause", Kind::Duration),
        ("shutdown", "grace", Kind::Duration),
        ("admin", "stats_max_age", Kind::Duration),
        ("retention", "done", Kind::Duration),
        ("retention", "dead", Kind::Duration),
        ("retention", "sweep_interval", Kind::Duration),
        ("retention", "sweep_batch", Kind::Count),
    ];

    #[derive(Clone, Copy)]
    enum Kind {
        Count,
        Duration,
        Float,
    }

    fn value(kind: Kind, rng: &mut fastrand::Rng) -> String {
        match kind {
            Kind::Count => {
                let picks = [
                    "0",
                    "1",
                    "7",
                    "65536",
                    "4294967295",
                    "18446744073709551615",
                    "-1",
                ];
                picks[rng.usize(..picks.len())].to_owned()
            }
            Kind::Duration => {
                let picks = [
                    "0s",
                    "1ms",
                    "3s",
                    "45s",
                    "10m",
                    "7d",
                    "36500d",
                    "18446744073709551615s",
                    "nonsense",
                ];
                format!("\"{}\"", picks[rng.usize(..picks.len())])
            }
            Kind::Float => {
                let picks = [
                    "0.0", "0.5", "1.0", "2.0", "1e308", "inf", "-inf", "nan", "-3.0",
                ];
                picks[rng.usize(..picks.len())].to_owned()
            }
        }
    }

    /// Random values for a random few settings at a time: the config is valid, or it is
    /// refused with the name of a key it set — never a panic, in loading, in the rules,
    /// in printing it, or in the retry policy it makes.
    #[test]
    fn any_numbers_are_valid_or_refused_by_name_never_a_panic() {
        let mut rng = fastrand::Rng::with_seed(20261201);
        for _ in 0..2000 {
            let mut sections: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
            let mut set = Vec::new();
            for _ in 0..rng.usize(1..4) {
                let (section, key, kind) = SETTINGS[rng.usize(..SETTINGS.len())];
                if set.contains(&key) {
                    continue;
                }
                set.push(key);
                sections
                    .entry(section)
                    .or_default()
                    .push(format!("{key} = {}", value(kind, &mut rng)));
            }
            let timeout = value(Kind::Duration, &mut rng);
            let mut text = String::new();
            for (section, lines) in &sections {
                text.push_str(&format!("[{section}]\n{}\n", lines.join("\n")));
            }
            text.push_str(&format!(
                "[[providers]]\nname = \"p\"\npreset = \"none\"\nkey = [{{ json = \"/id\" }}]\n\
                 target = {{ url = \"http://127.0.0.1:9/\", timeout = {timeout} }}\n"
            ));
            set.push("timeout");
            match Config::from_toml(&text) {
                Ok(config) => {
                    let _ = toml::to_string(&config).expect("printable");
                    let _ = config.shutdown_limit();
                    let policy = config.retry.policy();
                    for attempt in [1, 2, 10, 64, u32::MAX] {
                        let _ = policy.retry_after_secs(attempt);
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        set.iter().any(|key| e.contains(key)),
                        "refused without naming a key it set ({set:?}):\n{text}\n{e}"
                    );
                }
            }
        }
    }
}
