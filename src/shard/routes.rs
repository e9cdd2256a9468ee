//! An event's other routes, on their way with its claim (or queue row): each route's row is
//! written taken for its first attempt when the route's gate has room and this shard has
//! room for it — an idle worker, or a place among the taken rows waiting for one (as many
//! as it has workers) — and starts here as soon as the claim commits, with no scheduler pass
//! and no take; else it is written queued, for the scheduler. This is queue mode's own fast
//! path (`queue.rs`) and the scheduler's room rule (`taken.rs`), for rows of other scopes: a
//! route's first attempt runs on the shard that claimed the event; its retries are the
//! scheduler's, on the row's own shard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::actor::Shard;
use super::event::Event;
use super::slots::Pending;
use crate::claim::Path;
use crate::key::EventId;
use crate::provider::Target;
use crate::store::{QueueRow, Taken};

/// Where a route's row written taken starts.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// On this idle worker, kept for it.
    Worker(usize),
    /// On the next worker that frees up, among the taken rows waiting for one.
    Wait,
}

/// An event's other routes' rows as a claim writes them, with the slots kept for those
/// written taken.
pub(super) struct Others {
    /// The rows, in the event's route order.
    pub(super) rows: Vec<QueueRow>,
    /// Per row: where its first attempt starts (the row is written taken), if it does.
    workers: Vec<Option<Slot>>,
    /// Per row: its route's target.
    targets: Vec<Arc<Target>>,
}

impl Shard {
    /// The event's other routes' rows, each written taken (a gate slot and a worker, or a
    /// place among the rows waiting for one, kept for it) where the shard has room and its
    /// route is neither held nor at its limits.
    pub(super) fn reserve_others(&mut self, event: &Event) -> Others {
        let mut rows = other_rows(event);
        let mut workers = Vec::with_capacity(rows.len());
        for (row, route) in rows.iter_mut().zip(&event.others) {
            let scope = &route.scope;
            let worker = if self.busy.draining()
                || self.gate.stopped(scope)
                || !self.gate.try_acquire(scope)
            {
                None
            } else {
                match self.admission.take_idle() {
                    Some(worker) => Some(Slot::Worker(worker)),
                    None if self.admission.room() > self.waiting_others => {
                        self.waiting_others += 1;
                        Some(Slot::Wait)
                    }
                    None => {
                        self.gate.release(scope);
                        None
                    }
                }
            };
            if worker.is_some() {
                row.start = Some(self.settings.lease);
            }
            workers.push(worker);
        }
        Others {
            rows,
            workers,
            targets: event.others.iter().map(|r| Arc::clone(&r.target)).collect(),
        }
    }

    /// The claim (or enqueue) was answered, `written` saying which rows it wrote: each row
    /// written taken starts on its kept worker; every other worker and gate slot is given
    /// back; rows written queued wake the scheduler.
    pub(super) fn start_others(
        &mut self,
        others: Others,
        written: &[bool],
        sent: Instant,
        ctx: &mut Context<Self>,
    ) {
        let mut queued = false;
        let rows = others
            .rows
            .into_iter()
            .zip(others.workers)
            .zip(others.targets);
        for (n, ((row, worker), target)) in rows.enumerate() {
            let written = written.get(n).copied().unwrap_or(false);
            if let Some(Slot::Wait) = worker {
                self.waiting_others -= 1;
            }
            match worker {
                Some(slot) if written => self.start_other(row, target, slot, sent, ctx),
                Some(slot) => {
                    self.gate.release(&row.id.provider);
                    if let Slot::Worker(worker) = slot {
                        self.free_worker(worker, ctx);
                    }
                }
                None => queued |= written,
            }
        }
        if queued {
            self.signals.arrived();
        }
    }

    /// A route's row written taken by this claim: its first attempt, on its slot.
    fn start_other(
        &mut self,
        row: QueueRow,
        target: Arc<Target>,
        slot: Slot,
        sent: Instant,
        ctx: &mut Context<Self>,
    ) {
        let taken = Taken {
            id: row.id.clone(),
            attempts: 1,
            tries: 1,
            age: Duration::ZERO,
            path: Path::FirstRun,
            payload: row.payload.clone(),
            content_type: row.content_type.clone(),
            fingerprint: row.fingerprint.clone(),
            trace_headers: row.headers.clone(),
            unreadable: None,
        };
        let event = self.taken_event(&taken, target);
        self.metrics.queue_taken(&event.id.provider);
        let attempt = self.queue_attempt(Arc::clone(&event), &taken, sent);
        self.log_won(&attempt);
        // A row this claim wrote is new: no attempt of its key runs anywhere.
        let token = self.in_flight.begin(&event, Some(1));
        let pending = Pending {
            attempt,
            token,
            gated: true,
        };
        match slot {
            Slot::Worker(worker) => self.run_pending(pending, worker, ctx),
            // A worker of this shard frees up soon (see `free_worker`); past its lease's
            // start it is released, due again, for the scheduler.
            Slot::Wait => self.admission.hold(pending),
        }
    }
}

/// The queue rows of the event's other routes (see [`Event::others`]).
fn other_rows(event: &Event) -> Vec<QueueRow> {
    if event.others.is_empty() {
        return Vec::new();
    }
    let headers = super::record::kept_headers(event);
    event
        .others
        .iter()
        .map(|route| QueueRow {
            id: EventId::new(Arc::clone(&route.scope), Arc::clone(&event.id.key)),
            fingerprint: event.fingerprint.clone(),
            payload: event.body.clone(),
            content_type: event.content_type.clone(),
            headers: headers.clone(),
            keep_payload: event.target.keep_payload,
            start: None,
        })
        .collect()
}
