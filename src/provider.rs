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
use crate::config::{route_scope, Preset, ProviderConfig, Switch, TargetConfig};
pub use crate::key::{provider_of, route_of};
use crate::key::{KeyDeriver, KeySource};
use crate::signature::hmac::HmacSpec;
use crate::signature::standard::decode_secret;
use crate::signature::{Scheme, Verifier};

/// Headers that carry credentials: never kept, even when a route's filter reads them.
const CREDENTIALS: &[&str] = &["authorization", "proxy-authorization", "cookie"];

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
    /// case): the provider's signature, timestamp and key headers, `keep_headers`, and the
    /// headers its routes' filters read.
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

/// One destination of a provider's events: its main route (`target`) or one of its
/// `routes`, each with rows of its own (its scope).
#[derive(Debug)]
pub struct Route {
    /// Its name: `main` (unless named otherwise) for the provider's `target`.
    pub name: Arc<str>,
    /// The provider's name.
    pub provider: Arc<str>,
    /// Its rows' scope (the `provider` column): the provider's name for the main route,
    /// `provider.route` for the others.
    pub scope: Arc<str>,
    /// Where its events go.
    pub target: Arc<Target>,
    /// Queue mode: deliveries a second, per node (`None`: no limit).
    pub max_rate: Option<f64>,
    /// Queue mode: deliveries at once, per node (`None`: no limit).
    pub max_in_flight: Option<usize>,
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
    pub fingerprint: Arc<Fingerprinter>,
    /// Where its events go: the main route's target (`routes[0]`).
    pub target: Arc<Target>,
    /// Every route, the main one first; an event goes to each whose filter accepts it.
    pub routes: Vec<Arc<Route>>,
    /// Sync or queue.
    pub mode: Mode,
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
fn target_tls(
    target: &TargetConfig,
    at: &str,
) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
    if !target.url.starts_with("https://") {
        return Ok(None);
    }
    crate::tls::client_config(target.ca_file.as_deref(), crate::tls::Verify::Full)
        .map(Some)
        .map_err(|e| format!("{at}: {e}"))
}

/// The decoded forwarding secret, if one is configured (and loaded).
fn signing_key(target: &TargetConfig, at: &str) -> Result<Option<Arc<[u8]>>, String> {
    let Some(secret) = &target.signing_key else {
        return Ok(None);
    };
    let var = target
        .signing_secret
        .as_ref()
        .map_or("its variable", |s| s.env.as_str());
    decode_secret(secret.expose().as_bytes())
        .map(|key| Some(key.into()))
        .ok_or_else(|| {
            format!(
                "{at}.signing_secret: {var} is not a whsec_<base64> secret with a non-empty \
                 key"
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
        // And those the routes' filters read (so that a job giving old events to a route
        // can check them again), unless they carry credentials: those are never stored.
        for (_, route) in config.all_routes() {
            let read = route.filter.iter().flat_map(|f| f.headers());
            keep_headers.extend(
                read.map(str::to_ascii_lowercase)
                    .filter(|h| !CREDENTIALS.contains(&h.as_str())),
            );
        }
        let name: Arc<str> = config.name.as_str().into();
        let keep_payload = config.keep_payload == crate::config::provider::KeepPayload::Always;
        let routes = config
            .all_routes()
            .map(|(at, t)| {
                let at = format!("providers.{}.{at}", config.name);
                let main = std::ptr::eq(t, &config.target);
                let route = t.name.as_deref().unwrap_or(crate::key::MAIN_ROUTE);
                Ok(Arc::new(Route {
                    name: route.into(),
                    provider: Arc::clone(&name),
                    scope: route_scope(&config.name, (!main).then_some(route)).into(),
                    target: Arc::new(Target {
                        url: t.url.as_str().into(),
                        timeout: t.timeout,
                        keep_headers: keep_headers.clone(),
                        signing_key: signing_key(t, &at)?,
                        tls: target_tls(t, &at)?,
                        horizon,
                        keep_payload,
                        filter: t.filter.clone(),
                    }),
                    max_rate: t.max_rate,
                    max_in_flight: t.max_in_flight,
                }))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            name,
            key: KeyDeriver::new(effective_key(config)),
            verifier: Verifier::new(
                scheme,
                config.signing_keys.clone(),
                config.tolerance.unwrap_or(DEFAULT_TOLERANCE),
            ),
            fingerprint: Arc::new(Fingerprinter::new(
                config.fingerprint == Switch::On,
                exclude,
            )),
            target: Arc::clone(&routes[0].target),
            routes,
            mode: effective_mode(config),
        })
    }
}
