//! Signature verification: proves a delivery came from the sender holding the shared
//! secret, over the raw body bytes, before anything is claimed.
//!
//! Schemes: [`hmac`] (a header carrying an HMAC of a template over the body, optionally with
//! a timestamp — GitHub, Shopify, Slack and hand-configured senders are specs of it),
//! [`stripe`] and [`standard`] (Standard Webhooks / Svix) with their own header formats.
//! Every comparison is constant-time (`subtle`). Errors name the reason, never the expected
//! signature. Time is a parameter, so every window is testable.
//!
//! Cost is bounded before any hashing: a header lists at most [`MAX_CANDIDATES`]
//! signatures, candidates of the wrong length or encoding are dropped unread, and the MAC
//! is computed once per secret and then compared with each candidate — so the worst
//! rejected request costs what a valid one costs (one HMAC of the body per secret).

pub mod hmac;
pub mod standard;
pub mod stripe;

use std::time::{Duration, SystemTime};

use actix_web::http::header::HeaderMap;

use crate::secret::Secret;

/// Signatures one header may list. Senders list one per live secret (two while they roll
/// one); a header with more is refused as malformed before anything is hashed.
pub const MAX_CANDIDATES: usize = 8;

/// Why a delivery's signature was refused (401, nothing claimed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header the scheme needs is absent.
    #[error("missing signature header {0}")]
    MissingHeader(String),
    /// A header is present but not in the scheme's format.
    #[error("malformed signature header {0}")]
    Malformed(String),
    /// The signed timestamp is too far from now.
    #[error("the signature timestamp is outside the {0}-second tolerance")]
    Stale(u64),
    /// No current secret produced the signature.
    #[error("the signature does not match")]
    Mismatch,
}

impl SignatureError {
    /// The machine-readable reason in the body and in `webhook.rejected` logs.
    pub fn code(&self) -> &'static str {
        match self {
            SignatureError::MissingHeader(_) => "missing_signature",
            SignatureError::Malformed(_) => "malformed_signature",
            SignatureError::Stale(_) => "timestamp_out_of_tolerance",
            SignatureError::Mismatch => "bad_signature",
        }
    }
}

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
    Hmac(hmac::HmacSpec),
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

/// The acceptable window around now for a signed timestamp.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Now, in Unix seconds.
    pub now: i64,
    /// Allowed distance either side, in seconds.
    pub tolerance: u64,
}

impl Window {
    /// Parses a Unix-seconds timestamp and checks it lies within the window.
    pub fn check(&self, timestamp: &str, header: &str) -> Result<(), SignatureError> {
        let ts: i64 = timestamp
            .trim()
            .parse()
            .map_err(|_| SignatureError::Malformed(header.into()))?;
        if ts.abs_diff(self.now) > self.tolerance {
            Err(SignatureError::Stale(self.tolerance))
        } else {
            Ok(())
        }
    }
}

/// A header's value as text, or the scheme's error for its absence.
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, SignatureError> {
    headers
        .get(name)
        .ok_or_else(|| SignatureError::MissingHeader(name.into()))?
        .to_str()
        .map_err(|_| SignatureError::Malformed(name.into()))
}

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// The candidate signatures of one header, checked for cost before any hashing: more than
/// [`MAX_CANDIDATES`] entries is malformed; an entry whose text is not `encoded_len` long
/// or does not decode to `mac_len` bytes is dropped; none left is malformed.
pub fn candidates<'a>(
    entries: impl Iterator<Item = &'a str>,
    encoded_len: usize,
    mac_len: usize,
    decode: impl Fn(&str) -> Option<Vec<u8>>,
    header: &str,
) -> Result<Vec<Vec<u8>>, SignatureError> {
    let mut kept = Vec::new();
    for (i, entry) in entries.enumerate() {
        if i >= MAX_CANDIDATES {
            return Err(SignatureError::Malformed(header.into()));
        }
        let entry = entry.trim();
        if entry.len() != encoded_len {
            continue;
        }
        if let Some(mac) = decode(entry).filter(|m| m.len() == mac_len) {
            kept.push(mac);
        }
    }
    if kept.is_empty() {
        Err(SignatureError::Malformed(header.into()))
    } else {
        Ok(kept)
    }
}
