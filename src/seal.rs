//! Values sealed at rest: AES-256-GCM under a keyring whose first key seals and whose
//! others only open, a random 96-bit nonce per value, and the value's place (its row's
//! scope and key, its column, a history row's attempt) as associated data, so a sealed
//! value copied to another row or column does not open. Each sealed value names the key
//! that sealed it. Also the keyed payload fingerprint. Part of the core: imports nothing of
//! hookgate.
//!
//! A sealed byte value is `\0HG1`, the key id's length (one byte) and the id, the nonce,
//! then the ciphertext and its 16-byte tag. A sealed text value is `~hg1:<id>:` and the
//! base64 (standard, unpadded) of the nonce, ciphertext and tag. Anything else is a value
//! written before encryption was turned on, and is read as it stands — unless the keyring
//! requires every value sealed, when it is refused.

use std::borrow::Cow;
use std::fmt;

use aes_gcm::aead::{AeadInOut, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The first bytes of a sealed byte value.
pub const MAGIC: &[u8] = b"\0HG1";
/// The first characters of a sealed text value.
pub const TEXT_MAGIC: &str = "~hg1:";
/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// The longest key id.
pub const MAX_ID: usize = 32;
const NONCE: usize = 12;
const TAG: usize = 16;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD_NO_PAD;

/// The column a sealed value lives in: part of its associated data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// `webhook_events.payload`.
    Payload,
    /// `webhook_events.result_body` (the cached answer).
    ResultBody,
    /// `webhook_events.request_headers` (the kept headers).
    RequestHeaders,
    /// `webhook_attempts.answer` of the given attempt (a history excerpt).
    Answer(i32),
}

impl Column {
    fn tag(self) -> (&'static str, i32) {
        match self {
            Self::Payload => ("payload", 0),
            Self::ResultBody => ("result_body", 0),
            Self::RequestHeaders => ("request_headers", 0),
            Self::Answer(attempt) => ("answer", attempt),
        }
    }
}

/// Where a value lives: its row's scope (provider, or `provider.route`) and key, and its
/// column. A value opens only at the place it was sealed for.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The row's scope.
    pub scope: &'a str,
    /// The row's event key.
    pub key: &'a str,
    /// The column.
    pub column: Column,
}

impl Place<'_> {
    /// The associated data: a version, the key id, then each part length-prefixed.
    fn aad(&self, id: &str) -> Vec<u8> {
        let (column, attempt) = self.column.tag();
        let mut aad = Vec::with_capacity(32 + id.len() + self.scope.len() + self.key.len());
        aad.extend_from_slice(b"hookgate-seal-1");
        for part in [id, self.scope, self.key, column] {
            aad.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
            aad.extend_from_slice(part.as_bytes());
        }
        aad.extend_from_slice(&attempt.to_be_bytes());
        aad
    }
}

/// Why a stored value could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Sealed by a key this node does not have.
    #[error("sealed by key {0:?}, which is not among [store.encryption] keys")]
    UnknownKey(String),
    /// The tag did not verify: the value was changed, or sealed for another place.
    #[error(
        "sealed by key {0:?} but does not open here: changed, or moved from another row or column"
    )]
    Forged(String),
    /// It starts like a sealed value but is not one.
    #[error("a sealed value that is cut short or malformed")]
    Malformed,
    /// Not sealed at all, where `store.encryption.require_sealed` wants every body sealed
    /// (a value from before encryption was on, or written into the table by hand).
    #[error("plaintext where a sealed value is required (store.encryption.require_sealed)")]
    Plaintext,
}

/// One key: its id, its cipher, and the key its fingerprints are made with.
struct Key {
    id: String,
    cipher: Aes256Gcm,
    fingerprint: Hmac<Sha256>,
}

/// The configured keys: the first seals, every one opens.
pub struct Keyring {
    keys: Vec<Key>,
    /// Every stored body must be sealed: plaintext is refused where it is read
    /// ([`OpenError::Plaintext`]) instead of read as it stands.
    require_sealed: bool,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("ids", &ids).finish()
    }
}

