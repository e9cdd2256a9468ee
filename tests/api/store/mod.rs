//! The store itself, on both backends: the conformance suite, encryption at rest, the model
//! check of the row protocol, the Postgres slot ring, the hot statements' plans, TLS to the database and to
//! targets, schema upgrades.
//!
//! * `conformance/` — the conformance suite: every rule of the row, against each backend.
//! * `encryption.rs` — encryption at rest: the raw tables, moved bodies, missing keys,
//!   keyed fingerprints, plaintext rows sealed by a rekey, rotation under live traffic.
//! * `fingerprint_kinds.rs` — payloads compared across a key rotation.
//! * `keepers.rs` — what the ring keeps: moved once to the keep slot in bounded steps, a
//!   failing emptying that leaves the ring turning.
//! * `model/` — the row protocol against a reference model, by seeded random sequences
//!   (`model_regressions.txt`: every sequence that once failed, replayed first).
//! * `plans.rs` — the hot statements' plans, whatever the table's size and statistics.
//! * `previous_release.rs` — the previous release's statements (`previous_release.sql`)
//!   replayed on the schema an upgrade's online steps leave.
//! * `ring.rs` — the Postgres slot ring: the promise across its boundaries, its upkeep.
//! * `tls.rs` — TLS to the database and to targets.
//! * `unreadable.rs` — rows whose bodies do not open: `unreadable` dead letters, once;
//!   `require_sealed` refusing plaintext.
//! * `upgrades.rs` — schema upgrades, beside live claims and the previous release's
//!   statements, and in place; the repair of an earlier build's online steps.

mod conformance;
mod encryption;
mod fingerprint_kinds;
mod keepers;
mod model;
mod plans;
mod previous_release;
mod ring;
mod slot_filters;
mod tls;
mod unreadable;
mod upgrades;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, RowState, Status, StoredResult};
use hookgate::config::RetentionConfig;
use hookgate::key::EventId;
use hookgate::metrics::Metrics;
use hookgate::retention::Sweeper;
use hookgate::store::{Retained, Retention, Store};

/// The retention the ring's and the upgrades' passes use: the defaults.
fn retention() -> RetentionConfig {
    RetentionConfig::default()
}

/// A turn of the ring, and a little more.
fn turn() -> Duration {
    retention().done / 4 + Duration::from_secs(60)
}

/// One retention pass of the store itself, as the sweeper asks it: what it did.
async fn retain(store: &Arc<dyn Store>) -> Retained {
    let config = retention();
    let policy = Retention {
        done: config.done,
        dead: config.dead,
        batch: config.sweep_batch,
        budget: config.sweep_interval / 2,
        interval: config.sweep_interval,
    };
    store.retain(&policy).await.expect("a retention pass")
}

/// One retention pass over `store`, as a node's sweeper runs it.
async fn pass(store: &Arc<dyn Store>) {
    Sweeper::new(
        Arc::clone(store),
        retention(),
        Arc::new(Metrics::new()),
        hookgate::logging::discard(),
    )
    .run_once()
    .await
    .expect("a retention pass");
}

/// Twenty claims of `id` at once while its lease (`attempts`) is live each see it in
/// progress; then the attempt's outcome lands and a claim sees the key done.
async fn claims_wait_for_the_lease_then_see_it_done(
    store: &Arc<dyn Store>,
    id: &EventId,
    attempts: i32,
    lease: Duration,
) {
    let claims = join_all((0..20).map(|_| store.claim(id, None, lease, None))).await;
    for claim in &claims {
        assert!(
            matches!(
                claim,
                Ok(ClaimResult::Existing(RowState {
                    status: Status::InProgress,
                    ..
                }))
            ),
            "a claim while the lease runs: {claim:?}"
        );
    }
    let done = StoredResult {
        status: 200,
        content_type: None,
        body: Vec::new(),
    };
    store.complete(id, attempts, &done, None).await.unwrap();
    let again = store.claim(id, None, lease, None).await.unwrap();
    assert!(
        matches!(
            again,
            ClaimResult::Existing(RowState {
                status: Status::Done,
                ..
            })
        ),
        "{again:?}"
    );
}
