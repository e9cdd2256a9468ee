//! Running a sequence against a real store and comparing it with the model after every
//! step: the answers, every row, and at the end that no queue row is stranded; a failing
//! sequence shrunk to the smallest that still fails.

use std::time::Duration;

use actix_web::web::Bytes;
use hookgate::claim::{classify, ClaimResult, Mode, Path, Status, StoredResult};
use hookgate::key::EventId;
use hookgate::outcome::DeadReason;
use hookgate::store::{Enqueued, Failure, QueueRow, Store};

use crate::helpers::{Backend, TestDb};

use super::ops::{FailKind, Op};
use super::reference::{Answer, Model};
use super::{secs, BACKOFF, KEYS, LEASE, PROVIDER, RING_RETENTION, ROUTE, ROWS, THROTTLE, TICK};

/// The row `key` of the model: a key of the provider, or (from `KEYS.len()` on) of its
/// other route.
fn id(key: usize) -> EventId {
    match key.checked_sub(KEYS.len()) {
        None => EventId::new(PROVIDER, KEYS[key]),
        Some(key) => EventId::new(ROUTE, KEYS[key]),
    }
}

/// The model's row of a stored id (99: none of the model's).
fn row_of(id: &EventId) -> usize {
    let key = KEYS.iter().position(|x| **x == *id.key).unwrap_or(99);
    if *id.provider == *ROUTE {
        key + KEYS.len()
    } else {
        key
    }
}

/// The row of the other route a routed claim or enqueue of `key` writes.
fn route_row(key: usize, fp: Option<&str>) -> Vec<QueueRow> {
    vec![QueueRow {
        id: id(key + KEYS.len()),
        fingerprint: fp.map(String::from),
        payload: Bytes::from_static(b"{}"),
        content_type: Some("application/json".into()),
        headers: None,
        keep_payload: false,
        start: None,
    }]
}

/// Whether the store says it wrote the route's row exactly when the model would: the
/// claim was won (or the row written) and the route's row did not exist.
fn route_row_written(
    model: &Model,
    key: usize,
    others: &[QueueRow],
    won: bool,
    written: &[bool],
) -> Result<(), String> {
    let expected: Vec<bool> = others
        .iter()
        .map(|_| won && !model.rows.contains_key(&(key + KEYS.len())))
        .collect();
    if written != expected {
        return Err(format!(
            "the store says it wrote the route's row {written:?}, the model {expected:?}"
        ));
    }
    Ok(())
}

