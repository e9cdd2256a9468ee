//! Loading a configuration: the TOML file, then `HOOKGATE_<SECTION>__<KEY>` environment
//! overrides, then the rules (`validate`), then the secrets from the environment
//! variables the file names. It never opens a socket or a database.

use std::path::Path;

use figment::providers::{Env, Format, Toml};
use figment::Figment;

use super::encryption::EncryptionConfig;
use super::provider::ProviderConfig;
use super::settings::Config;
use super::validate::{self, Rule, RuleStatus};
use crate::seal::{decode_key, Keyring};
use crate::secret::Secret;
use crate::signature::SigningKey;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The named file does not exist.
    #[error("config file {0} not found (pass --config FILE)")]
    Missing(String),
    /// The file or an environment override could not be parsed.
    #[error("config could not be parsed: {0}")]
    Parse(String),
    /// One or more rules are broken; each line names the keys to change.
    #[error("config breaks these rules:\n{0}")]
    Invalid(String),
    /// An environment variable named for a secret is unset or empty.
    #[error("environment variable {0} (named in the config for a secret) is not set")]
    MissingSecret(String),
    /// A secret too short for where the node listens; the message names its variable.
    #[error("{0}")]
    WeakSecret(String),
}

impl ProviderConfig {
    /// Reads this provider's secrets (its signing keys, the demo secret while its variable
    /// is unset, and every route's `signing_secret`) from the variables it names; one unset or
    /// empty is an error naming it.
    pub fn resolve_secrets(&mut self) -> Result<(), ConfigError> {
        for target in std::iter::once(&mut self.target).chain(&mut self.routes) {
            if let Some(secret) = &target.signing_secret {
                target.signing_key = Some(secret_from_env(&secret.env)?);
            }
        }
        self.signing_keys = self
            .secrets
            .iter()
            .map(|s| {
                let secret = match &s.demo {
                    Some(demo) if s.demo_in_use() => Secret::new(demo.clone()),
                    _ => secret_from_env(&s.env)?,
                };
                Ok(SigningKey {
                    secret,
                    not_after: s.not_after().map_err(ConfigError::Parse)?,
                })
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok(())
    }
}

impl EncryptionConfig {
    /// Reads every key from its variable and builds the keyring. An unset or empty
    /// variable, or a value that is not a 32-byte key, is an error naming the variable.
    pub fn resolve(&mut self) -> Result<(), ConfigError> {
        if self.is_off() {
            self.keyring = None;
            return Ok(());
        }
        let mut keys = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let text = secret_from_env(&key.env)?;
            let bytes = decode_key(text.expose()).map_err(|why| {
                ConfigError::WeakSecret(format!(
                    "store.encryption key {:?}: the value of ${} {why}",
                    key.id, key.env
                ))
            })?;
            keys.push((key.id.clone(), bytes));
        }
        let keyring = Keyring::new(&keys)
            .map_err(|why| ConfigError::Invalid(format!("store.encryption.keys: {why}")))?
            .require_sealed(self.require_sealed);
        self.keyring = Some(std::sync::Arc::new(keyring));
        Ok(())
    }
}

/// Fewest characters of an admin token on a listen address other than loopback: guessing
/// it must not be an option for anyone who can reach the port.
pub const MIN_ADMIN_TOKEN: usize = 16;

/// Reads environment variable `var` as a secret; unset or empty is an error naming it.
pub fn secret_from_env(var: &str) -> Result<Secret, ConfigError> {
    match std::env::var(var) {
        Ok(value) if !value.is_empty() => Ok(Secret::new(value)),
        _ => Err(ConfigError::MissingSecret(var.to_owned())),
    }
}

impl Config {
    /// Loads `path`, applies `HOOKGATE_<SECTION>__<KEY>` overrides from the environment,
    /// and validates the result.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let mut config = Self::load_unchecked(path)?;
        config.validate()?;
        config.resolve_secrets()?;
        config.settle();
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
        self.resolve_admin_token()?;
        self.store.encryption.resolve()?;
        if self.tracing.endpoint.is_some() {
            self.tracing.headers = self
                .tracing
                .headers_env
                .iter()
                .map(|(name, var)| Ok((name.clone(), secret_from_env(var)?)))
                .collect::<Result<_, ConfigError>>()?;
        }
        for provider in &mut self.providers {
            provider.resolve_secrets()?;
        }
        Ok(())
    }

