//! The production edges: signed forwarding, config errors and commands that explain
//! themselves, and the files an operator deploys with. (What `check-config` prints:
//! `check_config.rs`.)

use base64::Engine;
use hmac::{KeyInit, Mac};

use crate::helpers::{spawn_app_with, TestApp};

use super::run;

const FORWARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The Standard Webhooks check, written here from the specification — not hookgate's
/// verifier: base64-decode the secret after `whsec_`, HMAC-SHA256 `id.timestamp.body`,
/// compare with a `v1,` entry.
fn standard_webhooks_valid(secret: &str, id: &str, ts: &str, body: &[u8], header: &str) -> bool {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(secret.trim_start_matches("whsec_")).unwrap();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    let expected = b64.encode(mac.finalize().into_bytes());
    header
        .split(' ')
        .filter_map(|e| e.strip_prefix("v1,"))
        .any(|sig| sig == expected)
}

#[actix_web::test]
async fn forwarded_requests_are_signed_so_the_target_can_verify_them() {
    let app = spawn_app_with(|c| {
        c.providers[0].target.signing_key = Some(hookgate::secret::Secret::new(FORWARD_SECRET));
    })
    .await;
    let body = r#"{"id":"evt_sig","amount":42}"#;
    assert_eq!(app.deliver("evt_sig", body).await.status, 201);
    let seen = app.target.last(&TestApp::idem("evt_sig"));
    let (id, ts, signature) = seen.webhook.expect("signed");
    assert_eq!(id, TestApp::idem("evt_sig"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(ts.parse::<u64>().unwrap().abs_diff(now) < 300, "{ts}");
    assert!(standard_webhooks_valid(
        FORWARD_SECRET,
        &id,
        &ts,
        body.as_bytes(),
        &signature
    ));
    assert!(!standard_webhooks_valid(
        FORWARD_SECRET,
        &id,
        &ts,
        b"{}",
        &signature
    ));
}

#[actix_web::test]
async fn unsigned_forwarding_carries_no_signature_headers() {
    let app = spawn_app_with(|_| {}).await;
    app.deliver("evt_plain", "{}").await;
    assert!(app
        .target
        .last(&TestApp::idem("evt_plain"))
        .webhook
        .is_none());
}

#[test]
fn a_config_error_prints_the_rules_and_no_backtrace() {
    let out = run(
        &["serve"],
        "[lease]\nduration = \"60s\"\n[[providers]]\nname = \"s\"\npreset = \"none\"\nkey = [{ json = \"/id\" }]\n\
         target = { url = \"http://127.0.0.1:9/\" }\n",
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lease.duration < retry.base"), "{stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
}

#[test]
fn migrate_needs_only_the_store_section() {
    let url = std::env::var("HOOKGATE_TEST_DATABASE_URL").expect("scripts/test.sh sets it");
    let schema = format!("migrate_only_{}", fastrand::u32(..));
    let out = run(
        &["migrate"],
        &format!("[store]\nurl = \"{url}\"\nschema = \"{schema}\"\n"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("migrated"));
}

#[test]
fn a_config_without_a_store_section_means_the_embedded_store() {
    let config = hookgate::config::Config::from_toml(
        "[[providers]]\nname = \"s\"\npreset = \"none\"\nkey = [{ json = \"/id\" }]\ntarget = { url = \"http://127.0.0.1:9/\" }\n",
    )
    .unwrap();
    assert_eq!(config.store.url, "sqlite://data/hookgate.db");
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn the_systemd_unit_waits_for_what_a_shutdown_can_take_and_is_sandboxed() {
    let unit = repo_file("deploy/hookgate.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key} missing"))
            .to_owned()
    };
    let config = hookgate::config::Config::load_unchecked(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/hookgate.toml"
    )))
    .unwrap();
    let stop: u64 = value("TimeoutStopSec").parse().unwrap();
    let needed = config.shutdown_limit() + config.lease.duration;
    assert!(
        stop >= needed.as_secs(),
        "TimeoutStopSec {stop} < {needed:?}"
    );
    assert_eq!(value("KillSignal"), "SIGTERM");
    assert!(value("EnvironmentFile").starts_with("/etc/hookgate/"));
    assert_eq!(value("Restart"), "on-failure");
    for key in [
        "NoNewPrivileges",
        "ProtectSystem",
        "PrivateTmp",
        "ProtectHome",
    ] {
        assert!(!value(key).is_empty(), "{key}");
    }
    assert!(value("ExecStart").contains("hookgate serve --config"));
}

#[test]
fn the_dockerfile_is_multi_stage_non_root_and_checks_health() {
    let file = repo_file("deploy/Dockerfile");
    assert!(file.lines().filter(|l| l.starts_with("FROM ")).count() >= 2);
    let user = file
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line");
    assert!(
        !user.starts_with("root") && !user.starts_with("0"),
        "{user}"
    );
    assert!(file.contains("HEALTHCHECK") && file.contains("/healthz"));
    assert!(file.contains("--locked"));
}

/// Every metric the alerts and the dashboard use is one `/metrics` serves.
#[actix_web::test]
async fn alerts_and_dashboard_use_only_metrics_hookgate_serves() {
    let app = spawn_app_with(|c| {
        let mut queued = c.providers[0].clone();
        queued.name = "q".into();
        queued.mode = Some(hookgate::claim::Mode::Queue);
        c.providers.push(queued);
    })
    .await;
    app.deliver("evt_m", "{}").await;
    // The tables' sizes are published by the node's first retention pass, at its start.
    crate::helpers::eventually(
        "the first retention pass to publish the tables' sizes",
        || async {
            app.get("/metrics")
                .await
                .body
                .contains("# TYPE hookgate_table_bytes")
        },
    )
    .await;
    let served = app.get("/metrics").await.body;
    let families: std::collections::HashSet<&str> = served
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let used =
        repo_file("deploy/prometheus/alerts.yml") + &repo_file("deploy/grafana/hookgate.json");
    let mut names: Vec<&str> = used
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("hookgate_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        assert!(families.contains(family), "{name} is not served:\n{served}");
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("deploy/grafana/hookgate.json")).unwrap();
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() >= 5));
}

#[test]
fn a_command_whose_reader_went_away_ends_quietly() {
    // `hookgate check-config | head -1`, with the reader gone before the first line: the
    // write fails with a broken pipe, and the command ends without a panic or a backtrace.
    let dir = std::env::temp_dir().join(format!(
        "hookgate-pipe-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/hookgate.toml");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check-config", "--config", config])
        .current_dir(&dir)
        .env_remove("STRIPE_WEBHOOK_SECRET")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}