/// Runs `op` against the store; its answer in the model's terms.
async fn run(store: &dyn Store, model: &Model, op: &Op) -> Result<Answer, String> {
    let lease = secs(LEASE);
    let e = |e: hookgate::store::StoreError| e.to_string();
    Ok(match *op {
        Op::Claim {
            key,
            fp,
            routed,
            filtered,
            ..
        } => {
            let fp = fp.map(String::from);
            let others = if routed {
                route_row(key, fp.as_deref())
            } else {
                Vec::new()
            };
            let first = if filtered {
                Path::Filtered
            } else {
                Path::FirstRun
            };
            let routed = store
                .claim_routed(&id(key), fp.as_deref(), lease, None, first, &others)
                .await
                .map_err(e)?;
            let wrote = matches!(routed.answer, ClaimResult::Won { attempts: 1, .. });
            route_row_written(model, key, &others, wrote, &routed.written)?;
            match routed.answer {
                ClaimResult::Won { attempts, path } => Answer::Won(attempts, path),
                ClaimResult::Existing(row) => {
                    Answer::Existing(classify(&row, fp.as_deref()), row.attempts)
                }
            }
        }
        Op::Enqueue {
            key,
            fp,
            start,
            routed,
        } => {
            let start = start.is_some();
            let fp = fp.map(String::from);
            let others = if routed {
                route_row(key, fp.as_deref())
            } else {
                Vec::new()
            };
            let item = QueueRow {
                id: id(key),
                fingerprint: fp.clone(),
                payload: Bytes::from_static(b"{}"),
                content_type: Some("application/json".into()),
                headers: None,
                keep_payload: false,
                start: start.then(|| secs(LEASE)),
            };
            let routed = store.enqueue_routed(&item, &others).await.map_err(e)?;
            let inserted = routed.answer == Enqueued::Inserted;
            route_row_written(model, key, &others, inserted, &routed.written)?;
            match routed.answer {
                Enqueued::Inserted => Answer::Inserted,
                Enqueued::Existing(row) => {
                    Answer::Existing(classify(&row, fp.as_deref()), row.attempts)
                }
                Enqueued::SyncRow(row) => {
                    Answer::SyncRow(classify(&row, fp.as_deref()), row.attempts)
                }
            }
        }
        Op::Due => {
            let mut keys = store.due(PROVIDER, 100).await.map_err(e)?;
            keys.extend(store.due(ROUTE, 100).await.map_err(e)?);
            Answer::Due(keys.iter().map(row_of).collect())
        }
        Op::TakeDue => {
            let mut taken = store.take_due(PROVIDER, 100, lease, &[]).await.map_err(e)?;
            taken.extend(store.take_due(ROUTE, 100, lease, &[]).await.map_err(e)?);
            Answer::TakenMany(
                taken
                    .into_iter()
                    .map(|t| (row_of(&t.id), (t.attempts, t.path, t.tries)))
                    .collect(),
            )
        }
        Op::Take { key, .. } => Answer::Taken(
            store
                .take(&id(key), lease)
                .await
                .map_err(e)?
                .map(|t| (t.attempts, t.path, t.tries)),
        ),
        Op::Renew { holder } => match model.holders[holder] {
            Some((key, attempts)) => {
                Answer::Fenced(store.renew(&id(key), attempts, lease).await.map_err(e)?)
            }
            None => Answer::Nothing,
        },
        Op::Complete { holder, status } => match model.holders[holder] {
            Some((key, attempts)) => {
                let result = StoredResult {
                    status,
                    content_type: Some("text/plain".into()),
                    body: format!("answer {status}").into_bytes(),
                };
                Answer::Fenced(
                    store
                        .complete(&id(key), attempts, &result, None)
                        .await
                        .map_err(e)?,
                )
            }
            None => Answer::Nothing,
        },
        Op::Fail { holder, kind } => match model.holders[holder] {
            Some((key, attempts)) => {
                // The caller knows the event's mode: a queue event's failure says when it
                // is due again, a sync one's does not (its sender redelivers).
                let queue = model.rows.get(&key).is_some_and(|r| r.mode == Mode::Queue);
                let wait = if kind == FailKind::Throttle {
                    THROTTLE
                } else {
                    BACKOFF
                };
                let failure = Failure {
                    error: format!("injected {kind:?}"),
                    dead: (kind == FailKind::Dead).then_some(DeadReason::AttemptsExhausted),
                    payload: Bytes::from_static(b"{}"),
                    content_type: Some("application/json".into()),
                    headers: None,
                    retry_in: queue.then(|| secs(wait)),
                    uncounted: kind == FailKind::Throttle,
                    history: None,
                };
                Answer::Fenced(store.fail(&id(key), attempts, &failure).await.map_err(e)?)
            }
            None => Answer::Nothing,
        },
        Op::Replay { key, .. } => Answer::Taken(
            store
                .replay(&id(key), lease)
                .await
                .map_err(e)?
                .map(|r| (r.attempts, Path::Replay, 0)),
        ),
        Op::Abandon { horizon } => Answer::Count(
            store
                .abandon(PROVIDER, secs(horizon), 1000)
                .await
                .map_err(e)?,
        ),
        Op::Sweep { status, older } => {
            Answer::Count(store.sweep(status, secs(older), 1000).await.map_err(e)?)
        }
        Op::Crash { .. } | Op::Step { .. } => Answer::Nothing,
        Op::Turn => {
            let kept = store.retain(&RING_RETENTION).await.map_err(e)?;
            Answer::Count(kept.done + kept.dead)
        }
    })
}

