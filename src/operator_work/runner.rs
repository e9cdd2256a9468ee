//! The node's part in what operators do through the store: every `queue.poll_interval` it
//! reads which providers are paused (holding their deliveries on this node, within one
//! poll of the pause) and, when it runs no bulk replay, takes one that no node holds and
//! runs it through its shards. [`OperatorWork::run_once`] is one pass (tests call it by hand).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use slog::{warn, Logger};

use crate::canonical::Body;
use crate::claim::Path;
use crate::filter::Filter;
use crate::key::EventId;
use crate::metrics::Metrics;
use crate::operator_work::jobs::{self, ItemOutcome};
use crate::provider::Target;
use crate::shard::gate::Hold;
use crate::shard::{Dispatcher, Reply, RetryReason};
use crate::store::{Enqueued, QueueRow, Store, StoreError};

/// A node's part in operators' work.
pub struct OperatorWork {
    store: Arc<dyn Store>,
    dispatcher: Dispatcher,
    targets: HashMap<Arc<str>, Arc<Target>>,
    metrics: Arc<Metrics>,
    log: Logger,
    poll: Duration,
    /// How long this node holds a job between renewals: a replay may take its target's
    /// whole timeout.
    job_lease: Duration,
    running: tokio::sync::Mutex<()>,
    /// Passes begun and not ended (see [`OperatorWork::passes_in_flight`]).
    in_flight: AtomicUsize,
    /// Held while the pauses are read and applied: a read that began before a pause was
    /// written cannot apply its older picture after the pause's own refresh.
    pausing: tokio::sync::Mutex<()>,
}

impl OperatorWork {
    /// The operators' work of a node serving `targets` (every configured provider's).
    pub fn new(
        store: Arc<dyn Store>,
        dispatcher: Dispatcher,
        targets: HashMap<Arc<str>, Arc<Target>>,
        metrics: Arc<Metrics>,
        log: Logger,
        poll: Duration,
    ) -> Self {
        let longest = targets
            .values()
            .map(|t| t.timeout)
            .max()
            .unwrap_or_default();
        Self {
            store,
            dispatcher,
            targets,
            metrics,
            log,
            poll,
            job_lease: (longest * 2).max(Duration::from_secs(60)),
            running: tokio::sync::Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            pausing: tokio::sync::Mutex::new(()),
        }
    }

    /// Applies the paused providers and routes to this node's gate: a paused provider
    /// holds every route of it, a paused route (its scope, `provider.route`) only itself.
    pub async fn refresh_pauses(&self) -> Result<Vec<String>, StoreError> {
        let _one_at_a_time = self.pausing.lock().await;
        let paused = self.store.operator().paused().await?;
        let gate = self.dispatcher.gate();
        let mut lifted = false;
        for provider in self.targets.keys() {
            let held = paused
                .iter()
                .any(|p| **p == **provider || **p == *crate::provider::provider_of(provider));
            lifted |= gate.held(provider) && !held;
            gate.hold(provider, held);
            self.metrics.paused(provider, held);
        }
        if lifted {
            // Resumed on another node: this node's scheduler passes now, not at its poll
            // (a pass leaves a held scope to the resume).
            self.dispatcher.signals().arrived();
        }
        Ok(paused)
    }

    /// One pass: the pauses, then — unless a job already runs here — a job no node holds,
    /// run to its end. Answers whether a job ran.
    pub async fn run_once(&self) -> Result<bool, StoreError> {
        self.refresh_pauses().await?;
        self.run_job().await
    }

    /// Unless a job already runs here, takes a job no node holds and runs it to its end.
    /// Answers whether a job ran.
    async fn run_job(&self) -> Result<bool, StoreError> {
        let Ok(_guard) = self.running.try_lock() else {
            return Ok(false);
        };
        if self.dispatcher.draining() {
            return Ok(false);
        }
        let node = crate::node::name();
        let Some(job) = self
            .store
            .operator()
            .claim_job(&node, self.job_lease)
            .await?
        else {
            return Ok(false);
        };
        jobs::run(
            &*self.store,
            &job,
            &node,
            self.job_lease,
            |id| self.replay(id),
            |id, route| self.give(id, route),
        )
        .await?;
        Ok(true)
    }

