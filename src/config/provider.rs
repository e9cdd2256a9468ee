//! `[[providers]]`: one sender each — its preset, key sources, secrets (named, never
//! written), signature settings, fingerprint rules and target.

use crate::filter::Filter;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::claim::Mode;
use crate::key::KeySource;
use crate::signature::SigningKey;

/// One `[[providers]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// URL segment: served at `POST /webhooks/{name}`.
    pub name: String,
    /// A real sender's signature scheme, timestamp window and key source; `"none"` accepts
    /// unsigned events. Required: a missing preset is refused at start, never read as
    /// "none".
    pub preset: Option<Preset>,
    /// With preset `"none"`, accept unsigned events on a listen address other than
    /// loopback too (a second, explicit opt-in: anyone who reaches the port can send them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unsigned_from_network: bool,
    /// Where the idempotency key comes from, tried in order (default: the preset's).
    pub key: Option<Vec<KeySource>>,
    /// Signing secrets, each read from an environment variable; any current one may match.
    #[serde(default)]
    pub secrets: Vec<SecretRef>,
    /// The generic HMAC scheme's settings (preset `hmac`).
    pub signature: Option<HmacConfig>,
    /// Allowed clock distance of a signed timestamp (default: the preset's, else 5m).
    #[serde(default, with = "humantime_serde")]
    pub tolerance: Option<Duration>,
    /// `"on"` (default) or `"off"`: detect one key arriving with another payload.
    #[serde(default)]
    pub fingerprint: Switch,
    /// JSON pointers left out of the fingerprint (default: the preset's).
    pub fingerprint_exclude: Option<Vec<String>>,
    /// `"sync"` (the sender waits and redelivers) or `"queue"` (202 once durable, hookgate
    /// redelivers). Default: the preset's (`github`: queue), else sync.
    pub mode: Option<Mode>,
    /// How long this sender keeps retrying (sync mode): a row untouched longer becomes a
    /// `sender_gave_up` dead letter. Default: the preset's, else `retry.sender_horizon`.
    #[serde(default, with = "humantime_serde")]
    pub sender_horizon: Option<Duration>,
    /// Request headers kept with a failed event (for people reading a dead letter) besides
    /// the content type, user agent and the provider's own signature, timestamp and key
    /// headers. Every other header is dropped: it may be a credential.
    #[serde(default)]
    pub keep_headers: Vec<String>,
    /// When the payload is kept: `"on_failure"` (the default: once an attempt fails, so a
    /// dead letter can be replayed) or `"always"` (written with the claim and kept once
    /// done: a crashed attempt's dead letter can be replayed too, and people can read every
    /// event's payload; it costs a larger row per event).
    #[serde(default)]
    pub keep_payload: KeepPayload,
    /// The application that receives the events: the provider's main route, whose row
    /// is the key's own (scope = the provider's name) and whose answer the sender gets in
    /// sync mode.
    pub target: TargetConfig,
    /// More applications that receive the events, each named, each with its own filter,
    /// limits and rows (scope `provider.route`): every event one accepts is queued for it
    /// in the commit that writes the event's first row.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<TargetConfig>,
    /// The secrets' values, read when the config is loaded (tests set them directly).
    #[serde(skip)]
    pub signing_keys: Vec<SigningKey>,
}

/// The sender presets.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// No signature verification (an explicit opt-out).
    None,
    /// Stripe: `Stripe-Signature`, 5 min window, key `/id`, ignores `/pending_webhooks`.
    Stripe,
    /// GitHub: `X-Hub-Signature-256`, key header `X-GitHub-Delivery`.
    Github,
    /// Standard Webhooks / Svix: `webhook-*` headers, 5 min window, key `webhook-id`.
    StandardWebhooks,
    /// Slack: `X-Slack-Signature`, 5 min window, key `/event_id`.
    Slack,
    /// Shopify: `X-Shopify-Hmac-Sha256`, key header `X-Shopify-Webhook-Id`.
    Shopify,
    /// Any HMAC sender, described by `signature = { ... }`.
    Hmac,
}

