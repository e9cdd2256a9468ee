//! The providers' rules under test: which configs they refuse or warn about, in words that
//! say what to fix, and which they let through.

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
