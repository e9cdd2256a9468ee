//! The configuration: one TOML file, layered with `HOOKGATE_<SECTION>__<KEY>` environment
//! overrides, deserialized into plain structs and then validated (see `Config::validate`).
//!
//! This module only describes and loads settings; it never opens a socket or a database.
//! Every key and its default is documented in `config/hookgate.toml`.

mod provider;
mod secret;
mod validate;

use std::fmt;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::Deserialize;

pub use provider::{
    HmacConfig, KeySource, Preset, ProviderConfig, SecretRef, Switch, TargetConfig,
};
pub use secret::Secret;
pub use validate::{ConfigError, Rule, Verdict};

/// The whole configuration of one hookgate node.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// HTTP listener, sharding and request limits.
    pub server: ServerConfig,
    /// Where the event rows live.
    pub store: StoreConfig,
    /// The claim lease.
    pub lease: LeaseConfig,
    /// Backoff and the attempt cap.
    pub retry: RetryConfig,
    /// The shards' done caches.
    pub cache: CacheConfig,
    /// Log format and level.
    pub log: LogConfig,
    /// Graceful shutdown.
    pub shutdown: ShutdownConfig,
    /// How long finished rows are kept.
    pub retention: RetentionConfig,
    /// The operator's HTTP API under `/admin/`.
    pub admin: AdminConfig,
    /// The senders hookgate accepts, one `POST /webhooks/{name}` each.
    pub providers: Vec<ProviderConfig>,
}

/// `[server]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the HTTP server binds, `host:port`.
    pub listen: String,
    /// Number of shard actors; `None` means two per CPU.
    pub shards: Option<usize>,
    /// Supervised delivery workers per shard; each runs one delivery at a time.
    pub workers_per_shard: usize,
    /// Requests per shard that may wait for a free worker *before* claiming; more are
    /// answered 503 `overloaded` at once. `None` means `workers_per_shard`.
    pub admission_queue: Option<usize>,
    /// Longest wait for a free worker before a request is answered 503 `overloaded`.
    #[serde(with = "humantime_serde")]
    pub admission_wait: Duration,
    /// Deadline for reading a request's head and body; a sender that stalls longer gets
    /// 408 and its connection is closed.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    /// Open connections the node accepts at once (over all HTTP workers).
    pub max_connections: usize,
    /// Messages a shard's mailbox holds before new requests are refused with 503.
    pub mailbox_capacity: usize,
    /// Largest accepted request body; larger bodies are refused with 413.
    pub max_body_bytes: usize,
    /// HTTP worker threads; `None` means one per CPU.
    pub http_workers: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            shards: None,
            workers_per_shard: 16,
            admission_queue: None,
            admission_wait: Duration::from_secs(1),
            read_timeout: Duration::from_secs(10),
            max_connections: 10_000,
            mailbox_capacity: 1024,
            max_body_bytes: 1024 * 1024,
            http_workers: None,
        }
    }
}

impl ServerConfig {
    /// The effective shard count: the configured one, or two per CPU.
    pub fn shard_count(&self) -> usize {
        self.shards.unwrap_or_else(|| 2 * cpus())
    }
}

/// Number of CPUs this process may use (at least 1).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `[store]`
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `postgres://user:password@host:port/db`.
    pub url: String,
    /// Postgres schema holding hookgate's tables (tests use one schema each).
    pub schema: String,
    /// Connections in the Postgres pool.
    pub pool_size: usize,
    /// How long a request waits for a free pooled connection before it is answered 503.
    #[serde(with = "humantime_serde")]
    pub pool_timeout: Duration,
    /// Client-side deadline of every store operation; past it the connection is dropped
    /// and the caller answers 503 `store_unavailable`.
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "postgres://postgres:postgres@127.0.0.1:5432/hookgate".into(),
            schema: "public".into(),
            pool_size: 16,
            pool_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
        }
    }
}

impl StoreConfig {
    /// The URL with any password replaced by `***`, safe for logs and `check-config`.
    pub fn redacted_url(&self) -> String {
        redact_url_password(&self.url)
    }
}