impl ProviderConfig {
    /// The preset in force; a missing one (refused by the rules) verifies nothing.
    pub fn preset(&self) -> Preset {
        self.preset.unwrap_or(Preset::None)
    }

    /// Every route, the main one (`target`) first, each with where it is written in the
    /// config (`target`, `routes.NAME`).
    pub fn all_routes(&self) -> impl Iterator<Item = (String, &TargetConfig)> {
        std::iter::once(("target".to_owned(), &self.target)).chain(
            self.routes.iter().enumerate().map(|(i, r)| match &r.name {
                Some(name) => (format!("routes.{name}"), r),
                None => (format!("routes[{i}]"), r),
            }),
        )
    }
}

pub use crate::key::MAIN_ROUTE;

/// The scope of a route's rows: the provider's name for its main route, `provider.route`
/// for the others. A `.` is in no provider name, so scopes never collide.
pub fn route_scope(provider: &str, route: Option<&str>) -> String {
    match route {
        None => provider.to_owned(),
        Some(route) => format!("{provider}.{route}"),
    }
}

impl Preset {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::None => "none",
            Preset::Stripe => "stripe",
            Preset::Github => "github",
            Preset::StandardWebhooks => "standard-webhooks",
            Preset::Slack => "slack",
            Preset::Shopify => "shopify",
            Preset::Hmac => "hmac",
        }
    }
}

/// When a provider's payloads are kept.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KeepPayload {
    /// Once an attempt fails (and for queue events until they are done).
    #[default]
    OnFailure,
    /// From the claim on, and once done.
    Always,
}

/// `"on"` or `"off"`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    /// Enabled.
    #[default]
    On,
    /// Disabled.
    Off,
}

/// `{ env = "NAME", not_after = "2026-12-31T00:00:00Z" }`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The environment variable holding the secret.
    pub env: String,
    /// RFC 3339 instant after which the secret is no longer accepted.
    pub not_after: Option<String>,
    /// A value written in the config, used while `env` is unset: for trying hookgate on
    /// one machine only. It is public (anyone who reads the config can sign with it), so
    /// it is refused on a listen address other than loopback, and warned about anywhere.
    pub demo: Option<String>,
}

impl SecretRef {
    /// Whether the demo value stands in for the secret: one is written and `env` is unset.
    pub fn demo_in_use(&self) -> bool {
        self.demo.is_some() && std::env::var(&self.env).map_or(true, |v| v.is_empty())
    }

    /// `not_after` as an instant (`Err` with the text when it does not parse).
    pub fn not_after(&self) -> Result<Option<std::time::SystemTime>, String> {
        self.not_after
            .as_deref()
            .map(|t| humantime::parse_rfc3339_weak(t).map_err(|e| format!("{t:?}: {e}")))
            .transpose()
    }
}

/// `signature = { header = "X-Signature", ... }` for preset `hmac`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HmacConfig {
    /// The header carrying the signature.
    pub header: String,
    /// `sha256` (default) or `sha512`.
    #[serde(default = "default_algorithm")]
    pub algorithm: crate::signature::hmac::Algorithm,
    /// `hex` (default) or `base64`.
    #[serde(default = "default_encoding")]
    pub encoding: crate::signature::hmac::Encoding,
    /// Text before the encoded MAC, e.g. `sha256=`.
    #[serde(default)]
    pub prefix: String,
    /// A header with a Unix-seconds timestamp, checked against `tolerance`.
    pub timestamp_header: Option<String>,
    /// The signed message; `{body}` and `{timestamp}` are replaced (default `{body}`).
    #[serde(default = "default_template")]
    pub template: String,
}

fn default_algorithm() -> crate::signature::hmac::Algorithm {
    crate::signature::hmac::Algorithm::Sha256
}