/// Whether `id` can name a key: 1 to [`MAX_ID`] ASCII letters, digits, `-`, `_` or `.`.
pub fn valid_id(id: &str) -> bool {
    (1..=MAX_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A key's 32 bytes from its text: base64 (standard or URL-safe, padded or not) or 64 hex
/// digits. The error says what is wrong, never the value.
pub fn decode_key(text: &str) -> Result<[u8; KEY_BYTES], String> {
    let text = text.trim();
    let bytes = if text.len() == 2 * KEY_BYTES && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(text).map_err(|_| "is not hex".to_owned())?
    } else {
        use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
        let unpadded = text.trim_end_matches('=');
        STANDARD_NO_PAD
            .decode(unpadded)
            .or_else(|_| URL_SAFE_NO_PAD.decode(unpadded))
            .map_err(|_| {
                "is neither base64 nor 64 hex digits (`openssl rand -base64 32` makes a key)"
                    .to_owned()
            })?
    };
    <[u8; KEY_BYTES]>::try_from(bytes.as_slice()).map_err(|_| {
        format!(
            "holds {} bytes; a key is {KEY_BYTES} (`openssl rand -base64 32` makes one)",
            bytes.len()
        )
    })
}

impl Keyring {
    /// A keyring of `keys`, `(id, key)`, the first sealing. Refuses an empty list, an id
    /// that is not [`valid_id`], and an id given twice.
    pub fn new(keys: &[(String, [u8; KEY_BYTES])]) -> Result<Self, String> {
        if keys.is_empty() {
            return Err("no key".into());
        }
        let mut ring = Vec::with_capacity(keys.len());
        for (id, key) in keys {
            if !valid_id(id) {
                return Err(format!(
                    "key id {id:?} is not 1 to {MAX_ID} letters, digits, '-', '_' or '.'"
                ));
            }
            if ring.iter().any(|k: &Key| k.id == *id) {
                return Err(format!("key id {id:?} is given twice"));
            }
            let cipher = Aes256Gcm::new_from_slice(key).map_err(|e| e.to_string())?;
            // The fingerprint key is the key's HMAC of a fixed label: it never seals.
            let mut derive =
                <Hmac<Sha256> as KeyInit>::new_from_slice(key).map_err(|e| e.to_string())?;
            derive.update(b"hookgate payload fingerprint");
            let fingerprint =
                <Hmac<Sha256> as KeyInit>::new_from_slice(&derive.finalize().into_bytes())
                    .map_err(|e| e.to_string())?;
            ring.push(Key {
                id: id.clone(),
                cipher,
                fingerprint,
            });
        }
        Ok(Self {
            keys: ring,
            require_sealed: false,
        })
    }

    /// This keyring, refusing plaintext bodies where they are read when `on`.
    pub fn require_sealed(mut self, on: bool) -> Self {
        self.require_sealed = on;
        self
    }

    /// Whether plaintext bodies are refused (`store.encryption.require_sealed`).
    pub fn requires_sealed(&self) -> bool {
        self.require_sealed
    }

    /// The id of the key that seals.
    pub fn sealing_id(&self) -> &str {
        &self.keys[0].id
    }

    /// The ids of every key, the sealing one first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }

    fn key(&self, id: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// `plain` sealed for `place` under the sealing key.
    pub fn seal(&self, place: &Place<'_>, plain: &[u8]) -> Vec<u8> {
        let key = &self.keys[0];
        let id = key.id.as_bytes();
        let head = MAGIC.len() + 1 + id.len();
        let mut out = Vec::with_capacity(head + NONCE + plain.len() + TAG);
        out.extend_from_slice(MAGIC);
        // A valid id is at most 32 bytes.
        out.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(id);
        let sealed = seal_under(key, place, plain);
        out.extend_from_slice(&sealed);
        out
    }

    /// `plain` sealed for `place` as text (for a text column).
    pub fn seal_text(&self, place: &Place<'_>, plain: &str) -> String {
        let key = &self.keys[0];
        let sealed = seal_under(key, place, plain.as_bytes());
        let mut out =
            String::with_capacity(TEXT_MAGIC.len() + key.id.len() + 1 + sealed.len() * 4 / 3 + 4);
        out.push_str(TEXT_MAGIC);
        out.push_str(&key.id);
        out.push(':');
        B64.encode_string(&sealed, &mut out);
        out
    }

    /// The plaintext of a stored byte value read at `place`: opened when sealed, as it
    /// stands when written before encryption was on (refused when every body must be
    /// sealed).
    pub fn open<'v>(
        &self,
        place: &Place<'_>,
        stored: &'v [u8],
    ) -> Result<Cow<'v, [u8]>, OpenError> {
        let Some(id) = sealed_id(stored) else {
            return self.plain(stored).map(Cow::Borrowed);
        };
        let key = self
            .key(id)
            .ok_or_else(|| OpenError::UnknownKey(id.to_owned()))?;
        let body = &stored[MAGIC.len() + 1 + id.len()..];
        open_under(key, place, body).map(Cow::Owned)
    }

    /// [`open`](Self::open) for a text value.
    pub fn open_text<'v>(
        &self,
        place: &Place<'_>,
        stored: &'v str,
    ) -> Result<Cow<'v, str>, OpenError> {
        let Some((id, body)) = sealed_text(stored) else {
            return self.plain(stored).map(Cow::Borrowed);
        };
        let key = self
            .key(id)
            .ok_or_else(|| OpenError::UnknownKey(id.to_owned()))?;
        let body = B64.decode(body).map_err(|_| OpenError::Malformed)?;
        let plain = open_under(key, place, &body)?;
        String::from_utf8(plain)
            .map(Cow::Owned)
            .map_err(|_| OpenError::Malformed)
    }

    /// A value that is not sealed: read as it stands, unless every body must be sealed.
    fn plain<'v, T: ?Sized>(&self, stored: &'v T) -> Result<&'v T, OpenError> {
        if self.require_sealed {
            Err(OpenError::Plaintext)
        } else {
            Ok(stored)
        }
    }

    /// The keyed fingerprint of canonical bytes: `k:<id>:<hex of HMAC-SHA256>` under a key
    /// derived from the sealing key.
    pub fn fingerprint(&self, canonical: &[u8]) -> String {
        keyed_fingerprint(&self.keys[0], canonical)
    }

    /// The keyed fingerprint of canonical bytes under the key named `id` (one that opens,
    /// no longer the sealing one: a row fingerprinted before a rotation), if it is
    /// configured.
    pub fn fingerprint_with(&self, id: &str, canonical: &[u8]) -> Option<String> {
        self.key(id).map(|key| keyed_fingerprint(key, canonical))
    }

    /// Whether `stored` (bytes) needs a reseal to be under the sealing key: plaintext, or
    /// sealed by another key.
    pub fn stale(&self, stored: &[u8]) -> bool {
        sealed_id(stored) != Some(self.sealing_id())
    }

    /// [`stale`](Self::stale) for a text value.
    pub fn stale_text(&self, stored: &str) -> bool {
        sealed_text(stored).map(|(id, _)| id) != Some(self.sealing_id())
    }

    /// The prefix every byte value sealed by the sealing key starts with.
    pub fn sealing_prefix(&self) -> Vec<u8> {
        let id = self.sealing_id().as_bytes();
        let mut prefix = MAGIC.to_vec();
        prefix.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
        prefix.extend_from_slice(id);
        prefix
    }

    /// The prefix every text value sealed by the sealing key starts with.
    pub fn sealing_text_prefix(&self) -> String {
        format!("{TEXT_MAGIC}{}:", self.sealing_id())
    }
}

