//! What `hookgate check-config` prints: the config back as TOML, a line per rule (`ok`,
//! `WARN`, `FAIL`) naming what to change, a failure exactly when `serve` would refuse to
//! start, and the warnings about the store it reaches (a Postgres that may lose commits,
//! standbys no commit waits for) and about a short shutdown grace.

use std::process::Command;

use crate::helpers::HaPair;

use super::run;

#[test]
fn check_config_prints_toml_that_parses_back_into_the_same_config() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/providers.example.toml"
    ))
    .unwrap();
    let out = run(&["check-config"], &text);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed = stdout
        .split("# rules checked")
        .next()
        .unwrap()
        .lines()
        .skip(1)
        .collect::<Vec<_>>()
        .join("\n");
    let again = hookgate::config::Config::from_toml(&printed).expect("the printed config parses");
    let original = hookgate::config::Config::from_toml(&text).unwrap();
    assert_eq!(
        toml::to_string(&again).unwrap(),
        toml::to_string(&original).unwrap()
    );
    assert!(
        !stdout.contains("Config {"),
        "no Rust debug output: {stdout}"
    );
}

#[test]
fn check_config_exits_non_zero_naming_the_keys_to_change() {
    let dir = std::env::temp_dir().join(format!("hookgate-cc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[lease]\nduration = \"60s\"\n[[providers]]\nname = \"s\"\npreset = \"none\"\nkey = [{ json = \"/id\" }]\n\
         target = { url = \"http://127.0.0.1:9/\" }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        stdout.contains("FAIL lease.duration < retry.base"),
        "{stdout}"
    );
    assert!(
        stdout.contains("ok   providers.s.target.timeout < lease.duration"),
        "{stdout}"
    );

    let good = dir.join("good.toml");
    std::fs::write(
        &good,
        "[store]\nurl = \"postgres://app:pw@db/h\"\n[[providers]]\nname = \"s\"\npreset = \"none\"\n\
         key = [{ json = \"/id\" }]\ntarget = { url = \"http://127.0.0.1:9/\" }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check-config", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        !stdout.contains("pw@"),
        "the password must be redacted: {stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Environment variables for one run of the binary.
type Env<'a> = Vec<(&'a str, &'a str)>;

/// A secret that decodes (Standard Webhooks: `whsec_` + base64 of a key).
const GOOD_WHSEC: &str = "whsec_aG9va2dhdGUtdGVzdC1rZXktMzItYnl0ZXMtbG9uZyE=";
/// A store key: 32 bytes, base64.
const GOOD_STORE_KEY: &str = "aG9va2dhdGUtc3RvcmUta2V5LTMyLWJ5dGVzLWxvbmc=";

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
    let sealed =
        format!("{store}\nencryption = {{ keys = [{{ id = \"2026-12\", env = \"STORE_KEY\" }}] }}");
    let sealed_config = config("127.0.0.1:0", &sealed, target, "info");
    let with_store_key =
        |value: &'static str| vec![("SW_SECRET", GOOD_WHSEC), ("STORE_KEY", value)];
    assert!(check(&dir, &sealed_config, &with_store_key(GOOD_STORE_KEY)).0);
    assert!(serve_starts(
        &dir,
        &sealed_config,
        &with_store_key(GOOD_STORE_KEY)
    ));
    let traced = format!(
        "{good}\n[tracing]\nendpoint = \"http://127.0.0.1:9/v1/traces\"\n\
         headers_env = {{ \"x-api-key\" = \"TRACE_KEY\" }}\n"
    );
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
            "store key unset",
            sealed_config.clone(),
            with_secret(GOOD_WHSEC),
            "STORE_KEY",
        ),
        (
            "store key short",
            sealed_config.clone(),
            with_store_key("c2hvcnQga2V5"),
            "STORE_KEY",
        ),
        (
            "store key not base64",
            sealed_config.clone(),
            with_store_key("not a key at all!"),
            "STORE_KEY",
        ),
        (
            "tracing header's variable",
            traced.clone(),
            with_secret(GOOD_WHSEC),
            "TRACE_KEY",
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
        .env_remove("FWD_SECRET")
        .env_remove("STORE_KEY")
        .env_remove("TRACE_KEY");
    for (name, value) in env {
        hookgate.env(name, value);
    }
    hookgate
}

#[test]
fn the_sample_providers_file_is_a_valid_config_that_warns_only_about_none() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/providers.example.toml"
    ))
    .unwrap();
    let config = hookgate::config::Config::from_toml(&text).expect("valid sample");
    assert_eq!(config.providers.len(), 7);
    let warnings: Vec<String> = config
        .rules()
        .into_iter()
        .filter(|r| r.status == hookgate::config::RuleStatus::Warn)
        .map(|r| r.name)
        .collect();
    assert_eq!(
        warnings,
        vec!["providers.internal: signatures are verified"]
    );
}

