//! The rules a configuration must keep before hookgate starts, each reported with the
//! numbers it compared so that `check-config` can show its work.
//!
//! The central rule is docs/design.md's: target timeout < lease < first backoff, so that a live
//! attempt is never mistaken for a dead one, and a sender's retry never lands while the
//! previous attempt may still be running.

use std::time::Duration;

use super::bounds::bounds_rules;
use super::encryption::encryption_rules;
use super::provider_rules::provider_rules;
use super::rule::{advice, rule, show};
use super::settings::Config;
use super::store::DEFAULT_DEADLINE;

pub use super::rule::{Rule, RuleStatus};

/// Stripe retries for three days: a done result must outlive that, or a late retry
/// would run the target again.
const MIN_RETENTION: Duration = Duration::from_secs(72 * 3600);
/// Standard Webhooks' schedule spans about 75 hours.
const ADVISED_RETENTION: Duration = Duration::from_secs(75 * 3600);

/// Every rule, in the order `check-config` prints them.
pub(super) fn rules(config: &Config) -> Vec<Rule> {
    let mut rules = bounds_rules(config);
    rules.extend(node_rules(config));
    rules.extend(retry_rules(config));
    rules.extend(retention_rules(config));
    rules.extend(provider_rules(config));
    rules.extend(tracing_rules(config));
    rules.extend(encryption_rules(&config.store.encryption));
    rules
}

/// `[tracing]`, checked only when an endpoint turns it on.
fn tracing_rules(config: &Config) -> Vec<Rule> {
    let t = &config.tracing;
    let Some(endpoint) = &t.endpoint else {
        return Vec::new();
    };
    let endpoint = endpoint.as_str();
    let url_ok = endpoint
        .parse::<actix_web::http::Uri>()
        .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
    let bad_names: Vec<&str> = t
        .headers_env
        .keys()
        .filter(|n| actix_web::http::header::HeaderName::from_bytes(n.as_bytes()).is_err())
        .map(String::as_str)
        .collect();
    vec![
        rule(
            "tracing.endpoint is an http:// or https:// URL",
            url_ok,
            format!("endpoint = {:?}", t.endpoint_shown().unwrap_or_default()),
        ),
        rule(
            "0 <= tracing.sampling_ratio <= 1",
            (0.0..=1.0).contains(&t.sampling_ratio),
            format!("sampling_ratio = {}", t.sampling_ratio),
        ),
        rule(
            "1 <= tracing.batch_size <= tracing.queue_size <= 1000000",
            t.batch_size >= 1 && t.batch_size <= t.queue_size && t.queue_size <= 1_000_000,
            format!(
                "batch_size = {}, queue_size = {}",
                t.batch_size, t.queue_size
            ),
        ),
        rule(
            "tracing.flush_interval and tracing.timeout >= 10ms",
            t.flush_interval >= Duration::from_millis(10) && t.timeout >= Duration::from_millis(10),
            format!(
                "flush_interval = {}, timeout = {}",
                show(t.flush_interval),
                show(t.timeout)
            ),
        ),
        rule(
            "tracing.headers_env names valid header names",
            bad_names.is_empty(),
            format!("invalid: {bad_names:?}"),
        ),
    ]
}

