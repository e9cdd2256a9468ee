//! `hookgate check-config`: the effective config, every rule of it, and every check `serve`
//! makes before it listens — secrets read and decoded, providers resolved, the log level,
//! the listen address, the store's settings — each run through the code `serve` runs, so
//! that the two cannot disagree. It opens no store file and binds no port; a Postgres store
//! is asked only how it keeps commits.

use std::net::ToSocketAddrs as _;

use anyhow::Context as _;

use crate::config::{Config, Rule, RuleStatus};
use crate::provider::Provider;
use crate::store;

/// Prints the effective config and every rule; fails when a rule fails. With `rows`, also
/// reads the store's rows for bodies under keys other than the sealing one.
pub(super) async fn check_config(config: &Config, rows: bool) -> anyhow::Result<()> {
    let mut settled = config.clone();
    settled.settle();
    let effective = toml::to_string(&settled).context("printing the config as TOML")?;
    out!("# effective configuration (secrets redacted): TOML you can paste back\n{effective}")?;
    out!("# rules checked")?;
    let mut rules = config.rules();
    rules.extend(start_rules(&settled));
    if store::sqlite::SqliteStore::path_of(&config.store.url).is_none() {
        const RULE: &str = "store authenticates its server";
        rules.push(match store::postgres::tls_warning(&config.store.url) {
            Ok(None) => check(RULE, Ok("verified, or on this host".into())),
            Ok(Some(why)) => Rule {
                name: RULE.into(),
                detail: why,
                status: RuleStatus::Warn,
            },
            Err(e) => check(RULE, Err(e.to_string())),
        });
    }
    for rule in &rules {
        out!("{rule}")?;
    }
    out!("{}", durability(config).await)?;
    let mut failed = rules
        .iter()
        .filter(|r| r.status == RuleStatus::Fail)
        .count();
    if rows {
        for rule in sealed_rows(config).await {
            out!("{rule}")?;
            failed += usize::from(rule.status == RuleStatus::Fail);
        }
    }
    if failed > 0 {
        anyhow::bail!("the config breaks {failed} rule(s)");
    }
    Ok(())
}

/// What `serve` checks after the config's rules and before it listens, in its order,
/// through the same code: the admin token and each provider's secrets read from the
/// environment (naming the variable, never its value), each provider resolved as `serve`
/// resolves it (secrets decoded, the target's TLS settings and CA file loaded), the log
/// level, the listen address, and the store's settings (nothing opened).
fn start_rules(config: &Config) -> Vec<Rule> {
    let mut rules = Vec::new();
    let mut admin = config.clone();
    rules.push(check(
        "admin.token_env is set",
        match (&config.admin.token_env, admin.resolve_admin_token()) {
            (None, _) => Ok("no admin API".into()),
            (Some(var), Ok(())) => Ok(format!("{var} is set")),
            (Some(_), Err(e)) => Err(e.to_string()),
        },
    ));
    for provider in &config.providers {
        let name = &provider.name;
        let mut resolved = provider.clone();
        let secrets = resolved.resolve_secrets().map_err(|e| e.to_string());
        let ok = secrets.is_ok();
        rules.push(check(
            format!("providers.{name}: every secret's variable is set"),
            secrets.map(|()| format!("{} secret(s)", provider.secrets.len())),
        ));
        if ok {
            let horizon = config.sender_horizon(&resolved);
            rules.push(check(
                format!("providers.{name}: resolves as serve resolves it"),
                Provider::from_config(&resolved, horizon)
                    .map(|_| "secrets decoded, target settings loaded".into()),
            ));
        }
    }
    let mut resolved = config.clone();
    rules.push(check(
        "every secret serve reads is set and well formed",
        resolved
            .resolve_secrets()
            .map(|()| "read as serve reads them".into())
            .map_err(|e| e.to_string()),
    ));
    if let Some(keys) = &resolved.store.encryption.keyring {
        let ids: Vec<&str> = keys.ids().collect();
        rules.push(check(
            "store.encryption keys are 32-byte keys",
            Ok(format!(
                "sealing with {:?}; opening {ids:?}",
                keys.sealing_id()
            )),
        ));
    }
    if resolved.tracing.endpoint.is_some() {
        rules.push(check(
            "tracing: the exporter's settings are ones serve can use",
            crate::trace::settings(&resolved.tracing)
                .map(|_| "endpoint, TLS and headers read".into()),
        ));
    }
    rules.push(check(
        "log.level is a level",
        crate::logging::level(&config.log).map(|l| l.as_str().to_owned()),
    ));
    let listen = &config.server.listen;
    rules.push(check(
        "server.listen is an address to bind",
        match listen.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(addr)) => Ok(format!("{listen} ({addr})")),
            Ok(None) => Err(format!("{listen} names no address")),
            Err(e) => Err(format!("{listen}: {e}")),
        },
    ));
    rules.push(check(
        "store settings are ones serve can use",
        store::check(&config.store)
            .map(|()| config.store.redacted_url())
            .map_err(|e| e.to_string()),
    ));
    rules
}

