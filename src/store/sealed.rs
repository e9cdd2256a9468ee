//! Encryption at rest as a [`Store`] around either backend: every body a write carries —
//! payloads, cached answers, kept headers, history excerpts — is sealed for its row and
//! column (`crate::seal`) before the backend sees it, and every one a read brings back is
//! opened before its caller does. The backends store and compare only what they are given;
//! a value written before encryption was on reads as it stands. A value sealed by a key
//! that is not configured — or read with encryption off — is a [`StoreError::Sealed`] where
//! it is read, never bytes passed on (to a target, a sender or an operator). Every store is
//! opened through it; with encryption off, writes go through untouched.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;

use crate::claim::{ClaimResult, Path, RowState, Status, StoredResult};
use crate::key::EventId;
use crate::outcome::DeadReason;
use crate::seal::{Column, Keyring, OpenError, Place};

use super::api::Store;
use super::error::StoreError;
use super::operator::{HistoryPage, OperatorStore};
use super::page::PageCursor;
use super::types::{
    Enqueued, EventRecord, EventSummary, Failure, Fenced, History, Kept, MigrationWait, QueueDepth,
    QueueRow, Reopened, Routed, StoreFuture, Taken,
};

/// `inner` with its bodies sealed under `keyring` (`None`: stored as they come), and every
/// sealed body it reads opened (or refused).
pub fn sealed(inner: Arc<dyn Store>, keyring: Option<Arc<Keyring>>) -> Arc<dyn Store> {
    Arc::new(SealedStore {
        operator: SealedOperator {
            inner: Arc::clone(&inner),
            keys: keyring.clone(),
        },
        inner,
        keys: keyring,
    })
}

/// A store whose bodies are sealed at rest.
struct SealedStore {
    inner: Arc<dyn Store>,
    keys: Option<Arc<Keyring>>,
    operator: SealedOperator,
}

/// Its operators' side: whole rows and history pages opened.
struct SealedOperator {
    inner: Arc<dyn Store>,
    keys: Option<Arc<Keyring>>,
}

fn place(id: &EventId, column: Column) -> Place<'_> {
    Place {
        scope: &id.provider,
        key: &id.key,
        column,
    }
}

fn unreadable(id: &EventId, column: &str, e: &OpenError) -> StoreError {
    StoreError::Sealed(format!("{}/{}: {column}: {e}", id.provider, id.key).into())
}

/// Opening a row's bodies: with the keyring, or (encryption off) refusing sealed ones.
struct Open<'k>(Option<&'k Keyring>);

/// Sealing a row's bodies: the keyring.
struct Seal<'k>(&'k Keyring);

impl Seal<'_> {
    fn bytes(&self, id: &EventId, column: Column, plain: &[u8]) -> Vec<u8> {
        self.0.seal(&place(id, column), plain)
    }

    fn text(&self, id: &EventId, column: Column, plain: &str) -> String {
        self.0.seal_text(&place(id, column), plain)
    }

    fn kept(&self, id: &EventId, kept: &Kept) -> Kept {
        Kept {
            payload: Bytes::from(self.bytes(id, Column::Payload, &kept.payload)),
            content_type: kept.content_type.clone(),
            headers: kept
                .headers
                .as_deref()
                .map(|h| self.text(id, Column::RequestHeaders, h)),
        }
    }

    fn queue_row(&self, row: &QueueRow) -> QueueRow {
        QueueRow {
            payload: Bytes::from(self.bytes(&row.id, Column::Payload, &row.payload)),
            headers: row
                .headers
                .as_deref()
                .map(|h| self.text(&row.id, Column::RequestHeaders, h)),
            ..row.clone()
        }
    }

    fn history(&self, id: &EventId, attempt: i32, history: &History) -> History {
        History {
            answer: history
                .answer
                .as_deref()
                .map(|a| self.text(id, Column::Answer(attempt), a)),
            ..history.clone()
        }
    }
}

