//! Reading signature headers at a bounded cost: a header's text, and its candidate
//! signatures — at most [`MAX_CANDIDATES`], each checked for length and encoding before
//! anything is hashed.

use actix_web::http::header::HeaderMap;

use super::error::SignatureError;

/// Signatures one header may list. Senders list one per live secret (two while they roll
/// one); a header with more is refused as malformed before anything is hashed.
pub const MAX_CANDIDATES: usize = 8;

/// A header's value as text, or the scheme's error for its absence.
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, SignatureError> {
    headers
        .get(name)
        .ok_or_else(|| SignatureError::MissingHeader(name.into()))?
        .to_str()
        .map_err(|_| SignatureError::Malformed(name.into()))
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