    /// Replays one dead letter through its shard.
    async fn replay(&self, id: EventId) -> ItemOutcome {
        let Some(target) = self.targets.get(&id.provider) else {
            return ItemOutcome::Skipped("its provider is not configured here".into());
        };
        let provider = Arc::clone(&id.provider);
        let answer = self.dispatcher.replay(id.clone(), Arc::clone(target)).await;
        match answer.reply {
            Reply::Result(_) => ItemOutcome::Done,
            Reply::DeadLettered => ItemOutcome::Dead("the target refused it again".into()),
            Reply::NotReplayable => ItemOutcome::Skipped("no longer a dead letter".into()),
            Reply::RetryLater { reason, .. } if answer.path == Path::Replay => {
                ItemOutcome::Dead(reason.as_str().into())
            }
            // Refused before anything was reopened.
            Reply::RetryLater {
                reason: RetryReason::Overloaded | RetryReason::StoreBusy,
                ..
            } => ItemOutcome::Busy,
            Reply::RetryLater {
                reason: RetryReason::Paused,
                ..
            } => {
                let hold = self.dispatcher.gate().hold_of(&provider);
                let why = hold.map_or_else(|| "the provider is paused".into(), Hold::describe);
                ItemOutcome::Paused(why)
            }
            Reply::RetryLater {
                reason: RetryReason::StoreUnavailable,
                ..
            } => match self.store.operator().event(&id).await {
                // A payload that does not open (its key not configured) is this event's
                // error, not an outage to wait out.
                Err(e @ StoreError::Sealed(_)) => ItemOutcome::Error(e.to_string()),
                _ => ItemOutcome::Unavailable("the store did not answer".into()),
            },
            Reply::RetryLater {
                reason: RetryReason::ShuttingDown,
                ..
            } => ItemOutcome::Stopping,
            Reply::RetryLater { reason, .. } => ItemOutcome::Error(reason.as_str().into()),
            other => ItemOutcome::Error(format!("{other:?}")),
        }
    }

    /// Gives one event (a row of another route of its provider) to the route `route`: a
    /// queued row there, for the scheduler — if the route has none, the event's payload is
    /// kept and the route's filter accepts it (its body, and the headers kept with it). A
    /// store that does not answer is tried again (`Unavailable`); a node without the route
    /// gives the job back (`Elsewhere`).
    async fn give(&self, id: EventId, route: String) -> ItemOutcome {
        let provider = crate::key::provider_of(&id.provider);
        let scope: Arc<str> = if route == crate::key::MAIN_ROUTE {
            provider.into()
        } else {
            format!("{provider}.{route}").into()
        };
        let Some(target) = self.targets.get(&scope) else {
            return ItemOutcome::Elsewhere(format!("no route {route} is configured on this node"));
        };
        let record = match self.store.operator().event(&id).await {
            Ok(Some(record)) => record,
            Ok(None) => return ItemOutcome::Skipped("no longer stored".into()),
            Err(e @ StoreError::Sealed(_)) => return ItemOutcome::Error(e.to_string()),
            Err(e) => return ItemOutcome::Unavailable(e.to_string()),
        };
        let Some(payload) = record.payload else {
            return ItemOutcome::Skipped("its payload was not kept".into());
        };
        if let Some(filter) = &target.filter {
            if let Err(why) = takes(filter, record.request_headers.as_deref(), &payload) {
                return ItemOutcome::Skipped(format!("route {route}: {why}"));
            }
        }
        let row = QueueRow {
            id: EventId::new(scope, Arc::clone(&id.key)),
            fingerprint: record.fingerprint,
            payload: payload.into(),
            content_type: record.content_type,
            headers: record.request_headers,
            keep_payload: target.keep_payload,
            start: None,
        };
        match self.store.enqueue(&row).await {
            Ok(Enqueued::Inserted) => {
                self.dispatcher.signals().arrived();
                ItemOutcome::Queued
            }
            Ok(_) => ItemOutcome::Skipped(format!("route {route} has it already")),
            Err(e) => ItemOutcome::Unavailable(e.to_string()),
        }
    }