/// Hand-written so that the password in `url` never reaches a log line.
impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.redacted_url())
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("pool_timeout", &self.pool_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

/// Replaces every password in a URL with `***`: the one in `scheme://user:password@host`
/// and any `password=` or `sslpassword=` query parameter.
pub fn redact_url_password(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = redact_userinfo(base);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _))
                    if name.eq_ignore_ascii_case("password")
                        || name.eq_ignore_ascii_case("sslpassword") =>
                {
                    format!("{name}=***")
                }
                _ => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// Replaces the password of `scheme://user:password@host/...` with `***`.
fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

/// `[lease]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// How long a won claim holds its key before another attempt may retake it.
    #[serde(with = "humantime_serde")]
    pub duration: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(30),
        }
    }
}

/// `[retry]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// The first backoff; must exceed the lease.
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    /// Growth per attempt.
    pub factor: f64,
    /// Largest backoff.
    #[serde(with = "humantime_serde")]
    pub cap: Duration,
    /// Fraction of the delay added or removed at random, `0.0..1.0`.
    pub jitter: f64,
    /// Won claims an event may use before it becomes a dead letter.
    pub max_attempts: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(45),
            factor: 2.0,
            cap: Duration::from_secs(6 * 3600),
            jitter: 0.2,
            max_attempts: 8,
        }
    }
}

/// `[cache]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Done results kept in memory across all shards; 0 turns the cache off.
    pub capacity: usize,
    /// Bytes of cached answers kept across all shards (bodies, keys, fingerprints).
    pub max_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            capacity: 100_000,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `json` (one object a line) or `term` (human-readable).
    pub format: LogFormat,
    /// `trace`, `debug`, `info`, `warning`, `error` or `critical`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Json,
            level: "info".into(),
        }
    }
}

/// The log line format.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object a line on stdout.
    Json,
    /// Human-readable lines on stdout.
    Term,
}

/// `[shutdown]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// How long in-flight requests may run after SIGTERM before their leases are released.
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(15),
        }
    }
}

/// `[retention]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Done rows older than this are deleted; must cover the senders' retry horizon.
    #[serde(with = "humantime_serde")]
    pub done: Duration,
    /// Dead letters older than this are deleted.
    #[serde(with = "humantime_serde")]
    pub dead: Duration,
    /// How often the sweeper runs.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Rows deleted per statement, so no sweep holds many row locks at once.
    pub sweep_batch: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            done: Duration::from_secs(7 * 24 * 3600),
            dead: Duration::from_secs(30 * 24 * 3600),
            sweep_interval: Duration::from_secs(60),
            sweep_batch: 1000,
        }
    }
}

/// `[admin]`
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Name of the environment variable holding the bearer token; unset disables `/admin/`.
    pub token_env: Option<String>,
    /// The token itself, read from `token_env` by [`Config::resolve_secrets`] (tests set
    /// it directly). Never read from the file.
    #[serde(skip)]
    pub token: Option<Secret>,
}

/// The config file used when none is named.
pub const DEFAULT_PATH: &str = "config/hookgate.toml";