impl Open<'_> {
    fn open_bytes(
        &self,
        id: &EventId,
        column: Column,
        stored: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        let opened = match (self.0, crate::seal::sealed_id(&stored)) {
            (Some(keys), None) if keys.requires_sealed() => Err(OpenError::Plaintext),
            (_, None) => return Ok(stored),
            (None, Some(key)) if !crate::seal::valid_id(key) => return Ok(stored),
            (None, Some(key)) => Err(OpenError::UnknownKey(key.to_owned())),
            (Some(keys), Some(_)) => keys.open(&place(id, column), &stored).map(Cow::into_owned),
        };
        opened.map_err(|e| unreadable(id, column_name(column), &e))
    }

    fn open_text(
        &self,
        id: &EventId,
        column: Column,
        stored: String,
    ) -> Result<String, StoreError> {
        let opened = match (self.0, crate::seal::sealed_text_id(&stored)) {
            (Some(keys), None) if keys.requires_sealed() => Err(OpenError::Plaintext),
            (_, None) => return Ok(stored),
            (None, Some(key)) if !crate::seal::valid_id(key) => return Ok(stored),
            (None, Some(key)) => Err(OpenError::UnknownKey(key.to_owned())),
            (Some(keys), Some(_)) => keys
                .open_text(&place(id, column), &stored)
                .map(Cow::into_owned),
        };
        opened.map_err(|e| unreadable(id, column_name(column), &e))
    }

    fn open_payload(&self, id: &EventId, stored: Bytes) -> Result<Bytes, StoreError> {
        let required = self.0.is_some_and(Keyring::requires_sealed);
        if !required && crate::seal::sealed_id(&stored).is_none() {
            return Ok(stored);
        }
        self.open_bytes(id, Column::Payload, stored.to_vec())
            .map(Bytes::from)
    }

    fn result(&self, id: &EventId, result: &mut Option<StoredResult>) -> Result<(), StoreError> {
        if let Some(result) = result {
            result.body =
                self.open_bytes(id, Column::ResultBody, std::mem::take(&mut result.body))?;
        }
        Ok(())
    }

    fn row_state(&self, id: &EventId, row: &mut RowState) -> Result<(), StoreError> {
        self.result(id, &mut row.result)
    }

    fn record(&self, mut record: EventRecord) -> Result<EventRecord, StoreError> {
        let id = record.id.clone();
        self.result(&id, &mut record.result)?;
        if let Some(payload) = record.payload.take() {
            record.payload = Some(self.open_bytes(&id, Column::Payload, payload)?);
        }
        if let Some(headers) = record.request_headers.take() {
            record.request_headers = Some(self.open_text(&id, Column::RequestHeaders, headers)?);
        }
        Ok(record)
    }

    /// A taken row with its bodies opened — or, when one does not open, marked
    /// [`unreadable`](Taken::unreadable) with why, its stored payload kept as it is for the
    /// dead letter its attempt makes of it (the row was leased and counted by the take: it
    /// must be ended, not dropped and taken again forever).
    fn taken(&self, mut taken: Taken) -> Taken {
        let stored = taken.payload.clone();
        match self.open_taken(&mut taken) {
            Ok(()) => taken,
            Err(e) => Taken {
                payload: stored,
                trace_headers: None,
                unreadable: Some(e.to_string()),
                ..taken
            },
        }
    }

    fn open_taken(&self, taken: &mut Taken) -> Result<(), StoreError> {
        taken.payload = self.open_payload(&taken.id, std::mem::take(&mut taken.payload))?;
        if let Some(headers) = taken.trace_headers.take() {
            // The store hands sealed headers back whole (it cannot look inside them):
            // they are the trace's only when they hold a `traceparent`.
            let headers = self.open_text(&taken.id, Column::RequestHeaders, headers)?;
            taken.trace_headers = headers.contains("\"traceparent\"").then_some(headers);
        }
        Ok(())
    }
}

