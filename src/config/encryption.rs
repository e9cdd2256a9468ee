//! `[store.encryption]`: the keys that seal payloads, cached answers, kept headers and
//! history excerpts at rest, read from the environment as every secret is; their rules,
//! read into a keyring by `load` (the one reading `serve` and `check-config` share).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::rule::{rule, Rule};
use crate::seal::{valid_id, Keyring, MAX_ID};

/// `[store.encryption]`. No keys: values are stored as they come.
#[derive(Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EncryptionConfig {
    /// The keys, `{ id = "2026-12", env = "HOOKGATE_STORE_KEY_2026_12" }`: the first one
    /// seals, every one opens (keep a key listed until `hookgate store rekey` has moved its
    /// rows to the first).
    pub keys: Vec<KeyConfig>,
    /// Every stored body must be sealed: a plaintext one (from before encryption was on,
    /// or written into the table by hand) is refused where it is read — a queue row's
    /// becomes an `unreadable` dead letter — instead of read as it stands. Turn it on once
    /// `hookgate check-config --rows` counts no plaintext body.
    pub require_sealed: bool,
    /// The keyring read from the keys' variables (never from the file); `None` until
    /// [`resolve`](EncryptionConfig::resolve), and when there are no keys.
    #[serde(skip)]
    pub keyring: Option<Arc<Keyring>>,
}

/// One key of `[store.encryption] keys`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Its id, written beside every value it seals: 1 to 32 letters, digits, `-`, `_`, `.`.
    pub id: String,
    /// The environment variable holding its 32 bytes, base64 or 64 hex digits.
    pub env: String,
}

impl fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptionConfig")
            .field("keys", &self.keys)
            .field("require_sealed", &self.require_sealed)
            .finish_non_exhaustive()
    }
}

impl EncryptionConfig {
    /// Whether no key is configured (values are stored as they come).
    pub fn is_off(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The rules of `[store.encryption]`, when it has keys.
pub(super) fn encryption_rules(config: &EncryptionConfig) -> Vec<Rule> {
    if config.is_off() {
        if config.require_sealed {
            return vec![rule(
                "store.encryption.require_sealed needs keys",
                false,
                "require_sealed = true with no keys: every body would be refused; list keys, \
                 or set require_sealed = false"
                    .to_owned(),
            )];
        }
        return Vec::new();
    }
    let bad_ids: Vec<&str> = config
        .keys
        .iter()
        .map(|k| k.id.as_str())
        .filter(|id| !valid_id(id))
        .collect();
    let mut seen = std::collections::HashSet::new();
    let twice: Vec<&str> = config
        .keys
        .iter()
        .map(|k| k.id.as_str())
        .filter(|id| !seen.insert(*id))
        .collect();
    let no_env: Vec<&str> = config
        .keys
        .iter()
        .filter(|k| k.env.is_empty())
        .map(|k| k.id.as_str())
        .collect();
    vec![
        rule(
            format!("store.encryption.keys ids are 1 to {MAX_ID} letters, digits, '-', '_' or '.'"),
            bad_ids.is_empty(),
            format!("invalid: {bad_ids:?}"),
        ),
        rule(
            "store.encryption.keys ids are unique",
            twice.is_empty(),
            format!("given twice: {twice:?}"),
        ),
        rule(
            "store.encryption.keys each name a variable (env)",
            no_env.is_empty(),
            format!("without env: {no_env:?}"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(pairs: &[(&str, &str)]) -> EncryptionConfig {
        EncryptionConfig {
            keys: pairs
                .iter()
                .map(|(id, env)| KeyConfig {
                    id: (*id).into(),
                    env: (*env).into(),
                })
                .collect(),
            require_sealed: false,
            keyring: None,
        }
    }

    #[test]
    fn ids_are_checked_as_rules() {
        let rules = encryption_rules(&keys(&[("a b", "X"), ("k", ""), ("k", "Y")]));
        let failed: Vec<&str> = rules
            .iter()
            .filter(|r| r.status == super::super::rule::RuleStatus::Fail)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(failed.len(), 3, "{failed:?}");
        assert!(encryption_rules(&EncryptionConfig::default()).is_empty());
    }
}
