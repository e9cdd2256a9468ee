//! A provider's verifier: its scheme, its current secrets and its timestamp tolerance.

use std::time::{Duration, SystemTime};

use actix_web::http::header::HeaderMap;

use super::error::SignatureError;
use super::hmac::HmacSpec;
use super::window::{unix_secs, Window};
use super::{standard, stripe};
use crate::secret::Secret;

/// One signing secret and when it stops being accepted (rotation without downtime).
#[derive(Debug, Clone)]
pub struct SigningKey {
    /// The secret as configured.
    pub secret: Secret,
    /// After this instant the secret is ignored.
    pub not_after: Option<SystemTime>,
}

/// A provider's verifier: a scheme, its secrets and its timestamp tolerance.
#[derive(Debug, Clone)]
pub struct Verifier {
    scheme: Scheme,
    keys: Vec<SigningKey>,
    tolerance: Duration,
}

/// The signature schemes.
#[derive(Debug, Clone)]
pub enum Scheme {
    /// No verification.
    None,
    /// An HMAC of a template over the body in one header.
    Hmac(HmacSpec),
    /// `Stripe-Signature: t=…,v1=…`.
    Stripe,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64> …`.
    Standard,
}

impl Verifier {
    /// A verifier for `scheme` accepting any of `keys` still current.
    pub fn new(scheme: Scheme, keys: Vec<SigningKey>, tolerance: Duration) -> Self {
        Self {
            scheme,
            keys,
            tolerance,
        }
    }

    /// Whether this verifier checks anything.
    pub fn is_none(&self) -> bool {
        matches!(self.scheme, Scheme::None)
    }

    /// The headers the sender would attach to `body`, message `id`, at `now`, signed with
    /// the first secret still current: what [`verify`](Self::verify) accepts (for
    /// `hookgate send`). Empty for [`Scheme::None`], or when no secret is current, or a
    /// Standard Webhooks secret does not decode.
    pub fn sign(&self, body: &[u8], id: &str, now: SystemTime) -> Vec<(String, String)> {
        let Some(key) = self
            .keys
            .iter()
            .find(|k| k.not_after.is_none_or(|t| now <= t))
            .map(|k| k.secret.expose().as_bytes())
        else {
            return Vec::new();
        };
        let ts = unix_secs(now);
        match &self.scheme {
            Scheme::None => Vec::new(),
            Scheme::Hmac(spec) => spec.sign(key, ts, body),
            Scheme::Stripe => vec![stripe::sign(key, ts, body)],
            Scheme::Standard => match standard::decode_secret(key) {
                Some(key) => vec![
                    ("webhook-id".into(), id.into()),
                    ("webhook-timestamp".into(), ts.to_string()),
                    (
                        "webhook-signature".into(),
                        standard::sign(&key, id, ts, body),
                    ),
                ],
                None => Vec::new(),
            },
        }
    }

    /// Verifies a delivery as of `now`.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        let keys: Vec<&[u8]> = self
            .keys
            .iter()
            .filter(|k| k.not_after.is_none_or(|t| now <= t))
            .map(|k| k.secret.expose().as_bytes())
            .collect();
        let check = Window {
            now: unix_secs(now),
            tolerance: self.tolerance.as_secs(),
        };
        match &self.scheme {
            Scheme::None => Ok(()),
            Scheme::Hmac(spec) => spec.verify(headers, body, &keys, check),
            Scheme::Stripe => stripe::verify(headers, body, &keys, check),
            Scheme::Standard => standard::verify(headers, body, &keys, check),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::hmac::{Algorithm, Encoding, HmacSpec};
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(String, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn what_a_scheme_signs_it_verifies_and_another_body_fails() {
        let custom = HmacSpec {
            header: "x-sig".into(),
            algorithm: Algorithm::Sha512,
            encoding: Encoding::Base64,
            prefix: "v9=".into(),
            timestamp_header: Some("x-ts".into()),
            template: "{timestamp}:{body}".into(),
        };
        let schemes = [
            (Scheme::Stripe, "whsec_plain"),
            (Scheme::Standard, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            (Scheme::Hmac(HmacSpec::github()), "gh"),
            (Scheme::Hmac(HmacSpec::slack()), "sl"),
            (Scheme::Hmac(HmacSpec::shopify()), "sh"),
            (Scheme::Hmac(custom), "c"),
        ];
        let now = SystemTime::now();
        for (scheme, secret) in schemes {
            let key = SigningKey {
                secret: Secret::new(secret),
                not_after: None,
            };
            let verifier = Verifier::new(scheme.clone(), vec![key], Duration::from_secs(300));
            let body = br#"{"id":"evt_1"}"#;
            let signed = headers(&verifier.sign(body, "evt_1", now));
            assert_eq!(verifier.verify(&signed, body, now), Ok(()), "{scheme:?}");
            assert_eq!(
                verifier.verify(&signed, br#"{"id":"evt_2"}"#, now),
                Err(SignatureError::Mismatch),
                "{scheme:?}"
            );
        }
    }
}
