//! A provider at run time: its presets resolved into a key deriver, a signature verifier,
//! a fingerprinter and a target.
//!
//! A preset binds a real sender's signature scheme, timestamp window, key source and
//! fingerprint exclusions; anything set by hand in `[[providers]]` wins over it.

use crate::filter::Filter;
use std::sync::Arc;
use std::time::Duration;

use crate::canonical::Fingerprinter;
use crate::claim::Mode;
use crate::config::provider::{effective_key, effective_mode};
use crate::config::{Preset, ProviderConfig, Switch};
use crate::key::{KeyDeriver, KeySource};
use crate::signature::hmac::HmacSpec;
use crate::signature::standard::decode_secret;
use crate::signature::{Scheme, Verifier};

/// The window most senders document for their signed timestamps.
const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Where a provider's events go.
#[derive(Debug)]
pub struct Target {
    /// The URL events are POSTed to.
    pub url: Arc<str>,
    /// The delivery time limit.
    pub timeout: Duration,
    /// Request headers kept with a failed event besides content type and user agent (lower
    /// case): the provider's signature, timestamp and key headers, and `keep_headers`.
    pub keep_headers: Vec<String>,
    /// The decoded `target.signing_secret`: forwarded requests are signed with it.
    pub signing_key: Option<Arc<[u8]>>,
    /// For an `https://` URL: the certificate checks (system roots or `target.ca_file`).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// How long an event may wait for its delivery (the provider's sender horizon): a
    /// queue event the target keeps throttling past it becomes a dead letter.
    pub horizon: Duration,
    /// `keep_payload = "always"`: the payload is written with the claim and kept.
    pub keep_payload: bool,
    /// Which events it wants; `None`: every event.
    pub filter: Option<Filter>,
}

/// Everything a request to `POST /webhooks/{name}` needs.
pub struct Provider {
    /// The provider's name (the keys' scope).
    pub name: Arc<str>,
    /// Where its keys come from.
    pub key: KeyDeriver,
    /// Its signature check.
    pub verifier: Verifier,
    /// Its payload fingerprints.
    pub fingerprint: Fingerprinter,
    /// Where its events go.
    pub target: Arc<Target>,
    /// Sync or queue.
    pub mode: Mode,
    /// Queue mode: deliveries a second, per node (`None`: no limit).
    pub max_rate: Option<f64>,
    /// Queue mode: deliveries at once, per node (`None`: no limit).
    pub max_in_flight: Option<usize>,
}

/// The headers a scheme reads its signature from (lower case).
fn signature_headers(scheme: &Scheme) -> Vec<String> {
    match scheme {
        Scheme::None => Vec::new(),
        Scheme::Stripe => vec!["stripe-signature".into()],
        Scheme::Standard => vec![
            "webhook-signature".into(),
            "webhook-id".into(),
            "webhook-timestamp".into(),
        ],
        Scheme::Hmac(spec) => std::iter::once(&spec.header)
            .chain(&spec.timestamp_header)
            .map(|h| h.to_ascii_lowercase())
            .collect(),
    }
}

/// The signature scheme a provider's preset (or its `signature` table) names.
fn scheme(config: &ProviderConfig) -> Result<Scheme, String> {
    Ok(match config.preset() {
        Preset::None => Scheme::None,
        Preset::Stripe => Scheme::Stripe,
        Preset::StandardWebhooks => Scheme::Standard,
        Preset::Github => Scheme::Hmac(HmacSpec::github()),
        Preset::Slack => Scheme::Hmac(HmacSpec::slack()),
        Preset::Shopify => Scheme::Hmac(HmacSpec::shopify()),
        Preset::Hmac => {
            let s = config.signature.as_ref().ok_or_else(|| {
                format!(
                    "providers.{}: preset hmac needs signature = {{ … }}",
                    config.name
                )
            })?;
            Scheme::Hmac(HmacSpec {
                header: s.header.to_ascii_lowercase(),
                algorithm: s.algorithm,
                encoding: s.encoding,
                prefix: s.prefix.clone(),
                timestamp_header: s.timestamp_header.as_ref().map(|h| h.to_ascii_lowercase()),
                template: s.template.clone(),
            })
        }
    })
}

