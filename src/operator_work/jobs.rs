//! Bulk replays: a job replays every dead letter its filter matches (or makes every failed
//! queue row it matches due now), at a bounded rate, one event at a time through the one
//! attempt home — a node's shards, or the command line's replay. The job is held by one
//! node at a time under a lease it renews before every event, records what it did with each
//! event (an event begun once is never replayed again by the job, even by a node that
//! takes the job over after a crash), and stops at once when cancelled. An event whose
//! shard has no free worker, whose provider is paused (by an operator, or by its target's
//! `Retry-After`) or whose store did not answer waits and is tried again (the job renewing
//! its lease meanwhile; a pause is noted on the event's item, where the job's progress
//! shows it); one met while the node shuts down is given back, and the job left for its
//! lease to run out. It only looks at rows changed before it was created: a replay that
//! fails makes its row newer, so it is never picked up twice.
//!
//! A job *to a route* ([`ToRoute`]) gives the events its filter matches (done ones, by
//! default) to another route of their provider — one added since, say: each event whose
//! payload is kept and that the route's filter accepts gets a queued row on that route, for
//! the scheduler, unless the route has one already. It is how a route added later gets old
//! events (nothing else gives them to it). A store that does not answer is waited for, as
//! for a replay; a node that does not have the route gives the job back.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::claim::Status;
use crate::key::EventId;
use crate::store::operator::{OperatorStore, ReplayJob, SearchFilter};
use crate::store::{EventSummary, PageCursor, Store, StoreError};

/// Events a job reads at once.
const PAGE: u32 = 50;

/// First and longest pause before replaying an event again while every worker is busy.
const FIRST_WAIT: Duration = Duration::from_millis(50);
const MAX_WAIT: Duration = Duration::from_secs(1);

/// What replaying one event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemOutcome {
    /// Delivered: the row is done.
    Done,
    /// The target refused it again: the row is a dead letter again (with this error).
    Dead(String),
    /// A failed queue row, now due: the scheduler delivers it.
    Retried,
    /// Written queued on the job's route: the scheduler delivers it there.
    Queued,
    /// Nothing to do any more (the row is no longer a dead letter, or no longer failed).
    Skipped(String),
    /// It could not run now (the store did not answer, ...).
    Error(String),
    /// Not begun, nothing changed: every worker of its shard is busy. Tried again shortly.
    Busy,
    /// Not begun, nothing changed: its provider is paused (saying by what). Tried again
    /// until it is resumed.
    Paused(String),
    /// Not begun, nothing changed: the store did not answer (a passing outage or lock).
    /// Tried again while the job's lease can still be renewed.
    Unavailable(String),
    /// Not begun, nothing changed: the node is shutting down. The job stops here; it (and
    /// this event) is taken up again after its lease, by this node or another.
    Stopping,
    /// Not begun, nothing changed: this node cannot run it (a job to a route it does not
    /// have, in a rolling change of the config). The job stops here, as for `Stopping`,
    /// for a node that has the route to take up after its lease.
    Elsewhere(String),
}

impl ItemOutcome {
    /// The word recorded for it, whether it counts as replayed, and its detail.
    fn record(&self) -> (&'static str, bool, Option<&str>) {
        match self {
            ItemOutcome::Done => ("done", true, None),
            ItemOutcome::Dead(why) => ("dead", false, Some(why)),
            ItemOutcome::Retried => ("retried", true, None),
            ItemOutcome::Queued => ("queued", true, None),
            ItemOutcome::Skipped(why) => ("skipped", false, Some(why)),
            ItemOutcome::Error(why) => ("error", false, Some(why)),
            ItemOutcome::Busy => ("error", false, Some("every worker was busy")),
            ItemOutcome::Paused(why) | ItemOutcome::Unavailable(why) => ("error", false, Some(why)),
            ItemOutcome::Stopping => ("error", false, Some("the node was shutting down")),
            ItemOutcome::Elsewhere(why) => ("error", false, Some(why)),
        }
    }
}

/// A bulk replay's filter as operators give it: dead letters by default; `failed` means
/// failed queue rows (a sync row's sender redelivers it). `None` when it asks for another
/// status.
pub fn normalize(mut filter: SearchFilter) -> Option<SearchFilter> {
    match filter.status.unwrap_or(Status::Dead) {
        Status::Dead => filter.status = Some(Status::Dead),
        Status::Failed => {
            filter.status = Some(Status::Failed);
            filter.mode = Some("queue".into());
        }
        _ => return None,
    }
    Some(filter)
}

/// A job that gives the events `filter` matches to the route `to_route` of their provider
/// (as the job's text: a plain filter is a replay job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToRoute {
    /// The events given: a provider's (or one of its routes') rows.
    pub filter: SearchFilter,
    /// The route they are given to (`main` for the provider's target).
    pub to_route: String,
}

/// A job's filter as a job to a route reads it: done rows unless it names a status.
pub fn normalize_to_route(mut filter: SearchFilter) -> SearchFilter {
    filter.status.get_or_insert(Status::Done);
    filter
}

/// What a job does with each event it matches.
enum Spec {
    /// Replays dead letters, or makes failed queue rows due.
    Replay(SearchFilter),
    /// Gives each event to this route.
    ToRoute(SearchFilter, String),
}

impl Spec {
    /// The job's text, read; `None` when it is neither.
    fn read(text: &str) -> Option<Self> {
        if let Ok(to) = serde_json::from_str::<ToRoute>(text) {
            return Some(Spec::ToRoute(normalize_to_route(to.filter), to.to_route));
        }
        let filter = serde_json::from_str::<SearchFilter>(text).ok()?;
        normalize(filter).map(Spec::Replay)
    }
}