impl Config {
    /// Loads `path`, applies `HOOKGATE_<SECTION>__<KEY>` overrides from the environment,
    /// and validates the result.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut config = Self::load_unchecked(path)?;
        config.validate()?;
        config.resolve_secrets()?;
        Ok(config)
    }

    /// Loads like [`load`](Self::load) but neither validates nor reads secrets
    /// (`check-config` reports every rule itself).
    pub fn load_unchecked(path: &Path) -> Result<Self, ConfigError> {
        if !path.exists() {
            return Err(ConfigError::Missing(path.display().to_string()));
        }
        Figment::new()
            .merge(Toml::file(path))
            .merge(
                // Only `SECTION__KEY` names: a variable such as HOOKGATE_TEST_DATABASE_URL
                // is not a config key and must not trip `deny_unknown_fields`.
                Env::prefixed("HOOKGATE_")
                    .filter(|key| key.as_str().contains("__"))
                    .split("__"),
            )
            .extract()
            .map_err(|e| ConfigError::Parse(e.to_string()))
    }

    /// Reads every secret from the environment variables the config names. A named
    /// variable that is unset or empty is an error naming it.
    pub fn resolve_secrets(&mut self) -> Result<(), ConfigError> {
        if let Some(var) = &self.admin.token_env {
            self.admin.token = Some(Secret::from_env(var)?);
        }
        for provider in &mut self.providers {
            provider.signing_keys = provider
                .secrets
                .iter()
                .map(|s| {
                    Ok(crate::signature::SigningKey {
                        secret: Secret::from_env(&s.env)?,
                        not_after: s.not_after().map_err(ConfigError::Parse)?,
                    })
                })
                .collect::<Result<_, ConfigError>>()?;
        }
        Ok(())
    }

    /// Parses TOML text without the environment layer (tests, examples).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Config = Figment::new()
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every rule; the violated ones, together, are the error (warnings are not).
    pub fn validate(&self) -> Result<Vec<Rule>, ConfigError> {
        let rules = self.rules();
        let broken: Vec<String> = rules
            .iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| r.to_string())
            .collect();
        if broken.is_empty() {
            Ok(rules)
        } else {
            Err(ConfigError::Invalid(broken.join("\n")))
        }
    }

    /// Every rule with its verdict, in the order `check-config` prints them.
    pub fn rules(&self) -> Vec<Rule> {
        validate::rules(self)
    }

    /// How long a stop may take: the HTTP server lets requests in flight finish for the
    /// configured grace, but never less than the longest target timeout plus the store's
    /// deadline, so a delivery that reached the target is recorded and answered.
    pub fn shutdown_limit(&self) -> Duration {
        let longest = self
            .providers
            .iter()
            .map(|p| p.target.timeout)
            .max()
            .unwrap_or_default();
        self.shutdown
            .grace
            .max(longest + self.store.statement_timeout + Duration::from_secs(1))
    }

    /// The provider called `name`.
    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_the_password_and_keeps_the_rest() {
        assert_eq!(
            redact_url_password("postgres://app:s3cret@db:5432/hookgate"),
            "postgres://app:***@db:5432/hookgate"
        );
        assert_eq!(
            redact_url_password("postgres://app@db/hookgate"),
            "postgres://app@db/hookgate"
        );
        assert_eq!(redact_url_password("not a url"), "not a url");
    }

    #[test]
    fn a_password_in_the_query_string_is_redacted_too() {
        let url = "postgres://db/hookgate?user=app&password=hunter2&sslmode=require";
        let redacted = redact_url_password(url);
        assert!(!redacted.contains("hunter2"), "{redacted}");
        assert!(redacted.contains("password=***"), "{redacted}");
        assert!(redacted.contains("sslmode=require"), "{redacted}");
        let both = redact_url_password("postgres://a:pw1@db/x?sslpassword=pw2");
        assert!(!both.contains("pw1") && !both.contains("pw2"), "{both}");
    }

    #[test]
    fn debug_output_never_shows_the_store_password() {
        let store = StoreConfig {
            url: "postgres://app:hunter2@db/x".into(),
            ..StoreConfig::default()
        };
        assert!(!format!("{store:?}").contains("hunter2"));
    }

    #[test]
    fn the_issue_example_parses_with_durations_and_key_sources() {
        let config = Config::from_toml(
            r#"
            [server]
            listen = "127.0.0.1:8080"
            shards = 8
            max_body_bytes = 1048576
            [store]
            url = "postgres://postgres:postgres@127.0.0.1:5432/hookgate"
            [lease]
            duration = "30s"
            [retry]
            base = "45s"
            max_attempts = 8
            [log]
            format = "json"
            level = "info"
            [[providers]]
            name = "stripe"
            key = [{ header = "X-Idempotency-Key" }, { json = "/id" }]
            target = { url = "http://127.0.0.1:9000/effects", timeout = "10s" }
            "#,
        )
        .expect("valid config");
        assert_eq!(config.server.shard_count(), 8);
        assert_eq!(config.lease.duration, Duration::from_secs(30));
        let stripe = config.provider("stripe").expect("provider");
        assert_eq!(
            stripe.key.clone().expect("key"),
            vec![
                KeySource::Header {
                    header: "X-Idempotency-Key".into()
                },
                KeySource::Json { json: "/id".into() }
            ]
        );
        assert_eq!(stripe.target.timeout, Duration::from_secs(10));
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it() {
        let err = Config::from_toml("[server]\nlisen = \"x\"").unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }
}
