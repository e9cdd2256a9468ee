//! Keyset pagination of newest-first lists: a [`PageCursor`] names the last row a page
//! showed (its update time and key), and the next page starts strictly after it — stable
//! while rows are added, never an `OFFSET` scan. To a caller the cursor is opaque text.

use base64::Engine;

use crate::key::EventId;

/// Where a newest-first page ended: the last row's `updated_at` in whole microseconds
/// (ties broken by provider and key, in the same descending order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageCursor {
    /// The row's `updated_at`, Unix microseconds.
    pub updated_us: i64,
    /// The row's key.
    pub id: EventId,
}

impl PageCursor {
    /// The cursor after a row updated at `updated_at` (Unix seconds, as rows report it).
    pub fn after(updated_at: f64, id: &EventId) -> Self {
        Self {
            updated_us: micros(updated_at),
            id: id.clone(),
        }
    }

    /// The cursor as URL-safe text.
    pub fn encode(&self) -> String {
        let json = serde_json::json!([self.updated_us, &*self.id.provider, &*self.id.key]);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
    }

    /// A cursor from [`encode`](Self::encode)'s text; `None` for anything else.
    pub fn decode(text: &str) -> Option<Self> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .ok()?;
        let (updated_us, provider, key): (i64, String, String) =
            serde_json::from_slice(&bytes).ok()?;
        Some(Self {
            updated_us,
            id: EventId::new(provider, key),
        })
    }
}

/// Unix seconds as whole microseconds, rounded as the stores' SQL rounds them.
pub fn micros(seconds: f64) -> i64 {
    // Saturating: a time out of range cannot panic, it sorts first or last.
    (seconds * 1e6).round() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_survives_its_text_and_garbage_is_refused() {
        let cursor = PageCursor::after(1_764_633_600.123_456, &EventId::new("p", "k ,\"é"));
        assert_eq!(cursor.updated_us, 1_764_633_600_123_456);
        assert_eq!(PageCursor::decode(&cursor.encode()), Some(cursor));
        assert_eq!(PageCursor::decode("not a cursor"), None);
        assert_eq!(PageCursor::decode(""), None);
    }
}
