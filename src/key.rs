//! The idempotency key: where it comes from (a header, a JSON pointer, or a canonical hash
//! of chosen fields, tried in order) and what a valid one looks like.
//!
//! Pure: takes headers and the body, returns a key or a [`KeyError`]. It never claims or
//! logs; the body is parsed at most once ([`Body`]), shared with the fingerprint.

use std::fmt;
use std::sync::Arc;

use actix_web::http::header::HeaderMap;

use crate::canonical::{fields_key, Body};

use serde::{Deserialize, Serialize};

/// One source of the idempotency key.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged, deny_unknown_fields)]
pub enum KeySource {
    /// A request header, matched case-insensitively.
    Header {
        /// The header's name.
        header: String,
    },
    /// An RFC 6901 JSON pointer into the body; string or number values.
    Json {
        /// The pointer, e.g. `/id`.
        json: String,
    },
    /// A SHA-256 over the canonical JSON of these pointers' values, for senders with no
    /// event id (never the whole body: some fields change between deliveries).
    Fields {
        /// The pointers, e.g. `["/data/object/id", "/type", "/created"]`.
        fields: Vec<String>,
    },
}

/// Longest accepted key, in bytes (it is a primary-key column and a log field).
pub const MAX_KEY_BYTES: usize = 255;

/// The provider a scope belongs to: the part before its `.` (a provider's name has none).
pub fn provider_of(scope: &str) -> &str {
    scope
        .split_once('.')
        .map_or(scope, |(provider, _)| provider)
}

/// The name of a provider's main route (its `target`), whose scope is the provider's own.
pub const MAIN_ROUTE: &str = "main";

/// The route a scope names: what follows its `.`, or [`MAIN_ROUTE`] for a provider's own
/// scope.
pub fn route_of(scope: &str) -> &str {
    scope.split_once('.').map_or(MAIN_ROUTE, |(_, route)| route)
}

/// A key scoped by its provider (or one of its routes): the identity of one event's row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventId {
    /// The provider's name.
    pub provider: Arc<str>,
    /// The idempotency key within that provider.
    pub key: Arc<str>,
}

impl EventId {
    /// Builds an id from its parts.
    pub fn new(provider: impl Into<Arc<str>>, key: impl Into<Arc<str>>) -> Self {
        Self {
            provider: provider.into(),
            key: key.into(),
        }
    }
}

impl EventId {
    /// `provider:key` as sent to the target in `Idempotency-Key` (the provider's name, not
    /// the route's scope: every route's application sees the event under one key): printable ASCII as it is,
    /// every other byte (and space, `"`, `,` and `%`) percent-encoded as `%XX` of its UTF-8
    /// bytes, so a
    /// key read from JSON with non-ASCII characters reaches the target as unambiguous
    /// ASCII (`évt` becomes `%C3%A9vt`).
    pub fn header_value(&self) -> String {
        let mut out = String::with_capacity(self.provider.len() + self.key.len() + 1);
        for (i, part) in [provider_of(&self.provider), &*self.key]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                out.push(':');
            }
            for byte in part.bytes() {
                // Space, `"` and `,` too: receivers trim or split header values on them,
                // and the key (and a signature over it) would no longer match.
                if (b'!'..=b'~').contains(&byte) && !matches!(byte, b'%' | b'"' | b',') {
                    out.push(char::from(byte));
                } else {
                    out.push_str(&format!("%{byte:02X}"));
                }
            }
        }
        out
    }
}

impl fmt::Display for EventId {
    /// `provider:key`, as written in logs and errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.provider, self.key)
    }
}

/// Why no usable key could be derived. Each is the sender's fault: 400, nothing claimed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A JSON source was reached and the body is not JSON.
    #[error("the body is not valid JSON, and the key is read from it")]
    NotJson,
    /// No source yielded a value.
    #[error("no idempotency key found (tried {0})")]
    Missing(String),
    /// The key is longer than [`MAX_KEY_BYTES`].
    #[error("the idempotency key is {0} bytes long; at most 255 are allowed")]
    TooLong(usize),
    /// The key has a control character or is not text.
    #[error("the idempotency key contains control characters or is not UTF-8")]
    Unprintable,
    /// The key is empty.
    #[error("the idempotency key is empty")]
    Empty,
}

/// Derives keys for one provider.
#[derive(Debug, Clone)]
pub struct KeyDeriver {
    sources: Vec<KeySource>,
}

