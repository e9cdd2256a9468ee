//! Standard Webhooks (also Svix): `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64> [v1,<base64> …]`, each an HMAC-SHA256 of
//! `"{id}.{timestamp}.{body}"` keyed by the base64-decoded secret after its `whsec_`
//! prefix.

use actix_web::http::header::HeaderMap;
use base64::Engine;

use super::error::SignatureError;
#[cfg(test)]
use super::header::MAX_CANDIDATES;
use super::header::{candidates, header};
use super::hmac::{any_sha256_matches, SHA256_LEN};
use super::window::Window;

/// Length of a 32-byte MAC in padded standard base64.
const BASE64_MAC_LEN: usize = 44;

const ID: &str = "webhook-id";
const TIMESTAMP: &str = "webhook-timestamp";
const SIGNATURE: &str = "webhook-signature";

/// The key bytes of a `whsec_<base64>` secret (a bare base64 secret is accepted too);
/// `None` when it is not base64 or decodes to no bytes (an empty HMAC key, which anyone
/// can sign with).
pub fn decode_secret(secret: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(secret).ok()?;
    let encoded = text.strip_prefix("whsec_").unwrap_or(text);
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .filter(|key| !key.is_empty())
}

/// The `webhook-signature` value for a message `id` sent at `timestamp` with `body`:
/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed by the decoded secret.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let mac = super::hmac::sign_sha256(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac)
    )
}

/// Verifies one Standard Webhooks delivery.
pub fn verify(
    headers: &HeaderMap,
    body: &[u8],
    keys: &[&[u8]],
    window: Window,
) -> Result<(), SignatureError> {
    let id = header(headers, ID)?;
    let timestamp = header(headers, TIMESTAMP)?;
    let value = header(headers, SIGNATURE)?;
    window.check(timestamp, TIMESTAMP)?;
    // Every entry counts against the cap (whatever its version); only `v1` ones are kept.
    let entries = value
        .split_whitespace()
        .map(|entry| entry.strip_prefix("v1,").unwrap_or(""));
    let candidates = candidates(entries, BASE64_MAC_LEN, SHA256_LEN, base64_mac, SIGNATURE)?;
    let parts: [&[u8]; 5] = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
    let keys = keys.iter().filter_map(|k| decode_secret(k));
    any_sha256_matches(keys, &parts, &candidates)
}

fn base64_mac(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    // The Standard Webhooks specification's published test vector.
    const SECRET: &[u8] = b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const MSG_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const T: i64 = 1_614_265_330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn headers(id: &str, t: &str, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in [(ID, id), (TIMESTAMP, t), (SIGNATURE, sig)] {
            h.insert(
                HeaderName::from_static(name),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    fn window(now: i64) -> Window {
        Window {
            now,
            tolerance: 300,
        }
    }

    #[test]
    fn the_published_test_vector_verifies() {
        let h = headers(MSG_ID, &T.to_string(), SIG);
        assert_eq!(verify(&h, BODY, &[SECRET], window(T)), Ok(()));
    }

    #[test]
    fn signing_reproduces_the_published_test_vector() {
        let key = decode_secret(SECRET).unwrap();
        assert_eq!(sign(&key, MSG_ID, T, BODY), SIG);
    }

    #[test]
    fn any_entry_of_a_space_separated_list_may_match() {
        let h = headers(MSG_ID, &T.to_string(), &format!("v1,bm90IGl0 v2,xyz {SIG}"));
        assert_eq!(verify(&h, BODY, &[SECRET], window(T)), Ok(()));
    }

    #[test]
    fn tampering_a_wrong_secret_and_the_window_are_refused() {
        let h = headers(MSG_ID, &T.to_string(), SIG);
        assert_eq!(
            verify(&h, b"{}", &[SECRET], window(T)),
            Err(SignatureError::Mismatch)
        );
        let other: &[u8] = b"whsec_c2VjcmV0";
        assert_eq!(
            verify(&h, BODY, &[other], window(T)),
            Err(SignatureError::Mismatch)
        );
        let wrong_id = headers("msg_other", &T.to_string(), SIG);
        assert_eq!(
            verify(&wrong_id, BODY, &[SECRET], window(T)),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&h, BODY, &[SECRET], window(T + 301)),
            Err(SignatureError::Stale(300))
        );
        assert_eq!(
            verify(&h, BODY, &[SECRET], window(T - 301)),
            Err(SignatureError::Stale(300))
        );
        assert_eq!(
            verify(&HeaderMap::new(), BODY, &[SECRET], window(T)),
            Err(SignatureError::MissingHeader(ID.into()))
        );
    }

    #[test]
    fn a_header_with_thousands_of_entries_is_malformed_before_any_hashing() {
        let many = vec!["v1,"; 20_000].join(" ");
        let h = headers(MSG_ID, &T.to_string(), &many);
        assert_eq!(
            verify(&h, BODY, &[SECRET], window(T)),
            Err(SignatureError::Malformed(SIGNATURE.into()))
        );
        let wrong = format!("v1,{} ", "A".repeat(43) + "=").repeat(MAX_CANDIDATES + 1);
        let h = headers(MSG_ID, &T.to_string(), &wrong);
        assert_eq!(
            verify(&h, BODY, &[SECRET], window(T)),
            Err(SignatureError::Malformed(SIGNATURE.into()))
        );
    }

    #[test]
    fn only_entries_of_the_right_length_count() {
        let h = headers(MSG_ID, &T.to_string(), "v1,bm90IGl0 v1,");
        assert_eq!(
            verify(&h, BODY, &[SECRET], window(T)),
            Err(SignatureError::Malformed(SIGNATURE.into()))
        );
    }
}