/// `canonical`'s fingerprint under `key`: `k:<id>:<hex of HMAC-SHA256>`.
fn keyed_fingerprint(key: &Key, canonical: &[u8]) -> String {
    let mut mac = key.fingerprint.clone();
    mac.update(canonical);
    let mut digits = [0u8; 64];
    // 32 bytes are exactly 64 hex digits: this cannot fail.
    let _ = hex::encode_to_slice(mac.finalize().into_bytes(), &mut digits);
    format!("k:{}:{}", key.id, String::from_utf8_lossy(&digits))
}

/// The id of the key that sealed a byte value; `None` for a value that is not sealed.
pub fn sealed_id(stored: &[u8]) -> Option<&str> {
    let rest = stored.strip_prefix(MAGIC)?;
    let (&len, rest) = rest.split_first()?;
    let id = rest.get(..usize::from(len))?;
    std::str::from_utf8(id).ok()
}

/// The key id and base64 body of a sealed text value; `None` for one that is not sealed.
pub fn sealed_text(stored: &str) -> Option<(&str, &str)> {
    stored.strip_prefix(TEXT_MAGIC)?.split_once(':')
}

/// The id of the key that sealed a text value; `None` for one that is not sealed.
pub fn sealed_text_id(stored: &str) -> Option<&str> {
    sealed_text(stored).map(|(id, _)| id)
}