#[test]
fn check_config_warns_about_a_postgres_that_may_lose_commits_and_a_short_grace() {
    let url = std::env::var("HOOKGATE_TEST_DATABASE_URL").expect("scripts/test.sh sets it");
    let dir = std::env::temp_dir().join(format!("hookgate-dur-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pg.toml");
    std::fs::write(
        &file,
        format!(
            "[store]\nurl = \"{url}\"\n[shutdown]\ngrace = \"1s\"\n[[providers]]\nname = \"s\"\npreset = \"none\"\n\
             key = [{{ json = \"/id\" }}]\ntarget = {{ url = \"http://127.0.0.1:9/\", timeout = \"10s\" }}\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["check-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "warnings do not fail: {stdout}");
    assert!(
        stdout.contains("WARN store keeps every acknowledged commit: synchronous_commit = off"),
        "{stdout}"
    );
    assert!(
        stdout.contains("WARN shutdown.grace >= the longest target.timeout"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[actix_web::test]
async fn check_config_warns_when_a_server_has_standbys_but_no_commit_waits_for_one() {
    let pair = HaPair::start().await;
    let check = |url: String| async move {
        let dir = std::env::temp_dir().join(format!(
            "hookgate-ha-check-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pg.toml");
        std::fs::write(
            &file,
            format!(
                "[store]\nurl = \"{url}\"\n[[providers]]\nname = \"s\"\npreset = \"none\"\n\
                 key = [{{ json = \"/id\" }}]\ntarget = {{ url = \"http://127.0.0.1:9/\", timeout = \"10s\" }}\n"
            ),
        )
        .unwrap();
        let out = actix_rt::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
                .args(["check-config", "--config"])
                .arg(&file)
                .output()
        })
        .await
        .unwrap()
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = |rule: &str| {
            stdout
                .lines()
                .find(|l| l.contains(rule))
                .unwrap_or_else(|| panic!("no line for {rule:?}: {stdout}"))
                .to_owned()
        };
        (
            line("store keeps every acknowledged commit"),
            line("store authenticates its server"),
        )
    };
    // libpq's key=value form, the standby named first: the read-write host is found.
    let port = |url: &str| {
        url.rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    };
    let (first, second) = (port(&pair.first_url), port(&pair.second_url));
    let key_values = format!(
        "host=127.0.0.1,127.0.0.1 port={second},{first} user=postgres dbname=postgres \
         target_session_attrs=read-write"
    );
    let (durable, tls) = check(key_values.clone()).await;
    // The pair runs with fsync off (a test pair); its standby is synchronous.
    assert!(durable.contains("fsync = off"), "{durable}");
    assert!(!durable.contains("synchronous_standby_names"), "{durable}");
    assert!(tls.starts_with("ok "), "{tls}");
    let store = hookgate::store::open(&hookgate::config::StoreConfig {
        url: key_values,
        schema: format!("kv_{}", fastrand::u32(..)),
        ..Default::default()
    })
    .await
    .expect("the key=value form opens the Postgres store");
    store.migrate().await.expect("migrate on the primary");

    // A synchronous standby named that is not there: every commit waits for it.
    pair.require_ghost().await;
    let (waits, _) = check(pair.url.clone()).await;
    assert!(
        waits.starts_with("WARN ") && waits.contains("none of them is connected"),
        "{waits}"
    );
    pair.release_ghost().await;

    for sql in [
        "ALTER SYSTEM SET synchronous_standby_names = ''",
        "SELECT pg_reload_conf()",
    ] {
        HaPair::connect(&pair.first_url)
            .await
            .batch_execute(sql)
            .await
            .expect("make the standby asynchronous");
    }
    let (durable, _) = check(pair.url.clone()).await;
    assert!(
        durable.starts_with("WARN ") && durable.contains("synchronous_standby_names = ''"),
        "{durable}"
    );
}
