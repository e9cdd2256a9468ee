//! Stripe: `Stripe-Signature: t=<unix secs>,v1=<hex>[,v1=<hex>…]`, each `v1` an
//! HMAC-SHA256 of `"{t}.{body}"` with the endpoint's signing secret. Several `v1` entries
//! appear while Stripe rolls a secret; any may match. Other schemes (`v0`) are ignored.

use actix_web::http::header::HeaderMap;

use super::hmac::any_sha256_matches;
use super::{header, SignatureError, Window};

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
    let mut candidates = Vec::new();
    for item in value.split(',') {
        match item.trim().split_once('=') {
            Some(("t", t)) => timestamp = Some(t),
            Some(("v1", sig)) => candidates
                .push(hex::decode(sig).map_err(|_| SignatureError::Malformed(HEADER.into()))?),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or_else(|| SignatureError::Malformed(HEADER.into()))?;
    if candidates.is_empty() {
        return Err(SignatureError::Malformed(HEADER.into()));
    }
    window.check(timestamp, HEADER)?;
    let parts: [&[u8]; 3] = [timestamp.as_bytes(), b".", body];
    any_sha256_matches(keys, &parts, &candidates)
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
}
