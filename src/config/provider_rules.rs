//! The rules of the admin token and of every `[[providers]]` entry: unique URL-safe
//! names, a target timeout shorter than the lease, key sources, signatures and secrets.

use std::collections::HashSet;
use std::time::Duration;

use super::provider::{effective_key, effective_mode, Preset, ProviderConfig};
use super::rule::{advice, rule, show, Rule};
use super::settings::Config;
use crate::claim::Mode;
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
        rules.extend(delivery_rules(p, lease, config.sender_horizon(p)));
    }
    rules
}

/// How the entry's events are delivered: in sync mode the target timeout must be shorter
/// than the lease; in queue mode the lease is renewed every third of itself while a
/// delivery runs, so the rule becomes "renewal interval < lease"; queue limits make sense;
/// the sender horizon is not shorter than an hour without a warning.
fn delivery_rules(p: &ProviderConfig, lease: Duration, horizon: Duration) -> Vec<Rule> {
    let name = &p.name;
    let timeout = p.target.timeout;
    let mut rules = vec![match effective_mode(p) {
        Mode::Sync => rule(
            format!("providers.{name}.target.timeout < lease.duration"),
            timeout < lease,
            format!(
                "timeout {} vs lease {}: lower the timeout or raise lease.duration",
                show(timeout),
                show(lease)
            ),
        ),
        Mode::Queue => rule(
            format!("providers.{name} (queue): lease renewal interval < lease.duration"),
            lease / 3 < lease,
            format!(
                "renewed every {} while a delivery runs (timeout {}); a crash frees the row \
                 after at most {}",
                show(lease / 3),
                show(timeout),
                show(lease)
            ),
        ),
    }];
    rules.push(rule(
        format!("providers.{name}.target.max_rate > 0 and max_in_flight >= 1"),
        p.target.max_rate.is_none_or(|r| r > 0.0 && r.is_finite())
            && p.target.max_in_flight.is_none_or(|n| n >= 1),
        format!(
            "max_rate {:?}, max_in_flight {:?}",
            p.target.max_rate, p.target.max_in_flight
        ),
    ));
    rules.push(advice(
        format!("providers.{name}: sender horizon >= 1h"),
        horizon >= Duration::from_secs(3600),
        format!(
            "sync rows untouched for {} become sender_gave_up dead letters",
            show(horizon)
        ),
    ));
    rules
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
    let url = &p.target.url;
    rules.push(rule(
        format!("providers.{name}.target.url is http:// or https://"),
        url.starts_with("http://") || url.starts_with("https://"),
        format!("url = {url}"),
    ));
    let local = ["http://127.", "http://localhost", "http://[::1]"]
        .iter()
        .any(|prefix| url.starts_with(prefix));
    rules.push(advice(
        format!("providers.{name}.target: plain http:// only on this host"),
        !url.starts_with("http://") || local,
        format!("url = {url}: events would cross the network unencrypted; use https://"),
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
    rules.push(rule(
        format!("providers.{name}.target.signing_secret has no not_after"),
        p.target
            .signing_secret
            .as_ref()
            .is_none_or(|s| s.not_after.is_none()),
        "the forwarding secret is used until it is replaced; not_after applies to secrets",
    ));
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
mod tests {
    use crate::config::Config;

    fn unsigned(listen: &str, preset: &str, extra: &str) -> Result<Config, String> {
        Config::from_toml(&format!(
            r#"
            [server]
            listen = "{listen}"
            [[providers]]
            name = "p"
            {preset}
            {extra}
            key = [{{ json = "/id" }}]
            target = {{ url = "http://127.0.0.1:9/" }}
            "#
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_provider_without_a_preset_is_refused_and_none_must_be_written() {
        let err = unsigned("127.0.0.1:8080", "", "").unwrap_err();
        assert!(err.contains("providers.p.preset is set"), "{err}");
        assert!(
            err.contains("preset = \"none\""),
            "says how to opt out: {err}"
        );
        let config = unsigned("127.0.0.1:8080", r#"preset = "none""#, "").expect("opted out");
        let warned = config.rules().into_iter().any(|r| {
            r.name == "providers.p: signatures are verified"
                && r.status == crate::config::RuleStatus::Warn
        });
        assert!(warned, "an unsigned provider is still warned about");
    }

    #[test]
    fn unsigned_events_off_loopback_need_a_second_opt_in() {
        for listen in ["0.0.0.0:8080", "10.0.0.5:80", "[::]:8080", "example.com:80"] {
            let err = unsigned(listen, r#"preset = "none""#, "").unwrap_err();
            assert!(
                err.contains("providers.p: unsigned events only on loopback")
                    && err.contains("allow_unsigned_from_network"),
                "{listen}: {err}"
            );
            unsigned(
                listen,
                r#"preset = "none""#,
                "allow_unsigned_from_network = true",
            )
            .unwrap_or_else(|e| panic!("{listen}: {e}"));
        }
        for listen in [
            "127.0.0.1:8080",
            "[::1]:80",
            "localhost:8080",
            "127.0.0.2:1",
        ] {
            unsigned(listen, r#"preset = "none""#, "").unwrap_or_else(|e| panic!("{listen}: {e}"));
        }
    }

    #[test]
    fn a_demo_secret_warns_on_loopback_and_is_refused_on_a_network_address() {
        let secret = r#"preset = "stripe"
            secrets = [{ env = "HOOKGATE_TEST_SURELY_UNSET_DEMO", demo = "whsec_demo" }]"#;
        let config = unsigned("127.0.0.1:8080", secret, "").expect("allowed on loopback");
        let warned = config.rules().into_iter().any(|r| {
            r.name == "providers.p: demo secret" && r.status == crate::config::RuleStatus::Warn
        });
        assert!(warned);
        let err = unsigned("0.0.0.0:8080", secret, "").unwrap_err();
        assert!(
            err.contains("no demo secret on a network address")
                && err.contains("HOOKGATE_TEST_SURELY_UNSET_DEMO"),
            "{err}"
        );
    }

    #[test]
    fn an_hmac_template_must_sign_the_body_and_a_checked_timestamp() {
        let config = |signature: &str| {
            Config::from_toml(&format!(
                r#"
                [[providers]]
                name = "h"
                preset = "hmac"
                key = [{{ json = "/id" }}]
                secrets = [{{ env = "H" }}]
                signature = {signature}
                target = {{ url = "http://127.0.0.1:9/" }}
                "#
            ))
        };
        let unsigned_ts = config(r#"{ header = "X-Sig", timestamp_header = "X-Ts" }"#);
        let err = unsigned_ts.unwrap_err().to_string();
        assert!(
            err.contains("signs {timestamp} when timestamp_header is set"),
            "{err}"
        );
        let no_body = config(r#"{ header = "X-Sig", template = "{timestamp}" }"#);
        let err = no_body.unwrap_err().to_string();
        assert!(err.contains("signs {body}"), "{err}");
        let good =
            r#"{ header = "X-Sig", timestamp_header = "X-Ts", template = "{timestamp}.{body}" }"#;
        config(good).expect("valid");
        config(r#"{ header = "X-Sig" }"#).expect("valid");
    }

    #[test]
    fn a_forwarding_secret_with_not_after_is_refused_and_an_expired_secret_warned() {
        let err = Config::from_toml(
            r#"
            [[providers]]
            name = "p"
            preset = "none"
            key = [{ json = "/id" }]
            target = { url = "http://127.0.0.1:9/", signing_secret = { env = "S", not_after = "2030-01-01T00:00:00Z" } }
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("providers.p.target.signing_secret has no not_after"),
            "{err}"
        );
        let config = Config::from_toml(
            r#"
            [[providers]]
            name = "p"
            preset = "stripe"
            secrets = [{ env = "OLD", not_after = "2020-01-01T00:00:00Z" }, { env = "NEW" }]
            target = { url = "http://127.0.0.1:9/" }
            "#,
        )
        .expect("allowed");
        let warned: Vec<_> = config
            .rules()
            .into_iter()
            .filter(|r| r.status == super::super::RuleStatus::Warn)
            .map(|r| r.to_string())
            .collect();
        assert!(
            warned
                .iter()
                .any(|r| r.contains("OLD already past not_after")),
            "{warned:?}"
        );
    }

    #[test]
    fn a_standard_webhooks_secret_that_is_empty_or_not_base64_is_refused_by_name() {
        use crate::secret::Secret;
        use crate::signature::SigningKey;
        for value in ["whsec_", "whsec_not base64!"] {
            let mut config = Config::from_toml(
                r#"
                [[providers]]
                name = "sw"
                preset = "standard-webhooks"
                secrets = [{ env = "SW_SECRET" }]
                target = { url = "http://127.0.0.1:9/" }
                "#,
            )
            .expect("valid");
            let p = &mut config.providers[0];
            p.signing_keys = vec![SigningKey {
                secret: Secret::new(value),
                not_after: None,
            }];
            let err = crate::provider::Provider::from_config(p, std::time::Duration::from_secs(60))
                .err()
                .expect("refused");
            assert!(err.contains("SW_SECRET"), "{value}: {err}");
        }
    }

    #[test]
    fn a_signing_preset_without_secrets_is_refused() {
        let err = Config::from_toml(
            r#"
            [[providers]]
            name = "gh"
            preset = "github"
            target = { url = "http://127.0.0.1:9000/" }
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("providers.gh.secrets"), "{err}");
    }

    #[test]
    fn presets_supply_the_key_and_bad_dates_are_named() {
        let err = Config::from_toml(
            r#"
            [[providers]]
            name = "st"
            preset = "stripe"
            secrets = [{ env = "X", not_after = "tomorrow" }]
            target = { url = "http://127.0.0.1:9000/" }
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(!err.contains("key has sources"), "{err}");
        assert!(err.contains("not_after"), "{err}");
    }

    #[test]
    fn preset_hmac_needs_its_signature_table() {
        let err = Config::from_toml(
            r#"
            [[providers]]
            name = "h"
            preset = "hmac"
            key = [{ header = "X-Id" }]
            secrets = [{ env = "X" }]
            target = { url = "http://127.0.0.1:9000/" }
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("signature set exactly for preset hmac"),
            "{err}"
        );
    }

    #[test]
    fn a_short_sender_horizon_warns_and_queue_mode_lifts_the_timeout_rule() {
        let config = Config::from_toml(
            r#"
            [lease]
            duration = "8s"
            [retry]
            base = "10s"
            [[providers]]
            name = "q"
            preset = "none"
            mode = "queue"
            sender_horizon = "30s"
            key = [{ json = "/id" }]
            target = { url = "http://127.0.0.1:9000/", timeout = "1m" }
            "#,
        )
        .expect("a queue target may outlast the lease");
        let rules = config.rules();
        let horizon = rules
            .iter()
            .find(|r| r.name == "providers.q: sender horizon >= 1h")
            .expect("the horizon rule");
        assert_eq!(horizon.status, crate::config::RuleStatus::Warn);
        assert!(rules
            .iter()
            .any(|r| r.name.contains("(queue): lease renewal")));
        let sync = Config::from_toml(
            r#"
            [lease]
            duration = "8s"
            [retry]
            base = "10s"
            [[providers]]
            name = "s"
            preset = "none"
            key = [{ json = "/id" }]
            target = { url = "http://127.0.0.1:9000/", timeout = "1m" }
            "#,
        );
        assert!(
            sync.is_err(),
            "in sync mode the timeout must stay under the lease"
        );
    }

    #[test]
    fn the_github_preset_queues_by_default() {
        let config = Config::from_toml(
            r#"
            [[providers]]
            name = "gh"
            preset = "github"
            secrets = [{ env = "X" }]
            target = { url = "http://127.0.0.1:9000/" }
            "#,
        )
        .expect("valid");
        let gh = config.provider("gh").expect("provider");
        assert_eq!(crate::config::effective_mode(gh), crate::claim::Mode::Queue);
        assert_eq!(
            config.sender_horizon(gh),
            std::time::Duration::from_secs(3600)
        );
    }
}
