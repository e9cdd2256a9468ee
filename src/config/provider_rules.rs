//! The rules of the admin token and of every `[[providers]]` entry: unique URL-safe
//! names, a target timeout shorter than the lease, key sources, signatures and secrets.

use std::collections::HashSet;
use std::time::Duration;

use super::provider::{effective_key, Preset, ProviderConfig};
use super::route_rules::route_rules;
use super::rule::{advice, rule, show, Rule};
use super::settings::Config;
use crate::key::KeySource;

/// The admin token and every `[[providers]]` entry.
pub(super) fn provider_rules(config: &Config) -> Vec<Rule> {
    let lease = config.lease.duration;
    let mut rules = vec![
        rule(
            "admin.token_env names a variable",
            config.admin.token_env.as_deref() != Some(""),
            match &config.admin.token_env {
                Some(var) => format!("token from ${var}"),
                None => "admin API disabled".into(),
            },
        ),
        rule(
            "at least one [[providers]] entry",
            !config.providers.is_empty(),
            format!("{} providers", config.providers.len()),
        ),
    ];
    let mut seen = HashSet::new();
    let network = !config.server.on_loopback();
    for p in &config.providers {
        let unique = seen.insert(p.name.as_str());
        rules.extend(one_provider_rules(p, unique));
        rules.extend(unsigned_rules(p, network, &config.server.listen));
        rules.extend(route_rules(p, lease));
        rules.extend(delivery_rules(p, config.sender_horizon(p)));
    }
    rules
}

/// The sender horizon is not shorter than an hour without a warning (each route's own
/// rules are in `route_rules`).
fn delivery_rules(p: &ProviderConfig, horizon: Duration) -> Vec<Rule> {
    let name = &p.name;
    vec![advice(
        format!("providers.{name}: sender horizon >= 1h"),
        horizon >= Duration::from_secs(3600),
        format!(
            "sync rows untouched for {} become sender_gave_up dead letters",
            show(horizon)
        ),
    )]
}

/// Who can make an event pass: the preset must be written (a missing one is not an
/// opt-out), unsigned events reach a network listener only with a second opt-in, and a
/// demo secret (public: it is written in the config) is used on loopback only.
fn unsigned_rules(p: &ProviderConfig, network: bool, listen: &str) -> Vec<Rule> {
    let name = &p.name;
    let unsigned = p.preset() == Preset::None;
    let mut rules = vec![
        rule(
            format!("providers.{name}.preset is set"),
            p.preset.is_some(),
            "no preset verifies nothing: name the sender's (stripe, github, \
             standard-webhooks, slack, shopify, hmac), or write preset = \"none\" to accept \
             unsigned events",
        ),
        advice(
            format!("providers.{name}: signatures are verified"),
            !unsigned,
            format!(
                "preset {}: anyone who can reach the port can send events",
                p.preset().as_str()
            ),
        ),
        rule(
            format!("providers.{name}: unsigned events only on loopback"),
            !unsigned || !network || p.allow_unsigned_from_network,
            format!(
                "preset none on server.listen {listen}: use a signing preset, listen on \
                 127.0.0.1, or set allow_unsigned_from_network = true"
            ),
        ),
    ];
    for secret in p.secrets.iter().filter(|s| s.demo_in_use()) {
        let var = &secret.env;
        let detail = format!(
            "${var} is unset, so the demo secret written in the config is used: anyone who \
             reads the config can sign events; set ${var}"
        );
        rules.push(if network {
            rule(
                format!("providers.{name}: no demo secret on a network address"),
                false,
                format!("{detail} (server.listen {listen})"),
            )
        } else {
            advice(format!("providers.{name}: demo secret"), false, detail)
        });
    }
    rules
}

/// The rules of one `[[providers]]` entry; `unique` says no earlier entry has its name.
fn one_provider_rules(p: &ProviderConfig, unique: bool) -> Vec<Rule> {
    let mut rules = Vec::new();
    let name = &p.name;
    rules.push(rule(
        format!("providers.{name}: name is unique and URL-safe"),
        unique
            && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "letters, digits, '-' and '_' only",
    ));
    let key = effective_key(p);
    let pointer_ok = |ptr: &String| ptr.is_empty() || ptr.starts_with('/');
    let pointers_ok = key.iter().all(|k| match k {
        KeySource::Header { header } => !header.is_empty(),
        KeySource::Json { json } => pointer_ok(json),
        KeySource::Fields { fields } => !fields.is_empty() && fields.iter().all(pointer_ok),
    });
    rules.push(rule(
        format!("providers.{name}.key has sources"),
        !key.is_empty() && pointers_ok,
        format!(
            "{} source(s), explicit or from preset {}; JSON pointers start with '/'",
            key.len(),
            p.preset().as_str()
        ),
    ));
    let signed = p.preset() != Preset::None;
    rules.push(rule(
        format!("providers.{name}.secrets when signatures are verified"),
        !signed || !p.secrets.is_empty(),
        format!("{} secret(s) named", p.secrets.len()),
    ));
    rules.push(rule(
        format!("providers.{name}.signature set exactly for preset hmac"),
        (p.preset() == Preset::Hmac) == p.signature.is_some(),
        format!("preset {}", p.preset().as_str()),
    ));
    if let Some(sig) = &p.signature {
        rules.push(rule(
            format!("providers.{name}.signature.template signs {{body}}"),
            sig.template.contains("{body}"),
            format!(
                "template {:?}: a signature over a template without {{body}} says nothing \
                 about the body",
                sig.template
            ),
        ));
        rules.push(rule(
            format!("providers.{name}.signature.template signs {{timestamp}} when timestamp_header is set"),
            sig.timestamp_header.is_none() || sig.template.contains("{timestamp}"),
            format!(
                "template {:?}, timestamp_header {:?}: an unsigned timestamp can be replaced, \
                 so the replay window protects nothing; write e.g. \"{{timestamp}}.{{body}}\"",
                sig.template,
                sig.timestamp_header.as_deref().unwrap_or("-")
            ),
        ));
    }
    let now = std::time::SystemTime::now();
    let expired: Vec<&str> = p
        .secrets
        .iter()
        .filter(|s| matches!(s.not_after(), Ok(Some(t)) if t <= now))
        .map(|s| s.env.as_str())
        .collect();
    rules.push(advice(
        format!("providers.{name}.secrets are not past their not_after"),
        expired.is_empty(),
        if expired.is_empty() {
            "ok".to_owned()
        } else {
            format!(
                "{} already past not_after: ignored, signatures made with it fail",
                expired.join(", ")
            )
        },
    ));
    let bad_dates: Vec<String> = p
        .secrets
        .iter()
        .filter_map(|s| s.not_after().err())
        .collect();
    rules.push(rule(
        format!("providers.{name}.secrets not_after are RFC 3339"),
        bad_dates.is_empty(),
        if bad_dates.is_empty() {
            "ok".into()
        } else {
            bad_dates.join("; ")
        },
    ));
    rules
}

#[cfg(test)]
#[path = "provider_rules_tests.rs"]
mod tests;