/// Sizes, limits, deadlines and what a shutdown can take.
fn node_rules(config: &Config) -> Vec<Rule> {
    let lease = config.lease.duration;
    vec![
        rule(
            "server.shards >= 1",
            config.server.shard_count() >= 1,
            format!("shards = {}", config.server.shard_count()),
        ),
        rule(
            "server.workers_per_shard >= 1",
            config.server.workers_per_shard >= 1,
            format!("workers_per_shard = {}", config.server.workers_per_shard),
        ),
        rule(
            "server.mailbox_capacity >= 1",
            config.server.mailbox_capacity >= 1,
            format!("mailbox_capacity = {}", config.server.mailbox_capacity),
        ),
        rule(
            "store.pool_size >= 1",
            config.store.pool_size >= 1,
            format!("pool_size = {}", config.store.pool_size),
        ),
        rule(
            "store.operator_pool_size >= 1",
            config.store.operator_pool_size >= 1,
            format!("operator_pool_size = {}", config.store.operator_pool_size),
        ),
        match config.store.statement_timeout {
            Some(deadline) => rule(
                "10ms <= store.statement_timeout < lease.duration",
                deadline >= Duration::from_millis(10) && deadline < lease,
                format!(
                    "statement_timeout {} vs lease {}: an outcome write must fit inside the \
                     lease",
                    show(deadline),
                    show(lease)
                ),
            ),
            None => rule(
                "10ms <= store.statement_timeout < lease.duration",
                config.derived_deadline() >= Duration::from_millis(10),
                format!(
                    "not set: derived from lease {}: min(lease / 3, {}) = {}",
                    show(lease),
                    show(DEFAULT_DEADLINE),
                    show(config.derived_deadline())
                ),
            ),
        },
        rule(
            "server.max_body_bytes <= max_body_bytes_in_flight",
            config.server.max_body_bytes <= config.server.max_body_bytes_in_flight,
            format!(
                "max_body_bytes {} vs max_body_bytes_in_flight {}: the largest body must fit",
                config.server.max_body_bytes, config.server.max_body_bytes_in_flight
            ),
        ),
        rule(
            "server.read_timeout >= 100ms",
            config.server.read_timeout >= Duration::from_millis(100),
            format!("read_timeout = {}", show(config.server.read_timeout)),
        ),
        rule(
            "server.max_connections >= 1",
            config.server.max_connections >= 1,
            format!("max_connections = {}", config.server.max_connections),
        ),
        shutdown_rule(config),
        rule(
            "queue.poll_interval >= 10ms",
            config.queue.poll_interval >= Duration::from_millis(10),
            format!("poll_interval = {}", show(config.queue.poll_interval)),
        ),
    ]
}

/// The lease against the backoff, and the backoff's own numbers.
fn retry_rules(config: &Config) -> Vec<Rule> {
    let lease = config.lease.duration;
    let base = config.retry.base;
    vec![
        rule(
            "lease.duration < retry.base",
            lease < base,
            format!(
                "lease {} vs first backoff {}: raise retry.base or lower lease.duration",
                show(lease),
                show(base)
            ),
        ),
        rule(
            "retry.max_attempts >= 1",
            config.retry.max_attempts >= 1,
            format!("max_attempts = {}", config.retry.max_attempts),
        ),
        rule(
            "retry.factor >= 1",
            config.retry.factor >= 1.0,
            format!("factor = {}", config.retry.factor),
        ),
        rule(
            "retry.cap >= retry.base",
            config.retry.cap >= base,
            format!("cap {} vs base {}", show(config.retry.cap), show(base)),
        ),
        rule(
            "0 <= retry.jitter < 1",
            (0.0..1.0).contains(&config.retry.jitter),
            format!("jitter = {}", config.retry.jitter),
        ),
    ]
}

/// How long rows are kept and swept.
fn retention_rules(config: &Config) -> Vec<Rule> {
    vec![
        rule(
            "retention.done >= 72h",
            config.retention.done >= MIN_RETENTION,
            format!(
                "done rows kept {}: senders retry for up to 3 days (Stripe); raise retention.done",
                show(config.retention.done)
            ),
        ),
        advice(
            "retention.done >= 75h",
            config.retention.done >= ADVISED_RETENTION,
            format!(
                "done rows kept {}: Standard Webhooks retries span ~75h",
                show(config.retention.done)
            ),
        ),
        rule(
            "retention.sweep_batch >= 1",
            config.retention.sweep_batch >= 1,
            format!("sweep_batch = {}", config.retention.sweep_batch),
        ),
        rule(
            "retention.sweep_interval >= 1s",
            config.retention.sweep_interval >= Duration::from_secs(1),
            format!("sweep_interval = {}", show(config.retention.sweep_interval)),
        ),
    ]
}