    /// Reads the admin token from `admin.token_env`, if it names a variable: unset or
    /// empty, or too short for a listen address other than loopback, is an error naming it.
    pub fn resolve_admin_token(&mut self) -> Result<(), ConfigError> {
        if let Some(var) = &self.admin.token_env {
            let token = secret_from_env(var)?;
            let length = token.expose().chars().count();
            if !self.server.on_loopback() && length < MIN_ADMIN_TOKEN {
                return Err(ConfigError::WeakSecret(format!(
                    "the admin token in ${var} has {length} characters; on {} (not \
                     loopback) it needs at least {MIN_ADMIN_TOKEN}: `openssl rand -hex 32` \
                     makes one",
                    self.server.listen
                )));
            }
            self.admin.token = Some(token);
        }
        Ok(())
    }

    /// Parses TOML text without the environment layer (tests, examples).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let mut config: Config = Figment::new()
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError::Parse(e.to_string()))?;
        config.validate()?;
        config.settle();
        Ok(config)
    }

    /// Checks every rule; the violated ones, together, are the error (warnings are not).
    pub fn validate(&self) -> Result<Vec<Rule>, ConfigError> {
        let rules = self.rules();
        let broken: Vec<String> = rules
            .iter()
            .filter(|r| r.status == RuleStatus::Fail)
            .map(|r| r.to_string())
            .collect();
        if broken.is_empty() {
            Ok(rules)
        } else {
            Err(ConfigError::Invalid(broken.join("\n")))
        }
    }

    /// Every rule with its status, in the order `check-config` prints them.
    pub fn rules(&self) -> Vec<Rule> {
        validate::rules(self)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeySource;
    use std::time::Duration;

    #[test]
    fn an_unset_short_or_malformed_key_is_refused_naming_its_variable() {
        let mut unset = store_keys("a", "HOOKGATE_TEST_UNSET_STORE_KEY");
        let err = unset.resolve().unwrap_err().to_string();
        assert!(err.contains("HOOKGATE_TEST_UNSET_STORE_KEY"), "{err}");

        std::env::set_var("HOOKGATE_TEST_SHORT_STORE_KEY", "c2hvcnQ=");
        let err = store_keys("a", "HOOKGATE_TEST_SHORT_STORE_KEY")
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("$HOOKGATE_TEST_SHORT_STORE_KEY holds 5 bytes"),
            "{err}"
        );
        assert!(!err.contains("c2hvcnQ"), "{err}");

        std::env::set_var("HOOKGATE_TEST_GOOD_STORE_KEY", "a".repeat(64));
        let mut good = store_keys("2026-12", "HOOKGATE_TEST_GOOD_STORE_KEY");
        good.resolve().unwrap();
        assert_eq!(good.keyring.unwrap().sealing_id(), "2026-12");
    }

    fn store_keys(id: &str, env: &str) -> EncryptionConfig {
        EncryptionConfig {
            keys: vec![super::super::encryption::KeyConfig {
                id: id.into(),
                env: env.into(),
            }],
            require_sealed: false,
            keyring: None,
        }
    }

    /// The shipped config documents every key with its default: each value written there
    /// is `Config::default()`'s, and every key of every section appears (written, or
    /// commented out where the default is derived). One source, checked.
    #[test]
    fn the_commented_default_file_and_the_defaults_in_code_agree() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/hookgate.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let file = Config::from_toml(&text).expect("the shipped config is valid");
        let written: toml::Table = toml::from_str(&text).unwrap();
        let mut defaults = Config::default();
        defaults.settle();
        let defaults = toml::Table::try_from(&defaults).unwrap();
        let from_file = toml::Table::try_from(&file).unwrap();
        for (section, keys) in &defaults {
            let Some(keys) = keys.as_table() else {
                continue;
            };
            for (key, default) in keys {
                if let Some(value) = written.get(section).and_then(|s| s.get(key)) {
                    // Compared as loaded (durations and sizes normalised), not as typed.
                    let loaded = &from_file[section][key];
                    assert_eq!(
                        loaded, default,
                        "[{section}] {key} = {value} is not the default"
                    );
                }
                let shown = text.lines().any(|line| {
                    let line = line.trim_start_matches(['#', ' ']);
                    line.strip_prefix(key.as_str())
                        .is_some_and(|rest| rest.trim_start().starts_with('='))
                });
                assert!(shown, "[{section}] {key} is not documented in {path}");
            }
        }
    }

    #[test]
    fn tracing_settings_written_wrong_are_refused_by_name() {
        let with = |tracing: &str| {
            Config::from_toml(&format!(
                "[tracing]\n{tracing}\n[[providers]]\nname = \"p\"\npreset = \"none\"\n\
                 key = [{{ json = \"/id\" }}]\ntarget = {{ url = \"http://127.0.0.1:9/\" }}\n"
            ))
        };
        let refused = with(
            r#"endpoint = "ftp://collector/v1/traces"
               sampling_ratio = 1.5
               batch_size = 0
               flush_interval = "1ms"
               headers_env = { "bad header" = "X" }"#,
        )
        .expect_err("refused")
        .to_string();
        for name in [
            "tracing.endpoint is an http:// or https:// URL",
            "0 <= tracing.sampling_ratio <= 1",
            "1 <= tracing.batch_size <= tracing.queue_size",
            "tracing.flush_interval and tracing.timeout >= 10ms",
            "tracing.headers_env names valid header names",
        ] {
            assert!(refused.contains(name), "{name} not in {refused}");
        }
        // Off (no endpoint): its other settings are not checked.
        let off = with("sampling_ratio = 7.0");
        assert!(off.is_ok(), "{off:?}");
        let mut missing = with(
            r#"endpoint = "http://127.0.0.1:4318/v1/traces"
               headers_env = { "x-api-key" = "HOOKGATE_TEST_UNSET_TRACING_KEY" }"#,
        )
        .expect("valid");
        let error = missing.resolve_secrets().expect_err("unset").to_string();
        assert!(error.contains("HOOKGATE_TEST_UNSET_TRACING_KEY"), "{error}");
        // Tracing off: its header variables are not read.
        missing.tracing.endpoint = None;
        assert!(missing.resolve_secrets().is_ok());
        let keyed = with(r#"endpoint = "https://u:pw@api.example.com:443/v1/traces?key=abc""#)
            .expect("valid");
        assert_eq!(
            keyed.tracing.endpoint_shown().as_deref(),
            Some("https://api.example.com:443/v1/traces?***")
        );
    }

    #[test]
    fn a_short_admin_token_is_refused_off_loopback_only() {
        let var = format!("HOOKGATE_TEST_ADMIN_TOKEN_{}", fastrand::u64(..));
        std::env::set_var(&var, "short");
        let text = |listen: &str| {
            format!(
                "[server]\nlisten = \"{listen}\"\n[admin]\ntoken_env = \"{var}\"\n\
                 [[providers]]\nname = \"p\"\npreset = \"none\"\n\
                 allow_unsigned_from_network = true\nkey = [{{ json = \"/id\" }}]\n\
                 target = {{ url = \"http://127.0.0.1:9/\" }}"
            )
        };
        let mut local = Config::from_toml(&text("127.0.0.1:8080")).unwrap();
        assert!(local.resolve_secrets().is_ok());
        let mut network = Config::from_toml(&text("0.0.0.0:8080")).unwrap();
        let err = network.resolve_secrets().unwrap_err().to_string();
        assert!(err.contains(&var) && err.contains("at least 16"), "{err}");
        assert!(!err.contains("short"), "the token is never shown: {err}");
        std::env::set_var(&var, "0123456789abcdef");
        assert!(network.resolve_secrets().is_ok());
        std::env::remove_var(&var);
    }

    #[test]
    fn byte_sizes_take_units_or_plain_integers() {
        let provider = r#"
            [[providers]]
            name = "p"
            preset = "none"
            key = [{ json = "/id" }]
            target = { url = "http://127.0.0.1:9/" }
        "#;
        for (written, bytes) in [
            ("\"8MiB\"", 8 << 20),
            ("\"1MB\"", 1_000_000),
            ("\"512 KiB\"", 512 << 10),
            ("65536", 65536),
        ] {
            let text = format!("[cache]\nmax_bytes = {written}\n{provider}");
            let config = Config::from_toml(&text).unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(config.cache.max_bytes, bytes, "{written}");
        }
        let text = format!("[server]\nmax_body_bytes = \"2MiB\"\n{provider}");
        assert_eq!(
            Config::from_toml(&text).unwrap().server.max_body_bytes,
            2 << 20
        );
        let text = format!("[cache]\nmax_bytes = \"lots\"\n{provider}");
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains("max_bytes"), "{err}");
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
            preset = "none"
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

    #[test]
    fn a_missing_secret_variable_is_an_error_naming_it() {
        let err = secret_from_env("HOOKGATE_TEST_SURELY_UNSET_VAR").unwrap_err();
        assert!(err.to_string().contains("HOOKGATE_TEST_SURELY_UNSET_VAR"));
    }
}