/// Runs job `job` as `node` until every matching event has been seen, the job is
/// cancelled, or another node took it over; `replay` replays one dead letter, `give` gives
/// one event to a route.
pub async fn run<F, Fut, G, GFut>(
    store: &dyn Store,
    job: &ReplayJob,
    node: &str,
    lease: Duration,
    replay: F,
    give: G,
) -> Result<(), StoreError>
where
    F: Fn(EventId) -> Fut,
    Fut: Future<Output = ItemOutcome>,
    G: Fn(EventId, String) -> GFut,
    GFut: Future<Output = ItemOutcome>,
{
    let operator = store.operator();
    let Some(spec) = Spec::read(&job.filter) else {
        operator.cancel_job(job.id).await?;
        return Ok(());
    };
    let (mut filter, to_route) = match spec {
        Spec::Replay(filter) => (filter, None),
        Spec::ToRoute(filter, route) => (filter, Some(route)),
    };
    filter.updated_before = Some(
        filter
            .updated_before
            .map_or(job.created_at, |t| t.min(job.created_at)),
    );
    let gap = Duration::from_secs_f64(1.0 / job.rate.clamp(0.01, 10_000.0));
    let mut after: Option<PageCursor> = None;
    loop {
        // A page may come back empty with a place to go on from: its search read its
        // budget of rows without a match (store/search.rs).
        let page = operator.search(&filter, after.as_ref(), PAGE).await?;
        for row in page.rows {
            if !operator.renew_job(job.id, node, lease).await? {
                return Ok(());
            }
            if !operator.begin_item(job.id, &row.id).await? {
                continue;
            }
            let outcome = match (&to_route, row.status) {
                (Some(route), _) => {
                    let give = || give(row.id.clone(), route.clone());
                    when_free(operator, job, node, lease, gap, &row, give).await
                }
                (None, Status::Dead) => {
                    let replay = || replay(row.id.clone());
                    when_free(operator, job, node, lease, gap, &row, replay).await
                }
                (None, Status::Failed) => operator.retry_now(&row.id).await.map(|retried| {
                    if retried {
                        ItemOutcome::Retried
                    } else {
                        ItemOutcome::Skipped("no longer matches".into())
                    }
                }),
                (None, _) => Ok(ItemOutcome::Skipped("no longer matches".into())),
            };
            // Nothing replayed: the item is given back (at best: if this fails too, the
            // event stays begun and the job skips it), for this job or a node taking it
            // over to begin again.
            let outcome = match outcome {
                Ok(ItemOutcome::Stopping | ItemOutcome::Elsewhere(_)) | Err(_) => {
                    let _ = operator.forget_item(job.id, &row.id).await;
                    return outcome.map(|_| ());
                }
                Ok(outcome) => outcome,
            };
            let (word, ok, detail) = outcome.record();
            operator.end_item(job.id, &row.id, word, detail, ok).await?;
            tokio::time::sleep(gap).await;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    operator.finish_job(job.id, node).await
}

/// Runs `attempt` on `row` (a dead letter's replay, or an event given to a route) once it
/// can start: while every worker of its shard is busy, its provider is paused or the store
/// does not answer, it waits and tries again, renewing the job's lease — a pause noted on
/// the item for the job's progress to show, until it ends; [`ItemOutcome::Stopping`] when
/// the job is no longer this node's.
async fn when_free<F, Fut>(
    operator: &dyn OperatorStore,
    job: &ReplayJob,
    node: &str,
    lease: Duration,
    gap: Duration,
    row: &EventSummary,
    attempt: F,
) -> Result<ItemOutcome, StoreError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ItemOutcome>,
{
    let mut pause = gap.max(FIRST_WAIT);
    let mut noted: Option<String> = None;
    loop {
        let outcome = attempt().await;
        let note = match &outcome {
            ItemOutcome::Paused(why) => Some(format!("waiting: {why}")),
            _ => None,
        };
        if note != noted {
            operator.note_item(job.id, &row.id, note.as_deref()).await?;
            noted = note;
        }
        match outcome {
            ItemOutcome::Busy | ItemOutcome::Paused(_) | ItemOutcome::Unavailable(_) => {}
            outcome => return Ok(outcome),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_WAIT);
        if !operator.renew_job(job.id, node, lease).await? {
            return Ok(ItemOutcome::Stopping);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_filter_is_dead_letters_or_failed_queue_rows_only() {
        let dead = normalize(SearchFilter::default()).unwrap();
        assert_eq!(dead.status, Some(Status::Dead));
        let failed = normalize(SearchFilter {
            status: Some(Status::Failed),
            ..SearchFilter::default()
        })
        .unwrap();
        assert_eq!(failed.mode.as_deref(), Some("queue"));
        let done = SearchFilter {
            status: Some(Status::Done),
            ..SearchFilter::default()
        };
        assert_eq!(normalize(done), None);
    }

    #[test]
    fn a_jobs_text_is_a_replay_or_a_job_to_a_route() {
        let to = ToRoute {
            filter: SearchFilter {
                provider: Some("stripe".into()),
                ..SearchFilter::default()
            },
            to_route: "crm".into(),
        };
        match Spec::read(&serde_json::to_string(&to).unwrap()) {
            Some(Spec::ToRoute(filter, route)) => {
                assert_eq!((filter.status, route.as_str()), (Some(Status::Done), "crm"));
            }
            _ => panic!("a job to a route"),
        }
        let replay = serde_json::to_string(&to.filter).unwrap();
        assert!(
            matches!(Spec::read(&replay), Some(Spec::Replay(f)) if f.status == Some(Status::Dead))
        );
        assert!(Spec::read(r#"{"filter":{},"to_route":"crm","extra":1}"#).is_none());
    }
}
