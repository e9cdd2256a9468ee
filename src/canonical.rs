//! Canonical JSON and the hashes built on it: the `fields` idempotency key and the payload
//! fingerprint.
//!
//! Canonical form: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings and numbers as serde_json writes them. Two bodies that differ only in key order
//! or whitespace hash the same. Pure; the body is parsed at most once per request
//! ([`Body`]).

use std::cell::OnceCell;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::seal::Keyring;

/// A request body, parsed as JSON on first use (by the key, the fingerprint, or both).
pub struct Body<'a> {
    raw: &'a [u8],
    parsed: OnceCell<Option<Value>>,
}

impl<'a> Body<'a> {
    /// Wraps raw body bytes.
    pub fn new(raw: &'a [u8]) -> Self {
        Self {
            raw,
            parsed: OnceCell::new(),
        }
    }

    /// The raw bytes.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// The body as JSON, or `None` when it is not JSON.
    pub fn json(&self) -> Option<&Value> {
        self.parsed
            .get_or_init(|| serde_json::from_slice(self.raw).ok())
            .as_ref()
    }
}

/// Appends the canonical form of `value` to `out`.
///
/// ```
/// let value: serde_json::Value = serde_json::from_str(r#"{ "b": 1, "a": [true, null] }"#).unwrap();
/// let mut out = Vec::new();
/// hookgate::canonical::write_canonical(&value, &mut out);
/// assert_eq!(out, br#"{"a":[true,null],"b":1}"#);
/// ```
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(key.clone()), out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Writing a scalar into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// Hex SHA-256 of the canonical form of `value`.
pub fn canonical_hash(value: &Value) -> String {
    let mut bytes = Vec::new();
    write_canonical(value, &mut bytes);
    sha256_hex(&bytes)
}

/// Lower-case hex SHA-256 of `bytes`. (`hex::encode` goes a char at a time through an
/// iterator: several times slower, on every delivery's fingerprint.)
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut digits = [0u8; 64];
    // 32 bytes are exactly 64 hex digits: this cannot fail.
    let _ = hex::encode_to_slice(Sha256::digest(bytes), &mut digits);
    String::from_utf8_lossy(&digits).into_owned()
}

/// The `fields` key: a hash of the listed pointers' values (as a JSON array), or `None`
/// when the body is not JSON or any pointer is missing.
pub fn fields_key(body: &Body<'_>, pointers: &[String]) -> Option<String> {
    let json = body.json()?;
    let values = pointers
        .iter()
        .map(|p| json.pointer(p).cloned())
        .collect::<Option<Vec<Value>>>()?;
    Some(canonical_hash(&Value::Array(values)))
}

/// Computes payload fingerprints for one provider.
#[derive(Debug, Clone)]
pub struct Fingerprinter {
    enabled: bool,
    exclude: Vec<String>,
    /// With encryption at rest: fingerprints are keyed, so a small payload cannot be
    /// guessed from its fingerprint.
    keyring: Option<std::sync::Arc<Keyring>>,
}

impl Fingerprinter {
    /// Fingerprints ignoring the values at `exclude` (JSON pointers); `enabled = false`
    /// turns fingerprints off.
    pub fn new(enabled: bool, exclude: Vec<String>) -> Self {
        Self {
            enabled,
            exclude,
            keyring: None,
        }
    }

    /// This fingerprinter keyed by `keyring`'s sealing key (`k:<id>:<hex>`).
    pub fn keyed(mut self, keyring: Option<std::sync::Arc<Keyring>>) -> Self {
        self.keyring = keyring;
        self
    }

    /// The fingerprint: canonical JSON with the excluded pointers removed, or the raw
    /// bytes' hash for a body that is not JSON. `None` when off.
    pub fn fingerprint(&self, body: &Body<'_>) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let mut canonical = Vec::new();
        let bytes = self.canonical(body, &mut canonical);
        Some(match &self.keyring {
            Some(keyring) => keyring.fingerprint(bytes),
            None => sha256_hex(bytes),
        })
    }

    /// The fingerprint of `body` of the same kind as `stored` (one made before a key
    /// rotation, or before encryption was on): a plain SHA-256, or keyed by the key its
    /// kind names — an error naming that key when it is not configured (the payloads
    /// cannot be compared).
    pub fn fingerprint_as(&self, body: &Body<'_>, stored: &str) -> Result<String, String> {
        let kind = crate::claim::fingerprint_kind(stored);
        let mut canonical = Vec::new();
        let bytes = self.canonical(body, &mut canonical);
        if kind.is_empty() {
            return Ok(sha256_hex(bytes));
        }
        let id = kind
            .strip_prefix("k:")
            .and_then(|k| k.strip_suffix(':'))
            .ok_or_else(|| format!("a fingerprint of an unknown kind {kind:?}"))?;
        self.keyring
            .as_ref()
            .and_then(|keys| keys.fingerprint_with(id, bytes))
            .ok_or_else(|| {
                format!(
                    "fingerprinted under key {id:?}, which is not among [store.encryption] keys"
                )
            })
    }

