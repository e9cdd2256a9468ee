//! The store's interface: the [`Store`] trait every backend implements. Its error kinds,
//! row types and shared helpers live in `types`; both are imported through `crate::store`.
//!
//! Each operation is one atomic statement (or one statement over a batch of rows). The
//! claim wins or reports; complete and fail are *fenced* by the attempt number the claim
//! returned, so a worker whose lease was retaken cannot overwrite the newer attempt's
//! outcome. Lease times always come from the store's own clock, never from a node's.

use std::sync::Arc;
use std::time::Duration;

use crate::claim::{ClaimResult, Path, Status, StoredResult};
use crate::key::EventId;

use super::page::PageCursor;
use super::types::{
    Enqueued, EventRecord, EventSummary, Failure, Fenced, History, Kept, MigrationWait, QueueDepth,
    QueueRow, Reopened, Routed, StoreFuture, Taken,
};

/// The operations hookgate needs from a database.
pub trait Store: Send + Sync + 'static {
    /// Creates or upgrades the schema; safe to run concurrently from several nodes. Never
    /// holds a claim behind a table lock it waits for for longer than a short lock timeout:
    /// it gives the lock request up and tries again, calling `on_wait` each time.
    fn migrate_reporting<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()>;

    /// The migrations that nodes of the previous release run beside (none that changes
    /// what their statements name), however long they take: an upgrade's online step,
    /// before the older nodes are stopped. A store whose every migration is such a step
    /// applies them all.
    fn migrate_online<'a>(
        &'a self,
        on_wait: &'a (dyn Fn(&MigrationWait) + Send + Sync),
    ) -> StoreFuture<'a, ()> {
        self.migrate_reporting(on_wait)
    }

    /// [`migrate_reporting`](Self::migrate_reporting) with the waits unreported.
    fn migrate(&self) -> StoreFuture<'_, ()> {
        self.migrate_reporting(&unreported)
    }

    /// Checks that the store answers (for `/readyz`); a success also ends any reconnect
    /// backoff.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Settings of the database under which an acknowledged commit could be lost
    /// (`synchronous_commit = off`, `fsync = off`), as `(setting, value)` pairs; empty
    /// when every commit is durable. A `done` row lost that way lets a redelivery run the
    /// target twice.
    fn durability_risks(&self) -> StoreFuture<'_, Vec<(String, String)>>;

    /// Wins the key for one attempt holding a lease of `lease`, or reports the row.
    ///
    /// Won when the key is new, `failed`, or `in_progress` with an expired lease — and the
    /// stored fingerprint (if any) equals `fingerprint`. `done` and `dead` are never won.
    /// With `keep`, a new row is written with the payload (its provider keeps payloads
    /// always), and keeps it once done.
    fn claim<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
        keep: Option<&'a Kept>,
    ) -> StoreFuture<'a, ClaimResult> {
        let routed = self.claim_routed(id, fingerprint, lease, keep, Path::FirstRun, &[]);
        Box::pin(async move { routed.await.map(|r| r.answer) })
    }

    /// [`claim`](Self::claim) of an event's main route (its record), for an event with
    /// other routes: when the claim writes the key's row (the event's first accepted
    /// delivery), `others` (the event's rows for the other routes that accept it) are
    /// written as [`enqueue`](Self::enqueue) writes a row, a key already known left as it
    /// stands, in the same commit. So every route of an event has its row before the main
    /// route's attempt starts, and a redelivery — won or not — writes none: it never
    /// changes which routes an event has. An other row with `start` is written taken for
    /// its first attempt (the caller runs it); the answer says which rows this call wrote.
    ///
    /// `first` is the path a new row is claimed under: `first_run`, or `filtered` when the
    /// main route's filter did not accept the event (the caller records it done without a
    /// delivery). A retake of a `filtered` row is won as `filtered` again; a won retry of
    /// any other row is a delivery to the main route, whatever `first` says.
    fn claim_routed<'a>(
        &'a self,
        id: &'a EventId,
        fingerprint: Option<&'a str>,
        lease: Duration,
        keep: Option<&'a Kept>,
        first: Path,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<ClaimResult>>;

    /// Marks attempt `attempts` done with `result`, if the row is still that attempt's,
    /// with its `history` row in the same statement.
    fn complete<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        result: &'a StoredResult,
        history: Option<&'a History>,
    ) -> StoreFuture<'a, Fenced>;

    /// Marks attempt `attempts` failed (or dead), if the row is still that attempt's.
    fn fail<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        failure: &'a Failure,
    ) -> StoreFuture<'a, Fenced>;

    /// The whole row, if the key is known (the claim path's read; operators read one event
    /// through [`OperatorStore::event`](super::operator::OperatorStore::event)).
    fn lookup<'a>(&'a self, id: &'a EventId) -> StoreFuture<'a, Option<EventRecord>>;

    /// Reopens a dead letter for one more attempt holding a lease of `lease` (path
    /// `replay`); `None` when the row is not dead (or unknown). Of concurrent replays of
    /// one key, exactly one reopens it.
    fn replay<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Reopened>>;

    /// Dead letters, newest first, optionally of one provider; with `after`, those that
    /// come after that cursor (the next page). A plain read of summaries: no payload.
    fn dead_letters<'a>(
        &'a self,
        provider: Option<&'a str>,
        after: Option<&'a PageCursor>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>>;

    /// Deletes at most `batch` rows of `status` not changed for `older_than`; answers how
    /// many. Callers loop while a full batch was deleted.
    fn sweep(&self, status: Status, older_than: Duration, batch: u32) -> StoreFuture<'_, u64>;

    /// One retention pass: removes done rows and dead letters past `policy`'s ages, within
    /// its budget; answers what it removed and how far past retention the oldest row it
    /// left is (zero when it keeps up).
    fn retain<'a>(
        &'a self,
        policy: &'a super::retain::Retention,
    ) -> StoreFuture<'a, super::retain::Retained>;

    /// The bytes each of the store's tables takes on disk (rows, indexes, out-of-line
    /// values). A plain read of the catalog (or the file's pages).
    fn table_sizes(&self) -> StoreFuture<'_, Vec<super::retain::TableSize>>;

    /// Queue mode: writes the event with its payload (status `queued`, due now) unless its
    /// key is known, in which case the row is reported as it stands. Answers only once the
    /// row is durable.
    fn enqueue<'a>(&'a self, item: &'a QueueRow) -> StoreFuture<'a, Enqueued> {
        let routed = self.enqueue_routed(item, &[]);
        Box::pin(async move { routed.await.map(|r| r.answer) })
    }

    /// [`enqueue`](Self::enqueue) for an event with other routes: when `item` is written
    /// (the key was new), `others` are written too, in the same commit (a key already
    /// known left as it stands).
    fn enqueue_routed<'a>(
        &'a self,
        item: &'a QueueRow,
        others: &'a [QueueRow],
    ) -> StoreFuture<'a, Routed<Enqueued>>;

    /// Queue mode: takes a due row for one attempt holding a lease of `lease` — the claim's
    /// rule on an existing row: `queued` (path `first_run`), `failed` whose backoff has
    /// passed (`retry_after_failure`), `in_progress` whose lease expired
    /// (`lease_retake`). `None` when the row is not due, or another taker has it.
    fn take<'a>(&'a self, id: &'a EventId, lease: Duration) -> StoreFuture<'a, Option<Taken>>;

    /// Queue mode: takes up to `limit` of `provider`'s due rows at once, longest due first,
    /// each for one attempt holding a lease of `lease` — [`take`](Self::take)'s rule and
    /// answer for every row, in one statement. Rows another node is taking are skipped, and
    /// so are the keys in `busy` (the caller's own attempts, whose leases may have run out
    /// while their outcome is still being written).
    fn take_due<'a>(
        &'a self,
        provider: &'a str,
        limit: u32,
        lease: Duration,
        busy: &'a [Arc<str>],
    ) -> StoreFuture<'a, Vec<Taken>>;

    /// Queue mode: keys of `provider` due for an attempt, longest due first, at most
    /// `limit`; rows another node is taking right now, and rows with a live lease (an
    /// attempt or a replay running), are skipped.
    fn due<'a>(&'a self, provider: &'a str, limit: u32) -> StoreFuture<'a, Vec<EventId>>;

    /// Queue mode: extends attempt `attempts`'s lease to `lease` from now, if the row is
    /// still that attempt's.
    fn renew<'a>(
        &'a self,
        id: &'a EventId,
        attempts: i32,
        lease: Duration,
    ) -> StoreFuture<'a, Fenced>;

    /// Sync mode: makes at most `batch` rows of `provider` that no delivery touched for
    /// `horizon` — `failed`, or `in_progress` with an expired lease — dead letters with
    /// reason `sender_gave_up`; answers how many.
    fn abandon<'a>(
        &'a self,
        provider: &'a str,
        horizon: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64>;

    /// Queue mode: makes at most `batch` due queue rows whose provider is none of `known`
    /// (it was removed from the config), untouched for `grace`, dead letters with reason
    /// `provider_removed`; answers how many. Rows with a live lease are left alone.
    fn orphan<'a>(
        &'a self,
        known: &'a [String],
        grace: Duration,
        batch: u32,
    ) -> StoreFuture<'a, u64>;

    /// Rows, least recently changed first, optionally of one provider and one status:
    /// summaries, no payload, from at most [`SCAN_BUDGET`](super::SCAN_BUDGET) rows read.
    fn list<'a>(
        &'a self,
        provider: Option<&'a str>,
        status: Option<Status>,
        limit: u32,
    ) -> StoreFuture<'a, Vec<EventSummary>>;

    /// Unfinished queue rows per provider, and the age of the oldest due one.
    fn queue_depth(&self) -> StoreFuture<'_, Vec<QueueDepth>>;

    /// What operators read and do: history, search, statistics, pauses, bulk replays.
    fn operator(&self) -> &dyn super::operator::OperatorStore;

    /// What a rekey reads and writes: the raw stored bodies, sealed or not.
    fn resealer(&self) -> &dyn super::reseal::Resealer;

    /// The keys this store seals with (`None`: bodies are stored as they come).
    fn keyring(&self) -> Option<&Arc<crate::seal::Keyring>> {
        None
    }
}

/// A migration's wait that nobody reports.
fn unreported(_: &MigrationWait) {}
