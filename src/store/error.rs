//! Why a store operation failed ([`StoreError`]), with what lies under it ([`Cause`]): the
//! driver's own error kept whole, or hookgate's description. Outcomes (a duplicate, a held
//! key) are not errors.

use std::fmt;
use std::sync::Arc;

/// Why a store operation failed. Outcomes (a duplicate, a held key) are not errors.
///
/// Each variant keeps what lies under it ([`Cause`]), the driver's own error whole where
/// there is one: its message and causes are part of this error's message, and
/// [`StoreError::cause`] hands it out, so a caller can read, say, the SQLSTATE of a
/// `tokio_postgres::Error` (`cause().downcast_ref()`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached; nothing was changed.
    #[error("store unavailable: {0}")]
    Unavailable(Cause),
    /// No answer within `store.statement_timeout` (the statement is then cancelled on the
    /// server), or the connection closed with a statement on it, or a commit whose
    /// synchronous standby did not confirm it. Whether the statement took effect is
    /// unknown.
    #[error("store deadline passed: {0}")]
    TimedOut(Cause),
    /// Every pooled connection stayed busy for `store.pool_timeout`: this node is
    /// overloaded; the database is not at fault.
    #[error("no free store connection: {0}")]
    Busy(Cause),
    /// The database refused for now and the same statement may succeed soon:
    /// serialization failure, deadlock, read-only after a failover, a cancelled statement.
    #[error("store refused for now: {0}")]
    Transient(Cause),
    /// The database answered with an error.
    #[error("store query failed: {0}")]
    Query(Cause),
    /// A stored body that does not open: sealed by a key that is not configured, or
    /// changed, or moved from another row or column. Never passed on as it is.
    #[error("stored value cannot be opened: {0}")]
    Sealed(Cause),
    /// The database answered with something hookgate did not write.
    #[error("store returned unexpected data: {0}")]
    Corrupt(Cause),
}

/// What lies under a [`StoreError`]: the driver's error kept whole, or hookgate's own
/// description where hookgate noticed the trouble itself. Cheap to clone (a batch's one
/// failure is every caller's).
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync>);

/// A cause that is only a description.
#[derive(Debug)]
struct Described(String);

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Described {}

impl Cause {
    /// Keeps `error` whole.
    pub fn of(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }

    /// The kept error as `E`, if it is one.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }
}

impl From<String> for Cause {
    fn from(text: String) -> Self {
        Self(Arc::new(Described(text)))
    }
}

impl From<&str> for Cause {
    fn from(text: &str) -> Self {
        Self::from(text.to_owned())
    }
}

/// The error's message followed by each of its causes not already said
/// (`error performing TLS handshake: invalid peer certificate: UnknownIssuer`).
impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&chain(&*self.0))
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// The kept error's own causes are already in this one's message.
impl std::error::Error for Cause {}

/// An error's message and the messages of its sources, each once.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

impl StoreError {
    /// What lies under this error.
    pub fn cause(&self) -> &Cause {
        match self {
            StoreError::Unavailable(c)
            | StoreError::TimedOut(c)
            | StoreError::Busy(c)
            | StoreError::Transient(c)
            | StoreError::Query(c)
            | StoreError::Sealed(c)
            | StoreError::Corrupt(c) => c,
        }
    }

    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::TimedOut(_) => "timed_out",
            StoreError::Busy(_) => "busy",
            StoreError::Transient(_) => "transient",
            StoreError::Query(_) => "query",
            StoreError::Corrupt(_) => "corrupt",
            StoreError::Sealed(_) => "sealed",
        }
    }

    /// Whether the same operation may succeed if tried again soon (an outcome write after
    /// a delivery is retried within its lease on these).
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            StoreError::Query(_) | StoreError::Corrupt(_) | StoreError::Sealed(_)
        )
    }

    /// Whether the database itself seems gone (opens the reconnect backoff). A busy pool
    /// or a refused statement is not an outage.
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::TimedOut(_))
    }
}
