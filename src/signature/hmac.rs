//! The generic HMAC scheme: one header carries `prefix + encode(HMAC(secret, message))`,
//! where the message is a template over the raw body and, optionally, a timestamp header.
//!
//! GitHub (`X-Hub-Signature-256: sha256=<hex>` of the body), Shopify
//! (`X-Shopify-Hmac-Sha256: <base64>` of the body) and Slack (`X-Slack-Signature:
//! v0=<hex>` of `v0:{timestamp}:{body}`) are specs of it; so is any sender configured by
//! hand.

use actix_web::http::header::HeaderMap;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Sha256, Sha512};
use subtle::ConstantTimeEq;

use super::error::SignatureError;
use super::header::header;
use super::window::Window;

/// The hash under the HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// HMAC-SHA256.
    Sha256,
    /// HMAC-SHA512.
    Sha512,
}

/// How the MAC is written in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Lower- or upper-case hex.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

/// One HMAC scheme.
#[derive(Debug, Clone)]
pub struct HmacSpec {
    /// The header carrying the signature.
    pub header: String,
    /// The hash.
    pub algorithm: Algorithm,
    /// The MAC's text form.
    pub encoding: Encoding,
    /// Text before the encoded MAC (`sha256=`, `v0=`), stripped before decoding.
    pub prefix: String,
    /// The header carrying a Unix-seconds timestamp, checked against the tolerance.
    pub timestamp_header: Option<String>,
    /// The signed message: `{body}` and `{timestamp}` are replaced.
    pub template: String,
}

impl HmacSpec {
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body; no timestamp.
    pub fn github() -> Self {
        Self {
            header: "x-hub-signature-256".into(),
            algorithm: Algorithm::Sha256,
            encoding: Encoding::Hex,
            prefix: "sha256=".into(),
            timestamp_header: None,
            template: "{body}".into(),
        }
    }

    /// Shopify: `X-Shopify-Hmac-Sha256: <base64>` over the body; no timestamp.
    pub fn shopify() -> Self {
        Self {
            header: "x-shopify-hmac-sha256".into(),
            algorithm: Algorithm::Sha256,
            encoding: Encoding::Base64,
            prefix: String::new(),
            timestamp_header: None,
            template: "{body}".into(),
        }
    }

    /// Slack: `X-Slack-Signature: v0=<hex>` over `v0:{timestamp}:{body}`, with
    /// `X-Slack-Request-Timestamp`.
    pub fn slack() -> Self {
        Self {
            header: "x-slack-signature".into(),
            algorithm: Algorithm::Sha256,
            encoding: Encoding::Hex,
            prefix: "v0=".into(),
            timestamp_header: Some("x-slack-request-timestamp".into()),
            template: "v0:{timestamp}:{body}".into(),
        }
    }

    /// Verifies one delivery against every current key.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        keys: &[&[u8]],
        window: Window,
    ) -> Result<(), SignatureError> {
        let given = header(headers, &self.header)?;
        let timestamp = match &self.timestamp_header {
            Some(name) => {
                let ts = header(headers, name)?;
                window.check(ts, name)?;
                ts
            }
            None => "",
        };
        let encoded = given
            .trim()
            .strip_prefix(self.prefix.as_str())
            .ok_or_else(|| SignatureError::Malformed(self.header.clone()))?;
        let signature = match self.encoding {
            Encoding::Hex => hex::decode(encoded).ok(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok(),
        }
        .ok_or_else(|| SignatureError::Malformed(self.header.clone()))?;
        let message = render(&self.template, timestamp, body);
        if keys
            .iter()
            .any(|key| mac_matches(self.algorithm, key, &[&message], &signature))
        {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

impl HmacSpec {
    /// The headers a sender of this scheme attaches to `body` sent at `timestamp` (Unix
    /// seconds), signed with `key`: the signature header and, if the scheme has one, the
    /// timestamp header. The inverse of [`verify`](Self::verify).
    pub fn sign(&self, key: &[u8], timestamp: i64, body: &[u8]) -> Vec<(String, String)> {
        let ts = timestamp.to_string();
        let message = render(&self.template, &ts, body);
        let mac = mac(self.algorithm, key, &message);
        let encoded = match self.encoding {
            Encoding::Hex => hex::encode(mac),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(mac),
        };
        let mut headers = vec![(self.header.clone(), format!("{}{encoded}", self.prefix))];
        if let Some(name) = &self.timestamp_header {
            headers.push((name.clone(), ts));
        }
        headers
    }
}

/// HMAC(`key`, `message`) with `algorithm`. Cannot fail: HMAC takes keys of any length.
fn mac(algorithm: Algorithm, key: &[u8], message: &[u8]) -> Vec<u8> {
    fn run<M: Mac + KeyInit>(key: &[u8], message: &[u8]) -> Vec<u8> {
        match <M as KeyInit>::new_from_slice(key) {
            Ok(mut mac) => {
                mac.update(message);
                mac.finalize().into_bytes().to_vec()
            }
            // Unreachable: HMAC takes keys of any length. An empty MAC verifies nothing.
            Err(_) => Vec::new(),
        }
    }
    match algorithm {
        Algorithm::Sha256 => run::<Hmac<Sha256>>(key, message),
        Algorithm::Sha512 => run::<Hmac<Sha512>>(key, message),
    }
}

/// The template with `{timestamp}` and `{body}` filled in (the body as raw bytes).
fn render(template: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let filled = template.replace("{timestamp}", timestamp);
    let mut parts = filled.split("{body}");
    let mut message = Vec::with_capacity(filled.len() + body.len());
    if let Some(first) = parts.next() {
        message.extend_from_slice(first.as_bytes());
    }
    for rest in parts {
        message.extend_from_slice(body);
        message.extend_from_slice(rest.as_bytes());
    }
    message
}

/// Whether HMAC(`key`, concatenated `parts`) equals `signature`, compared in constant time.
pub fn mac_matches(algorithm: Algorithm, key: &[u8], parts: &[&[u8]], signature: &[u8]) -> bool {
    fn check<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]], signature: &[u8]) -> bool {
        let Ok(mut mac) = <M as KeyInit>::new_from_slice(key) else {
            return false;
        };
        for part in parts {
            mac.update(part);
        }
        mac.verify_slice(signature).is_ok()
    }
    match algorithm {
        Algorithm::Sha256 => check::<Hmac<Sha256>>(key, parts, signature),
        Algorithm::Sha512 => check::<Hmac<Sha512>>(key, parts, signature),
    }
}