impl KeyDeriver {
    /// A deriver trying `sources` in order.
    pub fn new(sources: Vec<KeySource>) -> Self {
        Self { sources }
    }

    /// The first key any source yields, validated.
    pub fn derive(&self, headers: &HeaderMap, body: &Body<'_>) -> Result<String, KeyError> {
        for source in &self.sources {
            let found = match source {
                // UTF-8, as a key from the body may be (`to_str` takes visible ASCII only).
                KeySource::Header { header } => match headers.get(header.as_str()) {
                    Some(value) => Some(
                        std::str::from_utf8(value.as_bytes())
                            .map_err(|_| KeyError::Unprintable)?
                            .to_owned(),
                    ),
                    None => None,
                },
                KeySource::Json { json } => body
                    .json()
                    .ok_or(KeyError::NotJson)?
                    .pointer(json)
                    .and_then(scalar_text),
                KeySource::Fields { fields } => {
                    body.json().ok_or(KeyError::NotJson)?;
                    fields_key(body, fields)
                }
            };
            if let Some(key) = found {
                return validate(key);
            }
        }
        Err(KeyError::Missing(self.describe()))
    }

    fn describe(&self) -> String {
        self.sources
            .iter()
            .map(|s| match s {
                KeySource::Header { header } => format!("header {header}"),
                KeySource::Json { json } => format!("JSON {json}"),
                KeySource::Fields { fields } => format!("hash of {}", fields.join(" ")),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Strings are taken as they are, numbers in their JSON form; anything else is no key.
fn scalar_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn validate(key: String) -> Result<String, KeyError> {
    if key.is_empty() {
        Err(KeyError::Empty)
    } else if key.len() > MAX_KEY_BYTES {
        Err(KeyError::TooLong(key.len()))
    } else if key.chars().any(char::is_control) {
        Err(KeyError::Unprintable)
    } else {
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn deriver() -> KeyDeriver {
        KeyDeriver::new(vec![
            KeySource::Header {
                header: "X-Idempotency-Key".into(),
            },
            KeySource::Json { json: "/id".into() },
        ])
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_static(name),
                HeaderValue::from_str(value).expect("header value"),
            );
        }
        map
    }

    #[test]
    fn the_header_wins_over_the_body_and_is_case_insensitive() {
        let h = headers(&[("x-idempotency-key", "from-header")]);
        assert_eq!(
            deriver().derive(&h, &Body::new(br#"{"id":"from-body"}"#)),
            Ok("from-header".into())
        );
    }

    #[test]
    fn a_utf8_key_in_a_header_is_the_same_key_as_in_the_body() {
        let mut h = HeaderMap::new();
        let utf8 = HeaderValue::from_bytes("évt_1".as_bytes()).unwrap();
        h.insert(HeaderName::from_static("x-idempotency-key"), utf8);
        let from_body = deriver().derive(
            &HeaderMap::new(),
            &Body::new(r#"{"id":"évt_1"}"#.as_bytes()),
        );
        assert_eq!(deriver().derive(&h, &Body::new(b"{}")), from_body);
        assert_eq!(from_body, Ok("évt_1".into()));
        let latin1 = HeaderValue::from_bytes(b"\xe9vt_1").unwrap();
        h.insert(HeaderName::from_static("x-idempotency-key"), latin1);
        assert_eq!(
            deriver().derive(&h, &Body::new(b"{}")),
            Err(KeyError::Unprintable)
        );
    }

    #[test]
    fn the_body_is_used_when_the_header_is_absent_and_numbers_count() {
        let none = HeaderMap::new();
        assert_eq!(
            deriver().derive(&none, &Body::new(br#"{"id":"evt_1"}"#)),
            Ok("evt_1".into())
        );
        assert_eq!(
            deriver().derive(&none, &Body::new(br#"{"id":42}"#)),
            Ok("42".into())
        );
    }

    #[test]
    fn a_body_that_is_not_json_is_refused_only_when_it_is_needed() {
        let none = HeaderMap::new();
        assert_eq!(
            deriver().derive(&none, &Body::new(b"not json")),
            Err(KeyError::NotJson)
        );
        let h = headers(&[("x-idempotency-key", "k")]);
        assert_eq!(
            deriver().derive(&h, &Body::new(b"not json")),
            Ok("k".into())
        );
    }

    #[test]
    fn missing_long_and_unprintable_keys_are_refused() {
        let none = HeaderMap::new();
        assert!(matches!(
            deriver().derive(&none, &Body::new(br#"{"other":1}"#)),
            Err(KeyError::Missing(_))
        ));
        assert!(matches!(
            deriver().derive(&none, &Body::new(br#"{"id":{"nested":1}}"#)),
            Err(KeyError::Missing(_))
        ));
        let long = format!(r#"{{"id":"{}"}}"#, "k".repeat(256));
        assert_eq!(
            deriver().derive(&none, &Body::new(long.as_bytes())),
            Err(KeyError::TooLong(256))
        );
        assert_eq!(
            deriver().derive(&none, &Body::new(br#"{"id":"a\nb"}"#)),
            Err(KeyError::Unprintable)
        );
        assert_eq!(
            deriver().derive(&none, &Body::new(br#"{"id":""}"#)),
            Err(KeyError::Empty)
        );
    }

    #[test]
    fn pointers_follow_rfc_6901_escapes_and_array_indexes() {
        let deriver = |p: &str| KeyDeriver::new(vec![KeySource::Json { json: p.into() }]);
        let none = HeaderMap::new();
        let body = br#"{"a/b":"slash","m~n":"tilde","list":["x",7],"":"empty"}"#;
        assert_eq!(
            deriver("/a~1b").derive(&none, &Body::new(body)),
            Ok("slash".into())
        );
        assert_eq!(
            deriver("/m~0n").derive(&none, &Body::new(body)),
            Ok("tilde".into())
        );
        assert_eq!(
            deriver("/list/1").derive(&none, &Body::new(body)),
            Ok("7".into())
        );
        assert_eq!(
            deriver("/").derive(&none, &Body::new(body)),
            Ok("empty".into())
        );
        assert!(matches!(
            deriver("/list/5").derive(&none, &Body::new(body)),
            Err(KeyError::Missing(_))
        ));
    }

    #[test]
    fn a_fields_key_is_a_canonical_hash_that_ignores_order_and_other_fields() {
        let deriver = KeyDeriver::new(vec![KeySource::Fields {
            fields: vec!["/data/id".into(), "/type".into(), "/created".into()],
        }]);
        let none = HeaderMap::new();
        let a = deriver.derive(
            &none,
            &Body::new(br#"{"type":"paid","created":1,"data":{"id":"o1"},"attempt":1}"#),
        );
        let b = deriver.derive(
            &none,
            &Body::new(br#"{ "attempt": 2, "data": {"id": "o1"}, "created": 1, "type": "paid" }"#),
        );
        assert_eq!(a, b);
        assert_eq!(a.as_ref().map(String::len), Ok(64));
        let c = deriver.derive(
            &none,
            &Body::new(br#"{"type":"paid","created":2,"data":{"id":"o1"}}"#),
        );
        assert_ne!(a, c);
    }

    #[test]
    fn numbers_are_keyed_by_their_exact_text_so_neighbouring_big_integers_differ() {
        let none = HeaderMap::new();
        let key = |body: &str| deriver().derive(&none, &Body::new(body.as_bytes()));
        assert_eq!(
            key(r#"{"id":18446744073709551616}"#),
            Ok("18446744073709551616".into())
        );
        assert_eq!(
            key(r#"{"id":18446744073709551617}"#),
            Ok("18446744073709551617".into())
        );
        assert_eq!(
            key(r#"{"id":12345678901234567890123}"#),
            Ok("12345678901234567890123".into())
        );
        // The rule is the text the sender wrote: 1.0 and 1 are two keys.
        assert_eq!(key(r#"{"id":1.0}"#), Ok("1.0".into()));
        assert_eq!(key(r#"{"id":1}"#), Ok("1".into()));
    }

    #[test]
    fn the_header_form_of_a_key_is_ascii_and_unambiguous() {
        assert_eq!(EventId::new("p", "evt_1").header_value(), "p:evt_1");
        assert_eq!(
            EventId::new("p", "évt 1%").header_value(),
            "p:%C3%A9vt%201%25"
        );
        assert_eq!(
            EventId::new("p", r#" a"b,c "#).header_value(),
            "p:%20a%22b%2Cc%20"
        );
        assert_ne!(
            EventId::new("p", "%C3%A9").header_value(),
            EventId::new("p", "é").header_value()
        );
    }
}
