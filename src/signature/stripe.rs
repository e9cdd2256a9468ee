//! Stripe: `Stripe-Signature: t=<unix secs>,v1=<hex>[,v1=<hex>…]`, each `v1` an
//! HMAC-SHA256 of `"{t}.{body}"` with the endpoint's signing secret. Several `v1` entries
//! appear while Stripe rolls a secret; any may match. Other schemes (`v0`) are ignored.

use actix_web::http::header::HeaderMap;

use super::error::SignatureError;
#[cfg(test)]
use super::header::MAX_CANDIDATES;
use super::header::{candidates, header};
use super::hmac::{any_sha256_matches, SHA256_LEN};
use super::window::Window;

const HEADER: &str = "stripe-signature";

/// Verifies one Stripe delivery.
pub fn verify(
    headers: &HeaderMap,
    body: &[u8],
    keys: &[&[u8]],
    window: Window,
) -> Result<(), SignatureError> {
    let value = header(headers, HEADER)?;
    let mut timestamp = None;
    let items = value
        .split(',')
        .filter_map(|item| item.trim().split_once('='));
    let signatures = items.filter_map(|(name, sig)| match name {
        "t" => {
            timestamp = Some(sig);
            None
        }
        "v1" => Some(sig),
        _ => None,
    });
    let candidates = candidates(signatures, 2 * SHA256_LEN, SHA256_LEN, hex_mac, HEADER)?;
    let timestamp = timestamp.ok_or_else(|| SignatureError::Malformed(HEADER.into()))?;
    window.check(timestamp, HEADER)?;
    let parts: [&[u8]; 3] = [timestamp.as_bytes(), b".", body];
    any_sha256_matches(keys, &parts, &candidates)
}

/// The `Stripe-Signature` header Stripe would attach to `body` sent at `timestamp`
/// (Unix seconds), signed with `secret` (the whole `whsec_…` string is the HMAC key).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> (String, String) {
    let ts = timestamp.to_string();
    let mac = super::hmac::sign_sha256(secret, &[ts.as_bytes(), b".", body]);
    (HEADER.into(), format!("t={ts},v1={}", hex::encode(mac)))
}

fn hex_mac(text: &str) -> Option<Vec<u8>> {
    hex::decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::hmac::sign_sha256;
    use actix_web::http::header::HeaderValue;

    const SECRET: &[u8] = b"whsec_test_secret";
    const T: i64 = 1_700_000_000;
    const BODY: &[u8] = br#"{"id":"evt_1","object":"event"}"#;

    fn signed(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            actix_web::http::header::HeaderName::from_static(HEADER),
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    fn v1(key: &[u8], t: i64, body: &[u8]) -> String {
        hex::encode(sign_sha256(key, &[t.to_string().as_bytes(), b".", body]))
    }

    fn window(now: i64) -> Window {
        Window {
            now,
            tolerance: 300,
        }
    }

    #[test]
    fn a_signature_in_stripes_documented_format_verifies() {
        let h = signed(&format!("t={T},v1={},v0=ignored", v1(SECRET, T, BODY)));
        assert_eq!(verify(&h, BODY, &[SECRET], window(T)), Ok(()));
    }

    #[test]
    fn any_of_several_v1_signatures_may_match() {
        let h = signed(&format!(
            "t={T},v1={},v1={}",
            v1(b"other", T, BODY),
            v1(SECRET, T, BODY)
        ));
        assert_eq!(verify(&h, BODY, &[SECRET], window(T)), Ok(()));
    }

    #[test]
    fn a_tampered_body_a_wrong_secret_and_old_or_future_timestamps_are_refused() {
        let h = signed(&format!("t={T},v1={}", v1(SECRET, T, BODY)));
        assert_eq!(
            verify(&h, b"{}", &[SECRET], window(T)),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&h, BODY, &[b"wrong"], window(T)),
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
        assert_eq!(verify(&h, BODY, &[SECRET], window(T + 300)), Ok(()));
    }

    #[test]
    fn missing_and_malformed_headers_are_refused() {
        assert_eq!(
            verify(&HeaderMap::new(), BODY, &[SECRET], window(T)),
            Err(SignatureError::MissingHeader(HEADER.into()))
        );
        for bad in ["v1=abcd", &format!("t={T}"), &format!("t={T},v1=zz")] {
            assert_eq!(
                verify(&signed(bad), BODY, &[SECRET], window(T)),
                Err(SignatureError::Malformed(HEADER.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_header_with_thousands_of_candidates_is_malformed_before_any_hashing() {
        let mut value = format!("t={T}");
        for _ in 0..20_000 {
            value.push_str(",v1=");
        }
        assert_eq!(
            verify(&signed(&value), BODY, &[SECRET], window(T)),
            Err(SignatureError::Malformed(HEADER.into()))
        );
        let mut wrong = format!("t={T}");
        for _ in 0..(MAX_CANDIDATES + 1) {
            wrong.push_str(&format!(",v1={}", v1(b"other", T, BODY)));
        }
        assert_eq!(
            verify(&signed(&wrong), BODY, &[SECRET], window(T)),
            Err(SignatureError::Malformed(HEADER.into()))
        );
    }

    #[test]
    fn candidates_of_the_wrong_length_are_dropped_and_the_right_one_still_matches() {
        let h = signed(&format!("t={T},v1=abcd,v1=,v1={}", v1(SECRET, T, BODY)));
        assert_eq!(verify(&h, BODY, &[SECRET], window(T)), Ok(()));
        let only_short = signed(&format!("t={T},v1=abcd,v1="));
        assert_eq!(
            verify(&only_short, BODY, &[SECRET], window(T)),
            Err(SignatureError::Malformed(HEADER.into()))
        );
    }
}