    /// The bytes a fingerprint hashes: `body`'s canonical JSON with the excluded pointers
    /// removed (written into `canonical`), or its raw bytes when it is not JSON.
    fn canonical<'b>(&self, body: &'b Body<'_>, canonical: &'b mut Vec<u8>) -> &'b [u8] {
        match body.json() {
            Some(json) if self.exclude.is_empty() => {
                write_canonical(json, canonical);
                canonical
            }
            Some(json) => {
                let mut json = json.clone();
                for pointer in &self.exclude {
                    remove_pointer(&mut json, pointer);
                }
                write_canonical(&json, canonical);
                canonical
            }
            None => body.raw(),
        }
    }
}

/// Removes the value at an RFC 6901 pointer, if present.
fn remove_pointer(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(exclude: &[&str], body: &str) -> String {
        Fingerprinter::new(true, exclude.iter().map(|s| s.to_string()).collect())
            .fingerprint(&Body::new(body.as_bytes()))
            .expect("on")
    }

    #[test]
    fn canonical_form_sorts_keys_and_drops_whitespace() {
        let value: Value =
            serde_json::from_str(r#"{ "b": [1, {"d":1,"c":"x"}], "a": null }"#).unwrap();
        let mut out = Vec::new();
        write_canonical(&value, &mut out);
        assert_eq!(out, br#"{"a":null,"b":[1,{"c":"x","d":1}]}"#);
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        assert_eq!(
            fp(&[], r#"{"a":1,"b":2}"#),
            fp(&[], "{ \"b\" : 2,\n \"a\" : 1 }")
        );
        assert_ne!(fp(&[], r#"{"a":1,"b":2}"#), fp(&[], r#"{"a":1,"b":3}"#));
    }

    #[test]
    fn excluded_pointers_are_ignored_even_escaped_and_in_arrays() {
        let base = fp(&["/pending_webhooks"], r#"{"id":"e","pending_webhooks":1}"#);
        assert_eq!(
            base,
            fp(&["/pending_webhooks"], r#"{"id":"e","pending_webhooks":7}"#)
        );
        assert_eq!(base, fp(&["/pending_webhooks"], r#"{"id":"e"}"#));
        assert_eq!(
            fp(&["/a~1b"], r#"{"a/b":1,"x":0}"#),
            fp(&["/a~1b"], r#"{"a/b":2,"x":0}"#)
        );
        assert_eq!(
            fp(&["/l/0"], r#"{"l":[1,2]}"#),
            fp(&["/l/0"], r#"{"l":[9,2]}"#)
        );
    }

    #[test]
    fn a_body_that_is_not_json_hashes_its_bytes_and_off_is_none() {
        assert_eq!(fp(&[], "plain"), hex::encode(Sha256::digest(b"plain")));
        assert_eq!(
            Fingerprinter::new(false, vec![]).fingerprint(&Body::new(b"{}")),
            None
        );
    }

    #[test]
    fn fields_keys_are_stable_and_need_every_field() {
        let body = |s: &'static str| Body::new(s.as_bytes());
        let pointers = vec!["/data/object/id".to_string(), "/type".to_string()];
        let a = fields_key(
            &body(r#"{"type":"t","data":{"object":{"id":"o1"}},"ts":1}"#),
            &pointers,
        );
        let b = fields_key(
            &body(r#"{"data":{"object":{"id":"o1"}},"ts":2, "type":"t"}"#),
            &pointers,
        );
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_eq!(fields_key(&body(r#"{"type":"t"}"#), &pointers), None);
        assert_eq!(fields_key(&body("nope"), &pointers), None);
    }

    #[test]
    fn fingerprints_keep_numbers_exactly_as_written() {
        assert_ne!(
            fp(&[], r#"{"amount":18446744073709551616}"#),
            fp(&[], r#"{"amount":18446744073709551617}"#)
        );
        assert_ne!(
            fp(&[], r#"{"amount":0.30000000000000004}"#),
            fp(&[], r#"{"amount":0.3}"#)
        );
        assert_ne!(fp(&[], r#"{"amount":1.0}"#), fp(&[], r#"{"amount":1}"#));
    }
}