/// Bytes in an HMAC-SHA256.
pub const SHA256_LEN: usize = 32;

/// `Ok` when any key's HMAC-SHA256 of `parts` equals any of the `candidates` (a sender
/// may list several signatures while it rolls a secret; we may hold several secrets).
///
/// The MAC is computed once per key and compared with every candidate in constant time;
/// the callers have already bounded the candidates ([`super::candidates`]).
pub fn any_sha256_matches<K: AsRef<[u8]>>(
    keys: impl IntoIterator<Item = K>,
    parts: &[&[u8]],
    candidates: &[Vec<u8>],
) -> Result<(), SignatureError> {
    let mut matched = subtle::Choice::from(0);
    for key in keys {
        let mac = sign_sha256(key.as_ref(), parts);
        for candidate in candidates {
            matched |= mac.as_slice().ct_eq(candidate.as_slice());
        }
    }
    if bool::from(matched) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// HMAC-SHA256 of the concatenated `parts`. Cannot panic: HMAC accepts keys of any length.
pub fn sign_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else {
        // Unreachable: HMAC takes keys of any length. An empty MAC matches no candidate.
        return Vec::new();
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_static(name),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    const NOW: Window = Window {
        now: 1_531_420_618,
        tolerance: 300,
    };

    #[test]
    fn githubs_documented_example_verifies() {
        // From GitHub's "Validating webhook deliveries".
        let h = headers(&[(
            "x-hub-signature-256",
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        )]);
        let key: &[u8] = b"It's a Secret to Everybody";
        assert_eq!(
            HmacSpec::github().verify(&h, b"Hello, World!", &[key], NOW),
            Ok(())
        );
        assert_eq!(
            HmacSpec::github().verify(&h, b"Hello, World?", &[key], NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn slack_signs_version_timestamp_and_body_within_the_window() {
        let key: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J";
        let sig = hex::encode(sign_sha256(key, &[b"v0:1531420618:", body]));
        let ok = headers(&[
            ("x-slack-signature", &format!("v0={sig}")),
            ("x-slack-request-timestamp", "1531420618"),
        ]);
        assert_eq!(HmacSpec::slack().verify(&ok, body, &[key], NOW), Ok(()));
        let late = Window {
            now: NOW.now + 301,
            ..NOW
        };
        assert_eq!(
            HmacSpec::slack().verify(&ok, body, &[key], late),
            Err(SignatureError::Stale(300))
        );
        let no_ts = headers(&[("x-slack-signature", &format!("v0={sig}"))]);
        assert_eq!(
            HmacSpec::slack().verify(&no_ts, body, &[key], NOW),
            Err(SignatureError::MissingHeader(
                "x-slack-request-timestamp".into()
            ))
        );
    }

    #[test]
    fn shopify_is_base64_over_the_body_and_any_current_key_may_match() {
        let body = br#"{"id":1}"#;
        let sig = base64::engine::general_purpose::STANDARD.encode(sign_sha256(b"new", &[body]));
        let h = headers(&[("x-shopify-hmac-sha256", &sig)]);
        let keys: [&[u8]; 2] = [b"old", b"new"];
        assert_eq!(HmacSpec::shopify().verify(&h, body, &keys, NOW), Ok(()));
        assert_eq!(
            HmacSpec::shopify().verify(&h, body, &[b"old"], NOW),
            Err(SignatureError::Mismatch)
        );
        let garbage = headers(&[("x-shopify-hmac-sha256", "%%%")]);
        assert_eq!(
            HmacSpec::shopify().verify(&garbage, body, &keys, NOW),
            Err(SignatureError::Malformed("x-shopify-hmac-sha256".into()))
        );
    }

    #[test]
    fn the_template_puts_raw_body_bytes_where_it_says() {
        assert_eq!(
            render("{timestamp}.{body}", "12", b"\xff\x00"),
            b"12.\xff\x00"
        );
        assert_eq!(render("{body}", "", b"abc"), b"abc");
    }
}