    /// Passes begun and not ended: one reading the pauses, and at most one running a job.
    pub fn passes_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Reads the pauses every `queue.poll_interval` until the task is dropped, one read at a
    /// time (a read that waits on a stalled store delays the next, never piles them up),
    /// and starts a job pass beside them whenever none runs.
    pub async fn run_forever(self: Arc<Self>) {
        loop {
            let refreshed = self.counted(self.refresh_pauses()).await;
            if let Err(e) = refreshed {
                warn!(self.log, "operator_work.failed"; "error" => %e);
            }
            // A job runs beside the passes, so pauses keep being read while it runs.
            if self.running.try_lock().is_ok() {
                let operator_work = Arc::clone(&self);
                actix_rt::spawn(async move {
                    if let Err(e) = operator_work.counted(operator_work.run_job()).await {
                        warn!(operator_work.log, "operator_work.failed"; "error" => %e);
                    }
                });
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// Runs `pass`, counted in [`OperatorWork::passes_in_flight`] while it runs.
    async fn counted<T>(&self, pass: impl std::future::Future<Output = T>) -> T {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let ended = pass.await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        ended
    }
}

/// Whether `filter` takes a stored event: its payload, and the request headers kept with
/// it. A header the filter reads that was not kept (an event stored before its provider
/// kept the headers its routes' filters read) decides nothing: the event is not taken,
/// and the error says why.
fn takes(filter: &Filter, kept: Option<&str>, payload: &[u8]) -> Result<(), String> {
    let headers = header_map(kept);
    if let Some(missing) = filter.headers().find(|h| !headers.contains_key(*h)) {
        return Err(format!(
            "its filter reads {missing}, which was not kept with the event"
        ));
    }
    if filter.accepts(&headers, &Body::new(payload)) {
        Ok(())
    } else {
        Err("its filter does not take it".into())
    }
}

/// The request headers kept with a row (a JSON object's text), as a request's.
fn header_map(kept: Option<&str>) -> HeaderMap {
    let mut map = HeaderMap::new();
    let object = kept
        .and_then(|text| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text).ok()
        })
        .unwrap_or_default();
    for (name, value) in object {
        let (Ok(name), Some(Ok(value))) = (
            HeaderName::from_bytes(name.as_bytes()),
            value.as_str().map(HeaderValue::from_str),
        ) else {
            continue;
        };
        map.insert(name, value);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Condition;

    fn on_header(name: &str, value: &str) -> Filter {
        Filter {
            all: vec![Condition {
                header: Some(name.into()),
                equals: Some(crate::filter::Scalar::Str(value.into())),
                ..Condition::default()
            }],
        }
    }

    #[test]
    fn a_stored_event_is_taken_by_its_kept_headers_and_never_by_a_header_not_kept() {
        let filter = on_header("X-GitHub-Event", "push");
        let kept = Some(r#"{"x-github-event":"push","content-type":"application/json"}"#);
        assert_eq!(takes(&filter, kept, b"{}"), Ok(()));
        let other = Some(r#"{"x-github-event":"issues"}"#);
        assert_eq!(
            takes(&filter, other, b"{}"),
            Err("its filter does not take it".into())
        );
        let not_kept = takes(&filter, Some(r#"{"content-type":"text/plain"}"#), b"{}");
        assert!(not_kept.unwrap_err().contains("not kept"));
        assert!(takes(&filter, None, b"{}").is_err());
    }
}