/// Nonce, ciphertext and tag of `plain` under `key` at `place`.
fn seal_under(key: &Key, place: &Place<'_>, plain: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; NONCE];
    // The system's random source failing is not something a node can go on without.
    getrandom::fill(&mut nonce).expect("the system's random source");
    let mut out = Vec::with_capacity(NONCE + plain.len() + TAG);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(plain);
    let tag = key
        .cipher
        .encrypt_inout_detached(
            &Nonce::from(nonce),
            &place.aad(&key.id),
            (&mut out[NONCE..]).into(),
        )
        // Only a message longer than GCM's 64 GiB limit fails.
        .expect("a value under GCM's length limit");
    out.extend_from_slice(&tag);
    out
}

/// The plaintext of nonce, ciphertext and tag `body` sealed by `key` at `place`.
fn open_under(key: &Key, place: &Place<'_>, body: &[u8]) -> Result<Vec<u8>, OpenError> {
    if body.len() < NONCE + TAG {
        return Err(OpenError::Malformed);
    }
    let (nonce, rest) = body.split_at(NONCE);
    let (ciphertext, tag) = rest.split_at(rest.len() - TAG);
    let nonce = Nonce::try_from(nonce).map_err(|_| OpenError::Malformed)?;
    let tag = Tag::try_from(tag).map_err(|_| OpenError::Malformed)?;
    let mut plain = ciphertext.to_vec();
    key.cipher
        .decrypt_inout_detached(
            &nonce,
            &place.aad(&key.id),
            plain.as_mut_slice().into(),
            &tag,
        )
        .map_err(|_| OpenError::Forged(key.id.clone()))?;
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(ids: &[&str]) -> Keyring {
        let keys: Vec<(String, [u8; KEY_BYTES])> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| ((*id).to_owned(), [u8::try_from(i + 1).unwrap(); KEY_BYTES]))
            .collect();
        Keyring::new(&keys).unwrap()
    }

    fn place(key: &str, column: Column) -> Place<'_> {
        Place {
            scope: "stripe",
            key,
            column,
        }
    }

    #[test]
    fn a_sealed_value_opens_at_its_place_and_hides_its_plaintext() {
        let keys = ring(&["2026-12"]);
        let at = place("evt_1", Column::Payload);
        let sealed = keys.seal(&at, b"card ending 4242");
        assert!(sealed.starts_with(b"\0HG1\x072026-12"));
        assert!(!sealed.windows(4).any(|w| w == b"4242"));
        assert_eq!(&*keys.open(&at, &sealed).unwrap(), b"card ending 4242");
        // A fresh nonce each time: the same plaintext never seals the same twice.
        assert_ne!(keys.seal(&at, b"card ending 4242"), sealed);
    }

    #[test]
    fn a_value_moved_to_another_row_column_or_attempt_does_not_open() {
        let keys = ring(&["a"]);
        let sealed = keys.seal(&place("evt_1", Column::Payload), b"x");
        for elsewhere in [
            place("evt_2", Column::Payload),
            place("evt_1", Column::ResultBody),
            Place {
                scope: "github",
                key: "evt_1",
                column: Column::Payload,
            },
        ] {
            assert_eq!(
                keys.open(&elsewhere, &sealed),
                Err(OpenError::Forged("a".into()))
            );
        }
        let answer = keys.seal_text(&place("evt_1", Column::Answer(1)), "ok");
        assert!(keys
            .open_text(&place("evt_1", Column::Answer(2)), &answer)
            .is_err());
        assert_eq!(
            keys.open_text(&place("evt_1", Column::Answer(1)), &answer)
                .unwrap(),
            "ok"
        );
    }

    #[test]
    fn an_old_key_opens_a_missing_one_is_named_and_plaintext_reads_as_it_stands() {
        let old = ring(&["old"]);
        let at = place("evt_1", Column::RequestHeaders);
        let sealed = old.seal_text(&at, r#"{"x-a":"1"}"#);
        assert!(sealed.starts_with("~hg1:old:"));
        // `ring` gives "old" the key [1; 32]; the new key is another.
        let rotated = Keyring::new(&[
            ("new".into(), [9; KEY_BYTES]),
            ("old".into(), [1; KEY_BYTES]),
        ])
        .unwrap();
        assert_eq!(rotated.open_text(&at, &sealed).unwrap(), r#"{"x-a":"1"}"#);
        assert!(rotated.stale_text(&sealed));
        assert!(!rotated.stale_text(&rotated.seal_text(&at, "{}")));
        assert!(rotated.stale_text("{}"));
        let without = ring(&["new"]);
        assert_eq!(
            without.open_text(&at, &sealed),
            Err(OpenError::UnknownKey("old".into()))
        );
        assert_eq!(
            &*without.open(&at, b"{\"plain\":1}").unwrap(),
            b"{\"plain\":1}"
        );
        assert_eq!(without.open_text(&at, "plain").unwrap(), "plain");
    }

    #[test]
    fn a_cut_or_changed_value_is_an_error_never_garbage() {
        let keys = ring(&["k"]);
        let at = place("evt_1", Column::Payload);
        let mut sealed = keys.seal(&at, b"hello");
        assert_eq!(keys.open(&at, &sealed[..10]), Err(OpenError::Malformed));
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        assert_eq!(keys.open(&at, &sealed), Err(OpenError::Forged("k".into())));
        assert!(keys.open_text(&at, "~hg1:k:!!!").is_err());
    }

    #[test]
    fn keys_decode_from_base64_or_hex_and_a_short_one_is_refused() {
        let b64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let expected: [u8; 32] = std::array::from_fn(|i| u8::try_from(i).unwrap());
        assert_eq!(decode_key(b64).unwrap(), expected);
        assert_eq!(decode_key(b64.trim_end_matches('=')).unwrap(), expected);
        assert_eq!(decode_key(&hex::encode(expected)).unwrap(), expected);
        assert!(decode_key("c2hvcnQ=")
            .unwrap_err()
            .contains("holds 5 bytes"));
        assert!(decode_key("not a key!")
            .unwrap_err()
            .contains("neither base64"));
    }

    #[test]
    fn ids_must_be_plain_and_unique() {
        assert!(Keyring::new(&[]).is_err());
        assert!(Keyring::new(&[("a:b".into(), [0; KEY_BYTES])]).is_err());
        assert!(
            Keyring::new(&[("a".into(), [0; KEY_BYTES]), ("a".into(), [1; KEY_BYTES])]).is_err()
        );
    }

    #[test]
    fn the_keyed_fingerprint_names_its_key_and_depends_on_it() {
        let a = Keyring::new(&[("a".into(), [1; KEY_BYTES])]).unwrap();
        let b = Keyring::new(&[("a".into(), [2; KEY_BYTES])]).unwrap();
        let fa = a.fingerprint(b"{}");
        assert!(fa.starts_with("k:a:"));
        assert_eq!(fa.len(), "k:a:".len() + 64);
        assert_eq!(fa, a.fingerprint(b"{}"));
        assert_ne!(fa, b.fingerprint(b"{}"));
        assert_ne!(fa, a.fingerprint(b"{ }"));
    }
}
