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

/// Environment variables for one run of the binary.
type Env<'a> = Vec<(&'a str, &'a str)>;

/// A secret that decodes (Standard Webhooks: `whsec_` + base64 of a key).
const GOOD_WHSEC: &str = "whsec_aG9va2dhdGUtdGVzdC1rZXktMzItYnl0ZXMtbG9uZyE=";

/// `check-config` is how operators learn whether `serve` will start: for each config
/// below it fails, naming what to change (a secret's variable, never its value), exactly
/// when `serve` refuses to start — a Standard Webhooks secret `serve` cannot decode, a
/// forwarding secret likewise, a target CA file that is not there, a log level that is
/// none, a listen address that is none, a store schema or trust anchor `serve` refuses —
/// and a good config passes both.
#[test]
fn check_config_fails_exactly_when_serve_refuses_to_start() {
    let dir = std::env::temp_dir().join(format!(
        "hookgate-agree-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = format!("sqlite://{}", dir.join("hookgate.db").display());
    let config = |server: &str, store: &str, provider: &str, log: &str| {
        format!(
            "[server]\nlisten = \"{server}\"\n[store]\n{store}\n[log]\nlevel = \"{log}\"\n\
             [[providers]]\nname = \"sw\"\npreset = \"standard-webhooks\"\n\
             secrets = [{{ env = \"SW_SECRET\" }}]\n{provider}"
        )
    };
    let store = format!("url = \"{sqlite}\"");
    let target = "target = { url = \"http://127.0.0.1:9/\" }";
    let good = config("127.0.0.1:0", &store, target, "info");
    let with_secret = |value: &'static str| vec![("SW_SECRET", value)];

    assert!(check(&dir, &good, &with_secret(GOOD_WHSEC)).0);
    assert!(serve_starts(&dir, &good, &with_secret(GOOD_WHSEC)));

    let forwarding = "target = { url = \"http://127.0.0.1:9/\", \
                      signing_secret = { env = \"FWD_SECRET\" } }";
    let missing_ca =
        "target = { url = \"https://127.0.0.1:9/\", ca_file = \"/nonexistent/ca.pem\" }";
    let pg = |query: &str, schema: &str| {
        format!("url = \"postgres://app@127.0.0.1:9/h{query}\"\nschema = \"{schema}\"")
    };
    // What is wrong, the config, its environment, and what the FAIL line must name.
    let cases: Vec<(&str, String, Env<'_>, &str)> = vec![
        (
            "empty key",
            good.clone(),
            with_secret("whsec_"),
            "SW_SECRET",
        ),
        (
            "not base64",
            good.clone(),
            with_secret("whsec_not*base64!"),
            "SW_SECRET",
        ),
        (
            "forwarding secret",
            config("127.0.0.1:0", &store, forwarding, "info"),
            vec![("SW_SECRET", GOOD_WHSEC), ("FWD_SECRET", "whsec_")],
            "FWD_SECRET",
        ),
        (
            "target CA file",
            config("127.0.0.1:0", &store, missing_ca, "info"),
            with_secret(GOOD_WHSEC),
            "/nonexistent/ca.pem",
        ),
        (
            "log level",
            config("127.0.0.1:0", &store, target, "loud"),
            with_secret(GOOD_WHSEC),
            "log.level",
        ),
        (
            "listen address",
            config("nowhere", &store, target, "info"),
            with_secret(GOOD_WHSEC),
            "server.listen",
        ),
        (
            "store schema",
            config(
                "127.0.0.1:0",
                &pg("?sslmode=disable", "bad-name"),
                target,
                "info",
            ),
            with_secret(GOOD_WHSEC),
            "store.schema",
        ),
        (
            "store trust anchor",
            config(
                "127.0.0.1:0",
                &pg(
                    "?sslmode=verify-full&sslrootcert=/nonexistent/root.pem",
                    "h",
                ),
                target,
                "info",
            ),
            with_secret(GOOD_WHSEC),
            "/nonexistent/root.pem",
        ),
    ];
    for (what, text, env, named) in cases {
        let (passed, stdout) = check(&dir, &text, &env);
        assert!(!passed, "{what}: check-config passed\n{stdout}");
        let fail = stdout
            .lines()
            .find(|l| l.starts_with("FAIL") && l.contains(named));
        assert!(fail.is_some(), "{what}: no FAIL naming {named}\n{stdout}");
        // (`whsec_` alone is also the prefix the messages name.)
        for (_, value) in &env {
            if *value != GOOD_WHSEC && *value != "whsec_" {
                assert!(!stdout.contains(value), "{what}: a secret shown\n{stdout}");
            }
        }
        assert!(!serve_starts(&dir, &text, &env), "{what}: serve started");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `hookgate check-config` on `text` with `env` (and nothing else named by the config set):
/// whether it passed, and its output.
fn check(dir: &std::path::Path, text: &str, env: &[(&str, &str)]) -> (bool, String) {
    let out = hookgate(dir, "check-config", text, env)
        .output()
        .expect("check-config");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Whether `hookgate serve` on `text` starts (logs `hookgate.listening`; it is then
/// killed) or exits first, refusing.
fn serve_starts(dir: &std::path::Path, text: &str, env: &[(&str, &str)]) -> bool {
    use std::io::BufRead;
    let mut child = hookgate(dir, "serve", text, env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let listening = std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("hookgate.listening"));
        let _ = tx.send(listening);
    });
    let started = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("serve neither started nor exited within a minute");
    let _ = child.kill();
    let _ = child.wait();
    started
}

fn hookgate(dir: &std::path::Path, command: &str, text: &str, env: &[(&str, &str)]) -> Command {
    let file = dir.join(format!("c-{}.toml", fastrand::u32(..)));
    std::fs::write(&file, text).unwrap();
    let mut hookgate = Command::new(env!("CARGO_BIN_EXE_hookgate"));
    hookgate
        .args([command, "--config"])
        .arg(&file)
        .current_dir(dir)
        .env_remove("SW_SECRET")
        .env_remove("FWD_SECRET");
    for (name, value) in env {
        hookgate.env(name, value);
    }
    hookgate
}