/// What a shutdown can take: deliveries that reached the target run to their end, so the
/// node may need the longest target timeout (plus a store deadline to record it) even
/// when `shutdown.grace` is shorter. Warns then, with the number to give the process
/// manager.
fn shutdown_rule(config: &Config) -> Rule {
    let grace = config.shutdown.grace;
    let longest = config.providers.iter().map(|p| p.target.timeout).max();
    let longest = longest.unwrap_or_default();
    let limit = config.shutdown_limit();
    advice(
        "shutdown.grace >= the longest target.timeout",
        grace >= longest,
        format!(
            "grace {} vs longest target timeout {}: a SIGTERM lets deliveries at the target \
             finish, so stopping can take up to {}; give the process manager at least that \
             (systemd TimeoutStopSec)",
            show(grace),
            show(longest),
            show(limit)
        ),
    )
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const PROVIDER: &str = r#"
        [[providers]]
        name = "stripe"
        preset = "none"
        key = [{ json = "/id" }]
        target = { url = "http://127.0.0.1:9000/", timeout = "10s" }
    "#;

    #[test]
    fn an_unwritten_store_deadline_is_derived_from_the_lease_and_only_a_written_one_refused() {
        let short = "[lease]\nduration = \"2s\"\n[retry]\nbase = \"3s\"\n";
        let text = format!("{short}{}", PROVIDER.replace("10s", "1s"));
        let config = Config::from_toml(&text).expect("a short lease alone is fine");
        assert_eq!(
            config.store.deadline(),
            std::time::Duration::from_millis(666)
        );
        let written = format!(
            "{short}[store]\nstatement_timeout = \"5s\"\n{}",
            PROVIDER.replace("10s", "1s")
        );
        let err = Config::from_toml(&written).unwrap_err().to_string();
        assert!(err.contains("statement_timeout 5s vs lease 2s"), "{err}");
        let default = Config::from_toml(PROVIDER).unwrap();
        assert_eq!(default.store.deadline(), std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_lease_not_shorter_than_the_first_backoff_is_refused_naming_both_keys() {
        let text = format!("[lease]\nduration = \"60s\"\n[retry]\nbase = \"45s\"\n{PROVIDER}");
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains("lease.duration < retry.base"), "{err}");
        assert!(err.contains("1m"), "{err}");
    }

    #[test]
    fn a_target_timeout_not_shorter_than_the_lease_is_refused() {
        let text = format!(
            "[lease]\nduration = \"5s\"\n{}",
            PROVIDER.replace("10s", "5s")
        );
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("providers.stripe.target.timeout < lease.duration"),
            "{err}"
        );
    }

    #[test]
    fn a_grace_shorter_than_a_target_timeout_warns_with_what_a_stop_can_take() {
        let config =
            Config::from_toml(&format!("[shutdown]\ngrace = \"1s\"\n{PROVIDER}")).expect("ok");
        let rule = config
            .rules()
            .into_iter()
            .find(|r| r.name.starts_with("shutdown.grace"))
            .expect("the shutdown rule");
        assert_eq!(rule.status, super::RuleStatus::Warn);
        assert!(rule.detail.contains("10s"), "{}", rule.detail);
        assert!(
            rule.detail.contains("16s"),
            "10s timeout + 5s deadline + 1s: {}",
            rule.detail
        );
    }

    #[test]
    fn duplicate_provider_names_are_refused() {
        let text = format!("{PROVIDER}{PROVIDER}");
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains("name is unique"), "{err}");
    }

    #[test]
    fn defaults_with_one_provider_pass_every_rule() {
        let config = Config::from_toml(PROVIDER).expect("valid");
        let rules = config.validate().expect("rules");
        let not_ok: Vec<_> = rules
            .iter()
            .filter(|r| r.status != super::RuleStatus::Ok)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(not_ok, vec!["providers.stripe: signatures are verified"]);
    }

    #[test]
    fn retention_under_three_days_is_refused_and_under_75h_warned() {
        let short = format!("[retention]\ndone = \"48h\"\n{PROVIDER}");
        let err = Config::from_toml(&short).unwrap_err().to_string();
        assert!(err.contains("retention.done >= 72h"), "{err}");
        let config = Config::from_toml(&format!("[retention]\ndone = \"73h\"\n{PROVIDER}"))
            .expect("allowed");
        let warned: Vec<_> = config
            .rules()
            .into_iter()
            .filter(|r| r.status == super::RuleStatus::Warn)
            .collect();
        assert!(warned.iter().any(|r| r.name.contains("75h")), "{warned:?}");
    }
}
