//! A secret read from the environment: its `Debug` and `Display` never show it, so it can
//! sit in a config struct that is logged or printed by `check-config`.

use std::fmt;

use super::ConfigError;

/// A secret value (a token, a signing key).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value (tests; production reads [`Secret::from_env`]).
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// Reads environment variable `var`; unset or empty is an error naming it.
    pub fn from_env(var: &str) -> Result<Self, ConfigError> {
        match std::env::var(var) {
            Ok(value) if !value.is_empty() => Ok(Self(value)),
            _ => Err(ConfigError::MissingSecret(var.to_owned())),
        }
    }

    /// The value, for the one place that must compare or sign with it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn a_missing_variable_is_an_error_naming_it() {
        let err = Secret::from_env("HOOKGATE_TEST_SURELY_UNSET_VAR").unwrap_err();
        assert!(err.to_string().contains("HOOKGATE_TEST_SURELY_UNSET_VAR"));
    }
}