fn column_name(column: Column) -> &'static str {
    match column {
        Column::Payload => "payload",
        Column::ResultBody => "cached answer",
        Column::RequestHeaders => "kept headers",
        Column::Answer(_) => "history excerpt",
    }
}

impl SealedStore {
    fn open(&self) -> Open<'_> {
        Open(self.keys.as_deref())
    }
}

impl Store for SealedStore {
    fn migrate_reporting<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        self.inner.migrate_reporting(on_wait)
    }

    fn migrate_online<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        self.inner.migrate_online(on_wait)
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        self.inner.ping()
    }

    fn durability_risks(&self) -> StoreFuture<'_, Vec<(String, String)>> {
        self.inner.durability_risks()
    }

    fn claim_routed<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
        keep: Option<&'a Kept>,
        first: Path,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<ClaimResult>> {
        let sealed = self.keys.as_deref().map(|keys| {
            let seal = Seal(keys);
            let others: Vec<QueueRow> = others.iter().map(|r| seal.queue_row(r)).collect();
            (keep.map(|k| seal.kept(id, k)), others)
        });
        Box::pin(async move {
            let (keep, others) = match &sealed {
                Some((keep, others)) => (keep.as_ref(), others.as_slice()),
                None => (keep, others),
            };
            let mut routed = self
                .inner
                .claim_routed(id, fingerprint, lease, keep, first, others)
                .await?;
            if let ClaimResult::Existing(row) = &mut routed.answer {
                self.open().row_state(id, row)?;
            }
            Ok(routed)
        })
    }

    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
        history: Option<&'a History>,
    ) -> StoreFuture<'a, Fenced> {
        let Some(keys) = self.keys.as_deref() else {
            return self.inner.complete(id, attempts, result, history);
        };
        let seal = Seal(keys);
        let result = StoredResult {
            body: seal.bytes(id, Column::ResultBody, &result.body),
            ..result.clone()
        };
        let history = history.map(|h| seal.history(id, attempts, h));
        Box::pin(async move {
            self.inner
                .complete(id, attempts, &result, history.as_ref())
                .await
        })
    }

    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced> {
        let Some(keys) = self.keys.as_deref() else {
            return self.inner.fail(id, attempts, failure);
        };
        let seal = Seal(keys);
        if failure.dead == Some(DeadReason::Unreadable) {
            // Its payload is the stored value that did not open (`Taken::unreadable`):
            // written back as it is, so the dead letter opens once its key is back.
            let failure = Failure {
                headers: None,
                history: failure
                    .history
                    .as_ref()
                    .map(|h| seal.history(id, attempts, h)),
                ..failure.clone()
            };
            return Box::pin(async move { self.inner.fail(id, attempts, &failure).await });
        }
        let failure = Failure {
            payload: Bytes::from(seal.bytes(id, Column::Payload, &failure.payload)),
            headers: failure
                .headers
                .as_deref()
                .map(|h| seal.text(id, Column::RequestHeaders, h)),
            history: failure
                .history
                .as_ref()
                .map(|h| seal.history(id, attempts, h)),
            ..failure.clone()
        };
        Box::pin(async move { self.inner.fail(id, attempts, &failure).await })
    }

    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        Box::pin(async move {
            match self.inner.lookup(id).await? {
                Some(record) => self.open().record(record).map(Some),
                None => Ok(None),
            }
        })
    }

    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>> {
        Box::pin(async move {
            // A payload that does not open is refused before the row is reopened, so the
            // dead letter stays as it is (and replays once its key is back).
            if let Some(record) = self.inner.lookup(id).await? {
                if let Some(payload) = record.payload {
                    self.open().open_bytes(id, Column::Payload, payload)?;
                }
            }
            let Some(mut reopened) = self.inner.replay(id, lease).await? else {
                return Ok(None);
            };
            reopened.payload = self
                .open()
                .open_payload(id, std::mem::take(&mut reopened.payload))?;
            Ok(Some(reopened))
        })
    }

    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        self.inner.dead_letters(provider, after, limit)
    }

    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64> {
        self.inner.sweep(status, older_than, batch)
    }

    fn retain<'a>(
        &'a self,
        policy: &'a super::retain::Retention,
    ) -> StoreFuture<'a, super::retain::Retained> {
        self.inner.retain(policy)
    }

    fn table_sizes(&self) -> StoreFuture<'_, Vec<super::retain::TableSize>> {
        self.inner.table_sizes()
    }

    fn enqueue_routed<'a>(
        &'a self,
        item: &'a QueueRow,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<Enqueued>> {
        let sealed = self.keys.as_deref().map(|keys| {
            let seal = Seal(keys);
            let others: Vec<QueueRow> = others.iter().map(|r| seal.queue_row(r)).collect();
            (seal.queue_row(item), others)
        });
        Box::pin(async move {
            let (row, others) = match &sealed {
                Some((row, others)) => (row, others.as_slice()),
                None => (item, others),
            };
            let mut routed = self.inner.enqueue_routed(row, others).await?;
            if let Enqueued::Existing(state) | Enqueued::SyncRow(state) = &mut routed.answer {
                self.open().row_state(&item.id, state)?;
            }
            Ok(routed)
        })
    }

    fn take<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Taken>> {
        Box::pin(async move {
            Ok(self
                .inner
                .take(id, lease)
                .await?
                .map(|taken| self.open().taken(taken)))
        })
    }

    fn take_due<'a>(
        &'a self,
        provider: &'a str,
        limit: u32,
        lease: Duration,
        busy: &'a [Arc<str>],
    ) -> StoreFuture<'a, Vec<Taken>> {
        Box::pin(async move {
            let taken = self.inner.take_due(provider, limit, lease, busy).await?;
            let open = self.open();
            // A row whose body does not open never holds up the others: it is handed over
            // marked unreadable, and its attempt ends it as a dead letter.
            Ok(taken.into_iter().map(|t| open.taken(t)).collect())
        })
    }

    fn due<'a>(&'a self, provider: &'a str, limit: u32) -> StoreFuture<'a, Vec<EventId>> {
        self.inner.due(provider, limit)
    }

    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced> {
        self.inner.renew(id, attempts, lease)
    }

    fn abandon<'a>(
        &'a self,
        provider: &'a str,
        horizon: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        self.inner.abandon(provider, horizon, batch)
    }

    fn orphan<'a>(
        &'a self,
        known: &'a [String],
        grace: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64> {
        self.inner.orphan(known, grace, batch)
    }

    fn list<'a>(
        &'a self,
        provider: Option<&'a str>,
        status: Option<Status>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>> {
        self.inner.list(provider, status, limit)
    }

    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>> {
        self.inner.queue_depth()
    }

    fn operator(&self) -> &dyn OperatorStore {
        &self.operator
    }

    fn resealer(&self) -> &dyn super::reseal::Resealer {
        self.inner.resealer()
    }

    fn keyring(&self) -> Option<&Arc<Keyring>> {
        self.keys.as_ref()
    }
}

#[path = "sealed_operator.rs"]
mod sealed_operator;

impl SealedOperator {
    fn event_opened<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        Box::pin(async move {
            match self.inner.operator().event(id).await? {
                Some(record) => Open(self.keys.as_deref()).record(record).map(Some),
                None => Ok(None),
            }
        })
    }

    fn history_opened<'a>(
        &'a self,
        id: &'a EventId,
        before: Option<i32>,
        limit: u32,
    ) -> StoreFuture<'a, HistoryPage> {
        Box::pin(async move {
            let mut page = self.inner.operator().history(id, before, limit).await?;
            let open = Open(self.keys.as_deref());
            for attempt in &mut page.attempts {
                if let Some(answer) = attempt.answer.take() {
                    attempt.answer =
                        Some(open.open_text(id, Column::Answer(attempt.attempt), answer)?);
                }
            }
            Ok(page)
        })
    }
}
