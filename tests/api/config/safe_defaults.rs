//! Safe by default: the shipped config verifies its provider, its demo secret never serves
//! a network address, `deploy/` serves nothing unsigned, and `hookgate send` signs a test
//! event the way the provider's sender would, so the README's demo works with signatures
//! on.

use std::process::{Command, Output};

use hookgate::secret::Secret;

use hookgate::config::{Config, Preset};
use hookgate::signature::SigningKey;

use crate::helpers::{spawn_app_with, TestApp, PROVIDER};

const DEMO: &str = "whsec_hookgate_demo_secret_PUBLIC_do_not_use";

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Runs the binary with `config_text` as its config (the demo secret's variable unset).
fn run(args: &[&str], config_text: &str, env: &[(&str, &str)]) -> Output {
    let dir = std::env::temp_dir().join(format!(
        "hookgate-safe-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(&file, config_text).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_hookgate"));
    command
        .args(args)
        .arg("--config")
        .arg(&file)
        .current_dir(&dir)
        .env_remove("STRIPE_WEBHOOK_SECRET");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

#[test]
fn the_shipped_config_verifies_its_provider_with_a_demo_secret_for_loopback_only() {
    let text = repo_file("config/hookgate.toml");
    let config = Config::from_toml(&text).expect("the shipped config is valid");
    assert!(config.server.on_loopback());
    for p in &config.providers {
        assert_ne!(p.preset(), Preset::None, "{} verifies signatures", p.name);
        assert!(p.secrets.iter().all(|s| s.demo.is_some()));
    }
    let out = run(&["check-config"], &text, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("WARN providers.stripe: demo secret"),
        "{stdout}"
    );
}

#[test]
fn deploy_serves_nothing_unsigned_and_refuses_the_public_demo_secret() {
    let dockerfile = repo_file("deploy/Dockerfile");
    let copied = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("COPY config/"))
        .and_then(|l| l.split_whitespace().next())
        .expect("the Dockerfile copies a config");
    let listen = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ENV HOOKGATE_SERVER__LISTEN="))
        .expect("the image listens on the network");
    let text = repo_file(&format!("config/{copied}"));
    let on_network = [("HOOKGATE_SERVER__LISTEN", listen)];
    let out = run(&["check-config"], &text, &on_network);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("FAIL providers.stripe: no demo secret on a network address"),
        "{stdout}"
    );
    let out = run(&["serve"], &text, &on_network);
    assert!(!out.status.success(), "serve refuses it too");
    assert!(String::from_utf8_lossy(&out.stderr).contains("STRIPE_WEBHOOK_SECRET"));
    // With the secret set, as the image's instructions say, the same config passes.
    let secret = [on_network[0], ("STRIPE_WEBHOOK_SECRET", "whsec_real")];
    let out = run(&["check-config"], &text, &secret);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let mut config = Config::from_toml(&text).unwrap();
    config.server.listen = listen.into();
    config.providers[0].preset = Some(Preset::None);
    config.providers[0].secrets.clear();
    assert!(config.validate().is_err(), "unsigned on the network");
}

/// A node whose provider verifies Stripe signatures with the demo secret.
async fn stripe_node() -> TestApp {
    spawn_app_with(|c| {
        let p = &mut c.providers[0];
        p.preset = Some(Preset::Stripe);
        p.signing_keys = vec![SigningKey {
            secret: Secret::new(DEMO),
            not_after: None,
        }];
    })
    .await
}

/// `hookgate send` against `app` with the shipped config's provider section.
async fn send(app: &TestApp, id: &str) -> (bool, String) {
    let text = repo_file("config/hookgate.toml");
    let url = format!("{}/webhooks/{PROVIDER}", app.address);
    let id = id.to_owned();
    let out = actix_web::rt::task::spawn_blocking(move || {
        run(&["send", PROVIDER, "--id", &id, "--url", &url], &text, &[])
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        out.status.success(),
        format!("{}{stderr}", String::from_utf8_lossy(&out.stdout)),
    )
}

#[actix_web::test]
async fn hookgate_send_signs_a_test_event_that_passes_and_a_forged_one_does_not() {
    let app = stripe_node().await;
    let (ok, out) = send(&app, "evt_sent").await;
    assert!(ok, "{out}");
    assert!(
        out.contains("HTTP 2") && out.contains("hookgate-path: first_run"),
        "{out}"
    );
    let (ok, out) = send(&app, "evt_sent").await;
    assert!(ok && out.contains("hookgate-path: duplicate_done"), "{out}");
    assert_eq!(app.target.count(&TestApp::idem("evt_sent")), 1);
    // The same body without a signature, or signed with another secret, is refused.
    let forged = app.deliver("evt_forged", r#"{"id":"evt_forged"}"#).await;
    assert_eq!(forged.status, 401, "{}", forged.body);
    let header = "t=1700000000,v1=0000000000000000000000000000000000000000000000000000000000000000";
    let wrong = app
        .post(
            &format!("/webhooks/{PROVIDER}"),
            &[("Stripe-Signature", header)],
            r#"{"id":"evt_forged"}"#.into(),
        )
        .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(app.target.count(&TestApp::idem("evt_forged")), 0);
}
