//! `[store]`: where the rows live, and the URL redaction that keeps its passwords out of
//! logs and `check-config`. Also libpq's key=value grammar ([`key_values`]), the one reading
//! of that form for the redaction and the Postgres store's TLS parameters alike.

use std::fmt;
use std::iter::Peekable;
use std::ops::Range;
use std::str::CharIndices;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::encryption::EncryptionConfig;

/// `[store]`
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite://PATH` (the default, `sqlite://data/hookgate.db`) or
    /// `postgres://user:password@host:port/db` — several hosts as libpq takes them
    /// (`@h1:p1,h2:p2/db?target_session_attrs=read-write`), or libpq's key=value form.
    /// Printed with its passwords redacted.
    #[serde(serialize_with = "serialize_redacted")]
    pub url: String,
    /// Postgres schema holding hookgate's tables (tests use one schema each).
    pub schema: String,
    /// Connections in the Postgres pool for senders' events (claims, completions, the
    /// queue, retention).
    pub pool_size: usize,
    /// Connections in the Postgres pool for operators (the admin API, the console, bulk
    /// replays' bookkeeping), apart from `pool_size`'s: operators' reads never take a
    /// connection a sender's event needs.
    pub operator_pool_size: usize,
    /// How long a request waits for the store — a free pooled connection, or (Postgres) its
    /// turn in the next claim batch — before it is answered 503 `overloaded`, unclaimed.
    #[serde(with = "humantime_serde")]
    pub pool_timeout: Duration,
    /// Client-side deadline of every store operation; past it the caller answers 503
    /// `store_unavailable`, and the statement is cancelled on the server and its
    /// connection closed. Unset: derived from the lease when
    /// the config is loaded (a third of it, at most 5 s); read it through
    /// [`deadline`](Self::deadline).
    #[serde(
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    pub statement_timeout: Option<Duration>,
    /// Postgres: the keys each node keeps in filters of the ring's sealed slots, all slots
    /// together (about 1.2 bytes a key), so a claim of a new key skips the slots that
    /// cannot hold it. A slot whose keys would take the filters past this is probed for
    /// every key, as without filters; 0 turns them off.
    pub slot_filter_keys: u64,
    /// `[store.encryption]`: the keys that seal stored bodies (none: stored as they come).
    #[serde(skip_serializing_if = "EncryptionConfig::is_off")]
    pub encryption: EncryptionConfig,
}

/// The store deadline when neither the config nor a lease says otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            // The embedded store, as in config/hookgate.toml: nothing to install.
            url: "sqlite://data/hookgate.db".into(),
            schema: "public".into(),
            pool_size: 16,
            // Two: a slow search and the console's other calls (or a bulk replay's
            // bookkeeping) go on side by side, and few backends are kept per node.
            operator_pool_size: 2,
            pool_timeout: Duration::from_secs(5),
            statement_timeout: None,
            // 60 MB at most: a week of 100 events/s, or a day's sealed slots at 1,000/s.
            slot_filter_keys: 50_000_000,
            encryption: EncryptionConfig::default(),
        }
    }
}

impl StoreConfig {
    /// The deadline of every store operation: `statement_timeout` as written or derived.
    pub fn deadline(&self) -> Duration {
        self.statement_timeout.unwrap_or(DEFAULT_DEADLINE)
    }

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
            .field("operator_pool_size", &self.operator_pool_size)
            .field("pool_timeout", &self.pool_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("slot_filter_keys", &self.slot_filter_keys)
            .field("encryption", &self.encryption)
            .finish()
    }
}

fn serialize_redacted<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&redact_url_password(url))
}

