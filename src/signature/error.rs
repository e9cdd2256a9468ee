//! Why a delivery's signature was refused, with the reason code the sender sees.

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
