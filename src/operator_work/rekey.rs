//! A rekey: every stored body not sealed by the sealing key — plaintext written before
//! encryption was on, or sealed by an older key — opened and sealed anew, a bounded page of
//! rows at a time, at a bounded rate, each write a compare-and-set on the one body
//! (`store/reseal.rs`). Live traffic writes under the sealing key meanwhile, so a body it
//! changed is left to it; two rekeys (two nodes, or a rerun after an interruption) only
//! find less to do. [`Rekey::run_once`] is one page (tests call it by hand); `hookgate store
//! rekey` and the admin API's job loop over it. With `check`, it only counts.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::seal::{sealed_id, sealed_text_id, Keyring, Place};
use crate::store::reseal::{RowKey, SealedBy, Stale, Stored, Table};
use crate::store::{Store, StoreError};

/// Rows a page reads unless asked otherwise.
pub const DEFAULT_BATCH: u32 = 500;
/// Rows a second a rekey reads unless asked otherwise.
pub const DEFAULT_RATE: f64 = 2000.0;

/// What a rekey has done so far.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RekeyProgress {
    /// The key everything is sealed anew under.
    pub sealing_key: String,
    /// Only counting (`--check`), sealing nothing.
    pub check: bool,
    /// The table being read (`webhook_events`, then `webhook_attempts`).
    pub table: &'static str,
    /// Rows read, in both tables.
    pub rows_read: u64,
    /// Bodies found not under the sealing key, by the key that sealed them (`plaintext`
    /// for those stored before encryption was on).
    pub stale: BTreeMap<String, u64>,
    /// Bodies sealed anew under the sealing key.
    pub resealed: u64,
    /// Bodies a delivery or a sweep changed between the read and the write: left as the
    /// newer write made them (sealed under the sealing key).
    pub changed_meanwhile: u64,
    /// Bodies that do not open (sealed by a key not configured, or changed): left as they
    /// are, and named in `last_unreadable`.
    pub unreadable: u64,
    /// The latest of those, as `provider/key: column: why`.
    pub last_unreadable: Option<String>,
    /// Both tables read to their end.
    pub done: bool,
}

/// A rekey over one store: where it is, and what it has done.
pub struct Rekey {
    store: Arc<dyn Store>,
    /// `None`: encryption is off, and this rekey only counts.
    keys: Option<Arc<Keyring>>,
    current: SealedBy,
    after: Option<RowKey>,
    progress: RekeyProgress,
}

impl Rekey {
    /// A rekey of `store` (which must seal: `[store.encryption]` has keys); with `check`, one
    /// that only counts (with encryption off too: then every sealed body is counted by the
    /// key that sealed it).
    pub fn new(store: Arc<dyn Store>, check: bool) -> Result<Self, String> {
        let keys = store.keyring().cloned();
        let current = match &keys {
            Some(keys) => SealedBy {
                bytes: keys.sealing_prefix(),
                text: keys.sealing_text_prefix(),
            },
            // Prefixes no sealed value has (a key id is never empty): every body is read.
            None if check => SealedBy {
                bytes: b"\0HG1\0".to_vec(),
                text: "~hg1::".into(),
            },
            None => return Err("encryption at rest is off: [store.encryption] has no keys".into()),
        };
        let progress = RekeyProgress {
            sealing_key: keys
                .as_ref()
                .map(|k| k.sealing_id().to_owned())
                .unwrap_or_default(),
            check,
            table: Table::Events.as_str(),
            ..RekeyProgress::default()
        };
        Ok(Self {
            store,
            keys,
            current,
            after: None,
            progress,
        })
    }

    /// What it has done so far.
    pub fn progress(&self) -> &RekeyProgress {
        &self.progress
    }

    fn table(&self) -> Table {
        if self.progress.table == Table::Events.as_str() {
            Table::Events
        } else {
            Table::Attempts
        }
    }

    /// Reads one page of at most `batch` rows and seals anew what it found; `false` once
    /// both tables are read to their end.
    pub async fn run_once(&mut self, batch: u32) -> Result<bool, StoreError> {
        if self.progress.done {
            return Ok(false);
        }
        let table = self.table();
        let resealer = self.store.resealer();
        let page = resealer
            .stale(table, self.after.as_ref(), batch.max(1), &self.current)
            .await?;
        self.progress.rows_read += page.read;
        for stale in &page.stale {
            self.one(stale).await?;
        }
        if page.read < u64::from(batch.max(1)) {
            self.after = None;
            match table {
                Table::Events => self.progress.table = Table::Attempts.as_str(),
                Table::Attempts => self.progress.done = true,
            }
        } else {
            self.after = page.last;
        }
        Ok(!self.progress.done)
    }

