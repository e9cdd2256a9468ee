//! The sealed store's operators' side: whole rows and history pages opened
//! (`SealedOperator`'s own methods in `sealed.rs`), everything else passed through.

use std::time::Duration;

use super::super::operator::{
    HistoryPage, OperatorStore, ReplayItem, ReplayJob, SearchFilter, StatusCount,
};
use super::super::page::PageCursor;
use super::super::search::SearchPage;
use super::super::types::{EventRecord, StoreFuture};
use super::SealedOperator;
use crate::key::EventId;

impl OperatorStore for SealedOperator {
    fn event<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>> {
        self.event_opened(id)
    }

    fn history<'a>(
        &'a self,
        id: &'a EventId,
        before: Option<i32>,
        limit: u32,
    ) -> StoreFuture<'a, HistoryPage> {
        self.history_opened(id, before, limit)
    }

    fn search<'a>(
        &'a self,
        filter: &'a SearchFilter,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, SearchPage> {
        self.inner.operator().search(filter, after, limit)
    }

    fn count<'a>(&'a self, filter: &'a SearchFilter) -> StoreFuture<'a, u64> {
        self.inner.operator().count(filter)
    }

    fn status_counts(&self) -> StoreFuture<'_, Vec<StatusCount>> {
        self.inner.operator().status_counts()
    }

    fn set_paused<'a>(&'a self, provider: &'a str, paused: bool) -> StoreFuture<'a, ()> {
        self.inner.operator().set_paused(provider, paused)
    }

    fn paused(&self) -> StoreFuture<'_, Vec<String>> {
        self.inner.operator().paused()
    }

    fn retry_now<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, bool> {
        self.inner.operator().retry_now(id)
    }

    fn create_job<'a>(&'a self, filter: &'a str, total: u64, rate: f64) -> StoreFuture<'a, i64> {
        self.inner.operator().create_job(filter, total, rate)
    }

    fn job(&self, id: i64) -> StoreFuture<'_, Option<ReplayJob>> {
        self.inner.operator().job(id)
    }

    fn jobs(&self, limit: u32) -> StoreFuture<'_, Vec<ReplayJob>> {
        self.inner.operator().jobs(limit)
    }

    fn claim_job<'a>(
        &'a self,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>> {
        self.inner.operator().claim_job(node, lease)
    }

    fn claim_job_by_id<'a>(
        &'a self,
        id: i64,
        node: &'a str,
        lease: Duration,
    ) -> StoreFuture<'a, Option<ReplayJob>> {
        self.inner.operator().claim_job_by_id(id, node, lease)
    }

    fn renew_job<'a>(&'a self, id: i64, node: &'a str, lease: Duration) -> StoreFuture<'a, bool> {
        self.inner.operator().renew_job(id, node, lease)
    }

    fn begin_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, bool> {
        self.inner.operator().begin_item(id, event)
    }

    fn forget_item<'a>(&'a self, id: i64, event: &'a EventId) -> StoreFuture<'a, ()> {
        self.inner.operator().forget_item(id, event)
    }

    fn note_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        detail: Option<&'a str>,
    ) -> StoreFuture<'a, ()> {
        self.inner.operator().note_item(id, event, detail)
    }

    fn end_item<'a>(
        &'a self,
        id: i64,
        event: &'a EventId,
        outcome: &'a str,
        detail: Option<&'a str>,
        ok: bool,
    ) -> StoreFuture<'a, ()> {
        self.inner
            .operator()
            .end_item(id, event, outcome, detail, ok)
    }

    fn finish_job<'a>(&'a self, id: i64, node: &'a str) -> StoreFuture<'a, ()> {
        self.inner.operator().finish_job(id, node)
    }

    fn cancel_job(&self, id: i64) -> StoreFuture<'_, bool> {
        self.inner.operator().cancel_job(id)
    }

    fn job_items(&self, id: i64, limit: u32) -> StoreFuture<'_, Vec<ReplayItem>> {
        self.inner.operator().job_items(id, limit)
    }
}
