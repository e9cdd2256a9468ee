//! `[store]`: where the rows live, and the URL redaction that keeps its passwords out of
//! logs and `check-config`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[store]`
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite://PATH` (the default, `sqlite://data/hookgate.db`) or
    /// `postgres://user:password@host:port/db`. Printed with its passwords redacted.
    #[serde(serialize_with = "serialize_redacted")]
    pub url: String,
    /// Postgres schema holding hookgate's tables (tests use one schema each).
    pub schema: String,
    /// Connections in the Postgres pool.
    pub pool_size: usize,
    /// How long a request waits for the store — a free pooled connection, or (Postgres) its
    /// turn in the next claim batch — before it is answered 503 `overloaded`, unclaimed.
    #[serde(with = "humantime_serde")]
    pub pool_timeout: Duration,
    /// Client-side deadline of every store operation; past it the connection is dropped
    /// and the caller answers 503 `store_unavailable`.
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            // The embedded store, as in config/hookgate.toml: nothing to install.
            url: "sqlite://data/hookgate.db".into(),
            schema: "public".into(),
            pool_size: 16,
            pool_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(5),
        }
    }
}

impl StoreConfig {
    /// The URL with any password replaced by `***`, safe for logs and `check-config`.
    pub fn redacted_url(&self) -> String {
        redact_url_password(&self.url)
    }
}

/// Hand-written so that the password in `url` never reaches a log line.
impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.redacted_url())
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("pool_timeout", &self.pool_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

fn serialize_redacted<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&redact_url_password(url))
}

/// Replaces every password in a URL with `***`: the one in `scheme://user:password@host`
/// and any `password=` or `sslpassword=` query parameter.
pub fn redact_url_password(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = redact_userinfo(base);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _))
                    if name.eq_ignore_ascii_case("password")
                        || name.eq_ignore_ascii_case("sslpassword") =>
                {
                    format!("{name}=***")
                }
                _ => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// Replaces the password of `scheme://user:password@host/...` with `***`.
fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_the_password_and_keeps_the_rest() {
        assert_eq!(
            redact_url_password("postgres://app:s3cret@db:5432/hookgate"),
            "postgres://app:***@db:5432/hookgate"
        );
        assert_eq!(
            redact_url_password("postgres://app@db/hookgate"),
            "postgres://app@db/hookgate"
        );
        assert_eq!(redact_url_password("not a url"), "not a url");
    }

    #[test]
    fn a_password_in_the_query_string_is_redacted_too() {
        let url = "postgres://db/hookgate?user=app&password=hunter2&sslmode=require";
        let redacted = redact_url_password(url);
        assert!(!redacted.contains("hunter2"), "{redacted}");
        assert!(redacted.contains("password=***"), "{redacted}");
        assert!(redacted.contains("sslmode=require"), "{redacted}");
        let both = redact_url_password("postgres://a:pw1@db/x?sslpassword=pw2");
        assert!(!both.contains("pw1") && !both.contains("pw2"), "{both}");
    }

    #[test]
    fn debug_output_never_shows_the_store_password() {
        let store = StoreConfig {
            url: "postgres://app:hunter2@db/x".into(),
            ..StoreConfig::default()
        };
        assert!(!format!("{store:?}").contains("hunter2"));
    }
}