    async fn one(&mut self, stale: &Stale) -> Result<(), StoreError> {
        let sealer = match &stale.value {
            Stored::Bytes(b) => sealed_id(b),
            Stored::Text(t) => sealed_text_id(t),
        };
        *self
            .progress
            .stale
            .entry(sealer.unwrap_or("plaintext").to_owned())
            .or_default() += 1;
        let Some(keys) = self.keys.as_deref().filter(|_| !self.progress.check) else {
            return Ok(());
        };
        let place = Place {
            scope: &stale.row.provider,
            key: &stale.row.key,
            column: stale.column,
        };
        let opened = match &stale.value {
            Stored::Bytes(b) => keys
                .open(&place, b)
                .map(|plain| Stored::Bytes(keys.seal(&place, &plain))),
            Stored::Text(t) => keys
                .open_text(&place, t)
                .map(|plain: Cow<'_, str>| Stored::Text(keys.seal_text(&place, &plain))),
        };
        let new = match opened {
            Ok(new) => new,
            Err(why) => {
                self.progress.unreadable += 1;
                self.progress.last_unreadable = Some(format!(
                    "{}/{}: {}: {why}",
                    stale.row.provider,
                    stale.row.key,
                    crate::store::reseal::column_name(stale.column)
                ));
                return Ok(());
            }
        };
        let written = self
            .store
            .resealer()
            .reseal(&stale.row, stale.column, &stale.value, &new)
            .await?;
        if written {
            self.progress.resealed += 1;
        } else {
            self.progress.changed_meanwhile += 1;
        }
        Ok(())
    }

    /// Runs pages of `batch` rows until both tables are read, reading at most `rate` rows a
    /// second, until `stop` is set; `each` sees the progress after every page.
    pub async fn run(
        &mut self,
        batch: u32,
        rate: f64,
        stop: &AtomicBool,
        mut each: impl FnMut(&RekeyProgress),
    ) -> Result<(), StoreError> {
        let started = tokio::time::Instant::now();
        // Not a positive number: the default; at least a row a second; infinite: no wait.
        let rate = if rate > 0.0 {
            rate.max(1.0)
        } else {
            DEFAULT_RATE
        };
        while !stop.load(Ordering::Relaxed) && self.run_once(batch).await? {
            each(&self.progress);
            // The rows read so far, at `rate`, take this long: wait for the rest of it.
            #[allow(clippy::cast_precision_loss)]
            let due = Duration::from_secs_f64(self.progress.rows_read as f64 / rate);
            tokio::time::sleep_until(started + due).await;
        }
        each(&self.progress);
        Ok(())
    }
}

/// What the admin API shows of this node's rekey job.
#[derive(Debug, Clone, Serialize)]
pub struct RekeyStatus {
    /// Still running.
    pub running: bool,
    /// Rows a page reads.
    pub batch: u32,
    /// Rows a second, at most.
    pub rate: f64,
    /// What it has done.
    pub progress: RekeyProgress,
    /// Why it stopped early, if a store error stopped it.
    pub error: Option<String>,
}

/// This node's rekey job, started from the admin API: at most one at a time. Another node
/// may run its own beside it (each write is a compare-and-set).
#[derive(Default)]
pub struct RekeyJob {
    current: std::sync::Mutex<Option<Running>>,
}

struct Running {
    status: Arc<std::sync::Mutex<RekeyStatus>>,
    stop: Arc<AtomicBool>,
}

impl RekeyJob {
    /// Starts a rekey of `store` on this runtime; an error when one is running already or
    /// encryption is off.
    pub fn start(
        &self,
        store: Arc<dyn Store>,
        batch: u32,
        rate: f64,
        check: bool,
        log: slog::Logger,
    ) -> Result<RekeyStatus, String> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = current.as_ref() {
            let status = running.status.lock().unwrap_or_else(|e| e.into_inner());
            if status.running {
                return Err("a rekey is running on this node already".into());
            }
        }
        let mut rekey = Rekey::new(store, check)?;
        let status = Arc::new(std::sync::Mutex::new(RekeyStatus {
            running: true,
            batch,
            rate,
            progress: rekey.progress().clone(),
            error: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopping) = (Arc::clone(&status), Arc::clone(&stop));
        actix_rt::spawn(async move {
            slog::info!(log, "store.rekey_started"; "sealing_key" => &rekey.progress().sealing_key,
                "check" => check);
            let result = rekey
                .run(batch, rate, &stopping, |p| {
                    shared.lock().unwrap_or_else(|e| e.into_inner()).progress = p.clone();
                })
                .await;
            let mut status = shared.lock().unwrap_or_else(|e| e.into_inner());
            status.running = false;
            status.error = result.err().map(|e| e.to_string());
            let p = &status.progress;
            slog::info!(log, "store.rekey_ended"; "done" => p.done, "rows_read" => p.rows_read,
                "resealed" => p.resealed, "unreadable" => p.unreadable,
                "error" => status.error.as_deref());
        });
        let shown = status.lock().unwrap_or_else(|e| e.into_inner()).clone();
        *current = Some(Running { status, stop });
        Ok(shown)
    }

    /// The latest job's status; `None` when none was started.
    pub fn status(&self) -> Option<RekeyStatus> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current
            .as_ref()
            .map(|r| r.status.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Asks the running job to stop after its page; `false` when none runs.
    pub fn stop(&self) -> bool {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match current.as_ref() {
            Some(r) if r.status.lock().unwrap_or_else(|e| e.into_inner()).running => {
                r.stop.store(true, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }
}