/// Every row as the store has it, against the model: the invariants after a step.
async fn check_rows(store: &dyn Store, model: &Model, seen: &mut [i32]) -> Result<(), String> {
    for (key, seen) in seen.iter_mut().enumerate().take(ROWS) {
        let name = id(key).to_string();
        let stored = store.lookup(&id(key)).await.map_err(|e| e.to_string())?;
        let expected = model.rows.get(&key);
        let (stored, expected) = match (stored, expected) {
            (None, None) => {
                *seen = 0;
                continue;
            }
            (Some(s), Some(e)) => (s, e),
            (s, e) => {
                return Err(format!(
                    "{name}: the store has {:?}, the model {:?}",
                    s.map(|r| r.status),
                    e.map(|r| r.status)
                ))
            }
        };
        let mut found = Vec::new();
        let mut differ = |what: &str, store: String, model: String| {
            if store != model {
                found.push(format!("{what}: store {store}, model {model}"));
            }
        };
        differ(
            "status",
            stored.status.as_str().into(),
            expected.status.as_str().into(),
        );
        differ(
            "attempts",
            stored.attempts.to_string(),
            expected.attempts.to_string(),
        );
        differ("mode", stored.mode.clone(), expected.mode.as_str().into());
        differ(
            "fingerprint",
            format!("{:?}", stored.fingerprint),
            format!("{:?}", expected.fingerprint.map(String::from)),
        );
        differ(
            "result",
            format!("{:?}", stored.result.as_ref().map(|r| r.status)),
            format!("{:?}", expected.result),
        );
        differ(
            "payload kept",
            stored.payload.is_some().to_string(),
            expected.payload.to_string(),
        );
        differ(
            "dead_reason",
            format!("{:?}", stored.dead_reason),
            format!("{:?}", expected.dead_reason),
        );
        differ(
            "lease live",
            (stored.lease_left > Duration::ZERO).to_string(),
            expected.lease_live(model.now).to_string(),
        );
        if !found.is_empty() {
            return Err(format!("{name}: {}", found.join("; ")));
        }
        if stored.attempts < *seen {
            return Err(format!(
                "{name}: attempts went down, {} after {}",
                stored.attempts, *seen
            ));
        }
        *seen = stored.attempts;
        // At most one holder of a key has a live lease: the latest attempt.
        let live = model
            .holders
            .iter()
            .flatten()
            .filter(|(k, a)| *k == key && *a == stored.attempts)
            .count();
        if stored.status == Status::InProgress && live > 1 {
            return Err(format!("{name}: {live} holders of one live attempt"));
        }
    }
    Ok(())
}

/// Runs `ops` on a fresh database of `backend`; the first disagreement, with the step.
pub(super) async fn run_case(backend: Backend, ops: &[Op]) -> Result<(), String> {
    let db = TestDb::on(backend).await;
    let store = db.store().await;
    let mut model = Model::default();
    let mut seen = [0; ROWS];
    for (n, op) in ops.iter().enumerate() {
        if matches!(op, Op::Turn) && backend == Backend::Postgres {
            // A retention period and a turn have passed for the ring (not for the rows):
            // this pass seals the current slot and, its time being up, empties it.
            db.age_ring(RING_RETENTION.done + RING_RETENTION.done / 4 + secs(TICK))
                .await;
        }
        let actual = run(&*store, &model, op)
            .await
            .map_err(|e| format!("step {n} `{op}`: the store failed: {e}"))?;
        let expected = model.apply(op);
        if let Op::Step { by } = op {
            db.advance_clock(secs(*by)).await;
        }

        if actual != expected {
            return Err(format!(
                "step {n} `{op}`: the store answered {actual:?}, the model {expected:?}"
            ));
        }
        check_rows(&*store, &model, &mut seen)
            .await
            .map_err(|e| format!("after step {n} `{op}`: {e}"))?;
    }
    drain(&db, &*store, &mut model).await
}

/// With time moving and a holder completing everything it takes, every queue row ends
/// `done` or `dead`: nothing is stranded.
async fn drain(db: &TestDb, store: &dyn Store, model: &mut Model) -> Result<(), String> {
    for _ in 0..4 {
        let step = Op::Step { by: 400 * TICK };
        model.apply(&step);
        db.advance_clock(secs(400 * TICK)).await;
        let mut due = store.due(PROVIDER, 100).await.map_err(|e| e.to_string())?;
        due.extend(store.due(ROUTE, 100).await.map_err(|e| e.to_string())?);
        for key in due {
            let taken = store
                .take(&key, secs(LEASE))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("drain: {key} is due but cannot be taken"))?;
            let result = StoredResult {
                status: 200,
                content_type: None,
                body: Vec::new(),
            };
            store
                .complete(&key, taken.attempts, &result, None)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    for key in 0..ROWS {
        let name = id(key).to_string();
        let Some(row) = store.lookup(&id(key)).await.map_err(|e| e.to_string())? else {
            continue;
        };
        let finished = matches!(row.status, Status::Done | Status::Dead);
        if row.mode == "queue" && !finished {
            return Err(format!(
                "drain: queue row {name} is stranded {}",
                row.status.as_str()
            ));
        }
    }
    Ok(())
}

/// Removes steps from a failing `ops` while it still fails; the smallest found.
pub(super) async fn shrink(
    backend: Backend,
    mut ops: Vec<Op>,
    mut why: String,
) -> (Vec<Op>, String) {
    loop {
        let mut smaller = false;
        let mut i = 0;
        while i < ops.len() {
            let mut fewer = ops.clone();
            fewer.remove(i);
            match run_case(backend, &fewer).await {
                Err(e) => {
                    ops = fewer;
                    why = e;
                    smaller = true;
                }
                Ok(()) => i += 1,
            }
        }
        if !smaller {
            return (ops, why);
        }
    }
}
