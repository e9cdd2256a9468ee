//! The configuration: one TOML file, layered with `HOOKGATE_<SECTION>__<KEY>` environment
//! overrides, deserialized into plain structs ([`settings`], [`store`], [`provider`]),
//! checked by rules that print the numbers they compared ([`validate`]), loaded by
//! [`load`]. Config converts into the core's types (a provider's key sources, the retry
//! policy, secrets); it never opens a socket or a database.
//!
//! The files import one another one way only: `settings` → `store` → `encryption`, `provider`;
//! `validate` → `provider_rules`, `bounds` → `rule`, `settings`; `load` → `settings`, `validate`, `encryption`.
//! This file only re-exports.

mod bounds;
pub mod encryption;
pub mod load;
pub mod provider;
mod provider_rules;
mod route_rules;
mod rule;
pub mod settings;
pub mod store;
pub mod validate;

pub use encryption::{EncryptionConfig, KeyConfig};
pub use load::{secret_from_env, ConfigError};
pub use provider::{
    effective_mode, route_scope, HmacConfig, KeepPayload, Preset, ProviderConfig, SecretRef,
    Switch, TargetConfig, MAIN_ROUTE,
};
pub use settings::{
    cpus, AdminConfig, CacheConfig, Config, LeaseConfig, LogConfig, LogFormat, QueueConfig,
    RetentionConfig, RetryConfig, ServerConfig, ShutdownConfig, TracingConfig, DEFAULT_PATH,
};
pub use store::{redact_url_password, StoreConfig};
pub use validate::{Rule, RuleStatus};