/// Replaces every password in a store URL with `***`: the one in
/// `scheme://user:password@host` and any `password=` or `sslpassword=` parameter, in the
/// URL form or the key=value form (`host=db password=secret`).
///
/// The connection's parser takes the credentials up to an `@`, so a password may hold `/`
/// or `?` (and `@`, percent-encoded or not): everything between the user's `:` and the
/// *last* `@` is redacted, and the query is looked for only after it. When in doubt this
/// redacts too much, never too little.
pub fn redact_url_password(url: &str) -> String {
    let scheme_end = url.find("://").filter(|&i| {
        i > 0
            && url[..i]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    });
    let Some(scheme_end) = scheme_end.map(|i| i + 3) else {
        // Not a URL, though a value may hold "://".
        return redact_key_values(url);
    };
    let (head, rest) = url.split_at(scheme_end);
    let (creds, after) = match rest.rfind('@') {
        Some(at) => {
            let creds = &rest[..at];
            let creds = match creds.find(':') {
                Some(colon) => format!("{}:***@", &creds[..colon]),
                None => format!("{creds}@"),
            };
            (creds, &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let mut out = format!("{head}{creds}");
    match after.split_once('?') {
        Some((base, query)) => {
            out.push_str(base);
            out.push('?');
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((name, _)) if is_password(name) => format!("{name}=***"),
                    _ => param.to_owned(),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(after),
    }
    out
}

fn is_password(name: &str) -> bool {
    name.eq_ignore_ascii_case("password") || name.eq_ignore_ascii_case("sslpassword")
}

/// The key=value form with password values (quoted or not) replaced by `***`; from a
/// parameter that does not parse on, all of it (the connection refuses such a string, but
/// its error names it). Text without any `=` is not that form, and has no password.
fn redact_key_values(text: &str) -> String {
    if !text.contains('=') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for param in key_values(text) {
        match param {
            Ok(param) if is_password(param.key) => {
                out.push_str(&text[copied..param.value_written.start]);
                out.push_str("***");
                copied = param.value_written.end;
            }
            Ok(_) => {}
            Err(malformed) => {
                out.push_str(&text[copied..malformed.at]);
                out.push_str("***");
                return out;
            }
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// One parameter of libpq's key=value connection string (`host=db password='a b'`).
pub struct KeyValue<'a> {
    /// The key as written; keys are case-sensitive (`SSLMODE` is not `sslmode`).
    pub key: &'a str,
    /// The value with its quotes and backslash escapes undone.
    pub value: String,
    /// The whole parameter as written, from its key to the end of its value: copied
    /// verbatim, it means the same to libpq and tokio-postgres.
    pub written: Range<usize>,
    /// The value as written, quotes included.
    pub value_written: Range<usize>,
}

/// A key=value string that stops following libpq's grammar. It names where, never what:
/// the text may be a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} in the parameter at byte {at}")]
pub struct Malformed {
    /// Where the parameter that does not parse begins.
    pub at: usize,
    /// What is wrong with it.
    pub what: &'static str,
}

/// The parameters of a key=value connection string, read as libpq and tokio-postgres read
/// them: `key = value` with optional whitespace around `=`, the value bare up to the next
/// whitespace or in single quotes, `\` escaping the next character in both. Stops after
/// the first [`Malformed`] parameter.
pub fn key_values(text: &str) -> impl Iterator<Item = Result<KeyValue<'_>, Malformed>> {
    let mut chars = text.char_indices().peekable();
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed {
            return None;
        }
        let param = next_key_value(text, &mut chars)?;
        failed = param.is_err();
        Some(param)
    })
}

/// The parameter at `chars`, `None` at the end of `text`.
fn next_key_value<'a>(
    text: &'a str,
    chars: &mut Peekable<CharIndices<'a>>,
) -> Option<Result<KeyValue<'a>, Malformed>> {
    let skip_whitespace = |chars: &mut Peekable<CharIndices<'a>>| {
        while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {}
    };
    let position = |chars: &mut Peekable<CharIndices<'a>>| chars.peek().map_or(text.len(), |c| c.0);
    skip_whitespace(chars);
    let start = chars.peek()?.0;
    let malformed = |what| Some(Err(Malformed { at: start, what }));
    while chars
        .next_if(|&(_, c)| !c.is_whitespace() && c != '=')
        .is_some()
    {}
    let key_end = position(chars);
    if key_end == start {
        return malformed("'=' without a key");
    }
    skip_whitespace(chars);
    if chars.next_if(|&(_, c)| c == '=').is_none() {
        return malformed("a key without '='");
    }
    skip_whitespace(chars);
    let value_start = position(chars);
    let quoted = chars.next_if(|&(_, c)| c == '\'').is_some();
    let mut value = String::new();
    let mut closed = !quoted;
    while let Some((_, c)) = chars.next_if(|&(_, c)| quoted || !c.is_whitespace()) {
        match c {
            '\\' => value.extend(chars.next().map(|(_, escaped)| escaped)),
            '\'' if quoted => {
                closed = true;
                break;
            }
            c => value.push(c),
        }
    }
    if !closed {
        return malformed("an unterminated quoted value");
    }
    let end = position(chars);
    Some(Ok(KeyValue {
        key: &text[start..key_end],
        value,
        written: start..end,
        value_written: value_start..end,
    }))
}

