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
