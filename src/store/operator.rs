//! What operators read and do through the store, beside the claim path: an event's
//! attempts, searches by filter, counts per provider and status, paused providers, and bulk
//! replay jobs. A job is owned by one node at a time under a lease and records one result
//! per event, so several nodes never run the same job, and an event is replayed once by it.

use std::time::Duration;

use serde::Serialize;

use super::page::PageCursor;
pub use super::search::SearchFilter;
use super::search::SearchPage;
use super::{AttemptRecord, EventRecord, StoreFuture};
use crate::key::EventId;

/// Rows of one provider in one status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusCount {
    /// The provider.
    pub provider: String,
    /// The status.
    pub status: String,
    /// How many rows.
    pub rows: u64,
}

/// History rows of one event shown when no page size is asked for (the console, the admin
/// API, `events history`): the latest few tell what the event is doing now.
pub const HISTORY_PAGE: u32 = 50;

/// The most history rows one page may ask for: a few hundred kilobytes of JSON at most (an
/// answer excerpt is at most 512 bytes), where an event a target throttled for days has
/// hundreds of thousands.
pub const MAX_HISTORY_PAGE: u32 = 500;

/// A page of one event's history: its latest attempts (before a given one), oldest first,
/// and how many it has in all.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPage {
    /// The attempts of the page, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// History rows the event has in all.
    pub total: u64,
    /// The attempt number the page before this one (older attempts) ends at, to ask for it
    /// as `before`; `None` when nothing older is left.
    pub before: Option<i32>,
}

impl HistoryPage {
    /// The page from `rows` read newest first, one more than `limit` asked for (the extra
    /// one says older attempts are left), of `total` in all.
    pub(crate) fn newest_first(mut rows: Vec<AttemptRecord>, total: i64, limit: u32) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let older = rows.len() > limit;
        rows.truncate(limit);
        rows.reverse();
        Self {
            before: rows.first().map(|a| a.attempt).filter(|_| older),
            attempts: rows,
            total: u64::try_from(total).unwrap_or(0),
        }
    }
}

/// A bulk replay job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayJob {
    /// Its number.
    pub id: i64,
    /// The filter it replays, as JSON.
    pub filter: String,
    /// `running`, `done` or `cancelled`.
    pub status: String,
    /// Events that matched when it was created.
    pub total: i64,
    /// Events replayed so far (done again, or retried).
    pub replayed: i64,
    /// Events whose replay failed (dead again) or could not run.
    pub failed: i64,
    /// Replays a second, at most.
    pub rate: f64,
    /// The node running it now.
    pub owner: Option<String>,
    /// Created and last changed, Unix seconds (store clock).
    pub created_at: f64,
    /// See `created_at`.
    pub updated_at: f64,
}

/// What a job did with one event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayItem {
    /// The event's provider.
    pub provider: String,
    /// Its key.
    pub key: String,
    /// `running`, `done`, `dead`, `retried`, `queued` (a job to a route), `skipped` or
    /// `error`.
    pub outcome: String,
    /// A word on it.
    pub detail: Option<String>,
    /// When, Unix seconds.
    pub at: f64,
}

/// The operators' side of a store.
pub trait OperatorStore: Send + Sync {
    /// One event's whole row — payload, cached answer and kept headers included — read as
    /// operators read (on their own connections), not as the claim path does.
    fn event<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>>;

    /// The latest `limit` history rows of one event numbered below `before` (all: `None`),
    /// oldest first, with how many it has in all: a target that asks for time every second
    /// for days leaves hundreds of thousands. Reads the page and the event's index entries
    /// to count, never the other rows.
    fn history<'a>(
        &'a self,
        id: &'a EventId,
        before: Option<i32>,
        limit: u32,
    ) -> StoreFuture<'a, HistoryPage>;

    /// Rows matching `filter`, last changed first (ties by provider, then key, descending),
    /// after `after`; at most `limit`, from at most [`SCAN_BUDGET`](super::SCAN_BUDGET) rows
    /// read (`store/search.rs`). A plain read of summaries: no payload.
    fn search<'a>(
        &'a self,
        filter: &'a SearchFilter,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, SearchPage>;

    /// How many rows match `filter` (a bulk replay's plan). A plain read.
    fn count<'a>(&'a self, filter: &'a SearchFilter) -> StoreFuture<'a, u64>;

    /// Rows per provider and status. A plain read over the whole table.
    fn status_counts(&self) -> StoreFuture<'_, Vec<StatusCount>>;

    /// Pauses (or resumes) `provider` for every node.
    fn set_paused<'a>(&'a self, provider: &'a str, paused: bool) -> StoreFuture<'a, ()>;

    /// The paused providers.
    fn paused(&self) -> StoreFuture<'_, Vec<String>>;

    /// Makes a `failed` queue row due now (a bulk replay of failed queue rows); `false`
    /// when the row is not one.
    fn retry_now<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, bool>;

    /// A new running job for `filter` (JSON) over `total` events at `rate` a second.
    fn create_job<'a>(&'a self, filter: &'a str, total: u64, rate: f64) -> StoreFuture<'a, i64>;

    /// One job.
    fn job(&self, id: i64) -> StoreFuture<'_, Option<ReplayJob>>;

    /// The newest jobs.
    fn jobs(&self, limit: u32) -> StoreFuture<'_, Vec<ReplayJob>>;

    /// Takes a running job nobody holds (or whose holder's lease ran out) for `node`.
    fn claim_job<'a>(
        &'a self,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>>;

    /// Takes job `id` for `node` on the terms of [`claim_job`](Self::claim_job): while it
    /// runs and nobody holds it (or its holder's lease ran out). `None` when it is not to
    /// be had (held, ended, or no such job); no other job is looked at.
    fn claim_job_by_id<'a>(
        &'a self,
        id: i64,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>>;

    /// Extends `node`'s hold on job `id`; `false` when it is no longer `node`'s running
    /// job (cancelled, or taken over).
    fn renew_job<'a>(&'a self, id: i64, node: &'a str, lease: Duration) -> StoreFuture<'a, bool>;

    /// Marks one event begun by job `id`; `false` when the job saw it before (it is never
    /// replayed twice by one job).
    fn begin_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, bool>;

    /// Forgets that job `id` began `event`, which it did not replay after all (nothing of
    /// the event changed): the job, or a node taking it over, begins it again later.
    fn forget_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, ()>;

    /// Notes why job `id`'s begun `event` waits (`None`: it no longer does), where its
    /// progress shows it; the item stays begun.
    fn note_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        detail: Option<&'a str>,
    ) -> StoreFuture<'a, ()>;

    /// Records what job `id` did with `event`, and counts it (`ok`: replayed).
    fn end_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        outcome: &'a str,
        detail: Option<&'a str>,
        ok: bool,
    ) -> StoreFuture<'a, ()>;

    /// Ends `node`'s running job `id` as `done`.
    fn finish_job<'a>(&'a self, id: i64, node: &'a str) -> StoreFuture<'a, ()>;

    /// Cancels a running job; `false` when it was not running.
    fn cancel_job(&self, id: i64) -> StoreFuture<'_, bool>;

    /// What job `id` did, the latest first, at most `limit`.
    fn job_items(&self, id: i64, limit: u32) -> StoreFuture<'_, Vec<ReplayItem>>;
}