/// A rule that holds (`Ok`, with what was found) or fails (`Err`, with why).
fn check(name: impl Into<String>, outcome: Result<String, String>) -> Rule {
    let (status, detail) = match outcome {
        Ok(detail) => (RuleStatus::Ok, detail),
        Err(why) => (RuleStatus::Fail, why),
    };
    Rule {
        name: name.into(),
        detail,
        status,
    }
}

/// The store durability line of `check-config`: a Postgres store is asked whether an
/// acknowledged commit could be lost; the embedded store always syncs its commits.
async fn durability(config: &Config) -> String {
    const RULE: &str = "store keeps every acknowledged commit";
    if store::sqlite::SqliteStore::path_of(&config.store.url).is_some() {
        return format!("ok   {RULE}: embedded store, WAL with synchronous = FULL");
    }
    let asked = async {
        let store = store::open(&config.store).await?;
        store.durability_risks().await
    };
    match asked.await {
        Ok(risks) if risks.is_empty() => format!("ok   {RULE}: synchronous_commit and fsync on"),
        Ok(risks) => {
            let found: Vec<String> = risks.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            format!(
                "WARN {RULE}: {}: a done row could be lost and its event delivered again",
                found.join(", ")
            )
        }
        Err(e) => format!("skip {RULE}: the store did not answer ({e})"),
    }
}

/// `--rows`: the store's bodies not under the sealing key, by the key that sealed them;
/// fails when one needs a key that is not configured (it would not open where it is read).
/// With keys, also the plaintext bodies: when none is left, `require_sealed` can be on;
/// fails when it is on and some are (each would be refused where it is read).
async fn sealed_rows(config: &Config) -> Vec<Rule> {
    const RULE: &str = "no stored body needs a key that is not configured";
    const PLAIN: &str = "no stored body is plaintext (store.encryption.require_sealed)";
    let mut config = config.clone();
    if let Err(e) = config.resolve_secrets() {
        return vec![check(RULE, Err(format!("the keys could not be read: {e}")))];
    }
    let required = config.store.encryption.require_sealed;
    let keys = config.store.encryption.keyring.clone();
    let counted = keyed_rows(&config, RULE).await;
    let mut rules = vec![counted.rule];
    if let (Some(_), Some(plain)) = (&keys, counted.plaintext) {
        rules.push(match (plain, required) {
            (0, true) => check(
                PLAIN,
                Ok("every body is sealed, as require_sealed wants".into()),
            ),
            (0, false) => check(
                PLAIN,
                Ok("every body is sealed: require_sealed = true can be set".into()),
            ),
            (n, true) => check(
                PLAIN,
                Err(format!(
                    "{n} plaintext bodies would be refused where they are read: run \
                     `hookgate store rekey` with require_sealed = false first"
                )),
            ),
            (n, false) => check(
                PLAIN,
                Ok(format!(
                    "{n} plaintext bodies, read as they stand: run `hookgate store rekey` \
                     before setting require_sealed = true"
                )),
            ),
        });
    }
    rules
}

/// A rule of `--rows`, with the plaintext bodies it counted (`None`: not read).
struct Counted {
    rule: Rule,
    plaintext: Option<u64>,
}

/// The first rule of `--rows` (`name`): every sealed body's key is configured.
async fn keyed_rows(config: &Config, name: &str) -> Counted {
    let keys = config.store.encryption.keyring.clone();
    let configured = |id: &str| keys.as_ref().is_some_and(|k| k.ids().any(|k| k == id));
    let counted = async {
        let store = store::open(&config.store).await?;
        super::rekey::run(store, 1000, f64::INFINITY, true, false).await
    };
    let progress = match counted.await {
        Err(e) => {
            return Counted {
                rule: check(name, Err(format!("the store could not be read: {e:#}"))),
                plaintext: None,
            }
        }
        Ok(progress) => progress,
    };
    let plaintext = Some(progress.stale.get("plaintext").copied().unwrap_or(0));
    let missing: Vec<&String> = progress
        .stale
        .keys()
        .filter(|id| *id != "plaintext" && !configured(id))
        .collect();
    let detail = super::rekey::summary(&progress);
    let rule = if !missing.is_empty() {
        check(
            name,
            Err(format!("sealed by {missing:?}, not configured: {detail}")),
        )
    } else if keys.is_none() {
        check(
            name,
            Ok("encryption at rest is off, and no body is sealed".into()),
        )
    } else if progress.stale.is_empty() {
        check(
            name,
            Ok(format!(
                "every body is sealed by {:?}",
                progress.sealing_key
            )),
        )
    } else {
        Rule {
            name: name.into(),
            detail: format!("{detail}: run `hookgate store rekey` before removing a key"),
            status: RuleStatus::Warn,
        }
    };
    Counted { rule, plaintext }
}