/// The TLS settings for an `https://` target: its chain and host name checked against the
/// system roots, or against `target.ca_file`.
fn target_tls(config: &ProviderConfig) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
    if !config.target.url.starts_with("https://") {
        return Ok(None);
    }
    crate::tls::client_config(config.target.ca_file.as_deref(), crate::tls::Verify::Full)
        .map(Some)
        .map_err(|e| format!("providers.{}.target: {e}", config.name))
}

/// The decoded forwarding secret, if one is configured (and loaded).
fn signing_key(config: &ProviderConfig) -> Result<Option<Arc<[u8]>>, String> {
    let Some(secret) = &config.target.signing_key else {
        return Ok(None);
    };
    let var = config
        .target
        .signing_secret
        .as_ref()
        .map_or("its variable", |s| s.env.as_str());
    decode_secret(secret.expose().as_bytes())
        .map(|key| Some(key.into()))
        .ok_or_else(|| {
            format!(
                "providers.{}.target.signing_secret: {var} is not a whsec_<base64> secret \
                 with a non-empty key",
                config.name
            )
        })
}

impl Provider {
    /// Resolves a validated `[[providers]]` entry (with its secrets read); `horizon` is its
    /// sender horizon (`Config::sender_horizon`).
    pub fn from_config(config: &ProviderConfig, horizon: Duration) -> Result<Self, String> {
        let scheme = scheme(config)?;
        if !matches!(scheme, Scheme::None) && config.signing_keys.is_empty() {
            return Err(format!(
                "providers.{}: preset {} needs at least one secret",
                config.name,
                config.preset().as_str()
            ));
        }
        if matches!(scheme, Scheme::Standard) {
            let named = config.secrets.iter().map(|s| s.env.as_str());
            for (key, var) in config.signing_keys.iter().zip(named) {
                if decode_secret(key.secret.expose().as_bytes()).is_none() {
                    return Err(format!(
                        "providers.{}.secrets: {var} is not a whsec_<base64> secret with a \
                         non-empty key",
                        config.name
                    ));
                }
            }
        }
        let exclude = config
            .fingerprint_exclude
            .clone()
            .unwrap_or_else(|| match config.preset() {
                // Stripe changes this count between deliveries of the same event.
                Preset::Stripe => vec!["/pending_webhooks".into()],
                _ => Vec::new(),
            });
        // Kept with a failed event (an allowlist): the signature and timestamp (people
        // need them to read the story), the key's own headers, and those the config names.
        let mut keep_headers = signature_headers(&scheme);
        keep_headers.extend(effective_key(config).into_iter().filter_map(|s| match s {
            KeySource::Header { header } => Some(header.to_ascii_lowercase()),
            _ => None,
        }));
        keep_headers.extend(config.keep_headers.iter().map(|h| h.to_ascii_lowercase()));
        Ok(Self {
            name: config.name.as_str().into(),
            key: KeyDeriver::new(effective_key(config)),
            verifier: Verifier::new(
                scheme,
                config.signing_keys.clone(),
                config.tolerance.unwrap_or(DEFAULT_TOLERANCE),
            ),
            fingerprint: Fingerprinter::new(config.fingerprint == Switch::On, exclude),
            target: Arc::new(Target {
                url: config.target.url.as_str().into(),
                timeout: config.target.timeout,
                keep_headers,
                signing_key: signing_key(config)?,
                tls: target_tls(config)?,
                horizon,
                keep_payload: config.keep_payload == crate::config::provider::KeepPayload::Always,
                filter: config.target.filter.clone(),
            }),
            mode: effective_mode(config),
            max_rate: config.target.max_rate,
            max_in_flight: config.target.max_in_flight,
        })
    }
}