/// An `http(s)://` URL with the password of its userinfo and every query value replaced
/// by `***` (a target URL may carry a token either way).
pub fn redact_target_url(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut out = match base.find("://").map(|i| i + 3) {
        Some(scheme_end) => {
            let (head, rest) = base.split_at(scheme_end);
            let authority_end = rest.find('/').unwrap_or(rest.len());
            match rest[..authority_end].rfind('@') {
                Some(at) => match rest[..at].find(':') {
                    Some(colon) => format!("{head}{}:***{}", &rest[..colon], &rest[at..]),
                    None => base.to_owned(),
                },
                None => base.to_owned(),
            }
        }
        None => base.to_owned(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((name, _)) => format!("{name}=***"),
                None => param.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
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
    fn a_password_with_url_delimiters_is_redacted_whole() {
        for password in ["p/ss", "p?ss", "p%40ss", "p@ss", "a/b?c@d", "x?password=y"] {
            for url in [
                format!("postgres://app:{password}@db:5432/hookgate"),
                format!("postgres://app:{password}@db/hookgate?sslmode=require"),
            ] {
                let redacted = redact_url_password(&url);
                assert!(!redacted.contains(password), "{url} -> {redacted}");
                assert!(redacted.contains("app:***@"), "{url} -> {redacted}");
            }
        }
        let kv = "host=db user=app password='se cr\\'et' sslmode=require";
        let redacted = redact_url_password(kv);
        assert_eq!(redacted, "host=db user=app password=*** sslmode=require");
        assert_eq!(
            redact_url_password("host=db password=s3cret"),
            "host=db password=***"
        );
    }

    #[test]
    fn a_url_naming_several_hosts_loses_only_its_passwords() {
        let url = "postgres://app:s3cr@t@db1:5432,db2:5433/hookgate?target_session_attrs=\
                   read-write&password=other";
        assert_eq!(
            redact_url_password(url),
            "postgres://app:***@db1:5432,db2:5433/hookgate?target_session_attrs=read-write\
             &password=***"
        );
        assert_eq!(
            redact_url_password(
                "host=db1,db2 port=5432,5433 password='a b' target_session_attrs=read-write"
            ),
            "host=db1,db2 port=5432,5433 password=*** target_session_attrs=read-write"
        );
    }

    #[test]
    fn a_target_url_loses_its_password_and_query_values() {
        assert_eq!(
            redact_target_url("https://hook:t0ken@app.example/in?key=abc&x=1"),
            "https://hook:***@app.example/in?key=***&x=***"
        );
        assert_eq!(
            redact_target_url("http://127.0.0.1:9000/effects"),
            "http://127.0.0.1:9000/effects"
        );
    }

    #[test]
    fn debug_output_never_shows_the_store_password() {
        let store = StoreConfig {
            url: "postgres://app:hunter2@db/x".into(),
            ..StoreConfig::default()
        };
        assert!(!format!("{store:?}").contains("hunter2"));
    }

    #[test]
    fn a_key_value_password_is_redacted_however_it_is_spaced_or_quoted() {
        for (url, redacted) in [
            ("host=db password = hunter2", "host=db password = ***"),
            ("password= hunter2 user=app", "password= *** user=app"),
            ("host=db password =hunter2", "host=db password =***"),
            ("password = 'a b\\'c' user=app", "password = *** user=app"),
            ("password='a b\\'c'", "password=***"),
            ("password=a\\ b\\ c user=app", "password=*** user=app"),
            (
                "sslpassword\t=\t'a b' host=db",
                "sslpassword\t=\t*** host=db",
            ),
        ] {
            assert_eq!(redact_url_password(url), redacted, "{url}");
        }
        let store = StoreConfig {
            url: "host=db password = 'a b\\'c'".into(),
            ..StoreConfig::default()
        };
        let shown = format!("{store:?} {}", toml::to_string(&store).unwrap());
        for part in ["a b", "'c", "b\\"] {
            assert!(!shown.contains(part), "{shown}");
        }
    }

    #[test]
    fn a_key_value_string_that_does_not_parse_is_redacted_from_where_it_stops() {
        // A key without '=' (tokio-postgres refuses it too): everything from it is hidden.
        assert_eq!(
            redact_url_password("host=db password 'hunter2'"),
            "host=db ***"
        );
        assert_eq!(
            redact_url_password("host=db password='hunter2"),
            "host=db ***"
        );
        // "://" inside a value does not make it a URL.
        assert_eq!(
            redact_url_password("host=db password=hunter2 application_name=a://b"),
            "host=db password=*** application_name=a://b"
        );
    }
}