fn default_encoding() -> crate::signature::hmac::Encoding {
    crate::signature::hmac::Encoding::Hex
}

fn default_template() -> String {
    "{body}".into()
}

/// `target = { url = "...", timeout = "10s" }`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// A route's name (required in `routes`, letters, digits, `-` and `_`, not `main`): its
    /// rows' scope is `provider.name`, and the `route` label of its metrics. The main route
    /// (`target`) takes no name: it is `main`, and its scope is the provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The URL events are POSTed to. Printed with its password and query values redacted.
    #[serde(serialize_with = "serialize_redacted_target")]
    pub url: String,
    /// How long one delivery may take; in sync mode shorter than the lease (queue mode
    /// renews the lease while a delivery runs).
    #[serde(with = "humantime_serde", default = "default_target_timeout")]
    pub timeout: Duration,
    /// Queue mode: deliveries a second at most, per node (a token bucket).
    pub max_rate: Option<f64>,
    /// Queue mode: deliveries running at once at most, per node.
    pub max_in_flight: Option<usize>,
    /// For an `https://` target: the CA certificates (PEM) to trust instead of the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// A `whsec_…` secret (from this environment variable) with which every forwarded
    /// request is signed the Standard Webhooks way, so the target can verify it came
    /// through hookgate unaltered.
    pub signing_secret: Option<SecretRef>,
    /// The signing secret's value, read when the config is loaded (tests set it directly).
    #[serde(skip)]
    pub signing_key: Option<crate::secret::Secret>,
    /// Which events this target wants ([`Filter`]); an event it does not accept is answered
    /// 200 `filtered`, delivered nowhere, and deduplicated like any other. None: every event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
}

fn serialize_redacted_target<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&super::store::redact_target_url(url))
}

fn default_target_timeout() -> Duration {
    Duration::from_secs(10)
}

/// The key sources a preset implies.
pub fn preset_key(preset: Preset) -> Vec<KeySource> {
    let header = |h: &str| vec![KeySource::Header { header: h.into() }];
    let json = |p: &str| vec![KeySource::Json { json: p.into() }];
    match preset {
        Preset::Stripe => json("/id"),
        Preset::Github => header("X-GitHub-Delivery"),
        Preset::StandardWebhooks => header("webhook-id"),
        Preset::Slack => json("/event_id"),
        Preset::Shopify => header("X-Shopify-Webhook-Id"),
        Preset::Hmac | Preset::None => Vec::new(),
    }
}

/// The key sources in force: the configured ones, else the preset's.
pub fn effective_key(config: &ProviderConfig) -> Vec<KeySource> {
    config
        .key
        .clone()
        .unwrap_or_else(|| preset_key(config.preset()))
}

/// The delivery mode in force: the configured one, else the preset's. GitHub does not
/// redeliver a failed webhook by itself, so its events are queued: hookgate redelivers.
pub fn effective_mode(config: &ProviderConfig) -> Mode {
    config.mode.unwrap_or(match config.preset() {
        Preset::Github => Mode::Queue,
        _ => Mode::Sync,
    })
}

/// How long a preset's sender retries a failed delivery, as each documents it (`None`: not
/// known, the global `retry.sender_horizon` applies).
pub fn preset_horizon(preset: Preset) -> Option<Duration> {
    let hours = |h: u64| Some(Duration::from_secs(h * 3600));
    match preset {
        // Up to three days, with exponential backoff.
        Preset::Stripe => hours(72),
        // Never by itself (queue mode is its default); a sync GitHub row is stale soon.
        Preset::Github => hours(1),
        // Svix's schedule: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h — about 28 hours.
        Preset::StandardWebhooks => hours(28),
        // Three retries within minutes.
        Preset::Slack => hours(1),
        // Eight retries over four hours.
        Preset::Shopify => hours(4),
        Preset::Hmac | Preset::None => None,
    }
}
