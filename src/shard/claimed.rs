//! What a shard does when the store has answered a claim: a won claim starts its attempt
//! on the reserved worker; a row the claim did not win is answered as it stands (and a
//! done result cached); a store failure frees the worker and refuses, nothing claimed.
//! Every request that waited on the same key gets the answer the row implies.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::actor::{Claiming, Shard};
use super::answer::{log_mismatch, log_refusal, mismatch_with, Answer, Reply, RetryReason};
use super::attempt::{ceil_secs, Attempt};
use super::cache::CachedDone;
use super::event::Event;
use super::slots::Running;
use crate::claim::{classify, ClaimResult, Path, RowState};
use crate::deadline::after;
use crate::store::StoreError;

impl Shard {
    /// The store answered the claim: answer it and every request that waited on it.
    pub(super) fn answer_claim(
        &mut self,
        claiming: Claiming,
        result: Result<ClaimResult, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let Claiming {
            event,
            reply,
            token,
            worker,
            sent,
        } = claiming;
        match result {
            Ok(ClaimResult::Won { attempts, path }) => {
                self.log_claim(&event, path, Some(attempts));
                let waiters = self.in_flight.won(&event, token, attempts);
                self.answer_waiters_of_won(&event, attempts, waiters);
                let lease = self.settings.lease;
                let mut attempt = Attempt::held(event, attempts, path, after(sent, lease));
                if attempt.event.target.timeout >= lease {
                    // Only a queue-mode provider's target may take that long (a sync row
                    // redelivered after its provider moved to queue mode): the attempt
                    // renews its lease, as a queue one does, and its entry is trusted.
                    attempt = attempt.renewed(lease, attempts, Duration::MAX);
                    self.in_flight.renews(&attempt.event.id, token);
                }
                let running = Running {
                    attempt,
                    token,
                    worker,
                    gated: false,
                };
                self.start(running, reply, ctx);
            }
            Ok(ClaimResult::Existing(row)) => {
                let waiters = self.in_flight.forget(&event.id, token);
                self.free_worker(worker, ctx);
                for (event, reply) in std::iter::once((event, reply)).chain(waiters) {
                    let answer = self.answer_existing(&event, row.clone());
                    self.log_claim(&event, answer.path, answer.attempts);
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                let waiters = self.in_flight.forget(&event.id, token);
                self.free_worker(worker, ctx);
                self.metrics.store_error(e.kind());
                let reason = match e {
                    StoreError::Busy(_) => RetryReason::StoreBusy,
                    _ => RetryReason::StoreUnavailable,
                };
                let requests = std::iter::once((event, reply)).chain(waiters).collect();
                self.refuse(requests, reason, &e.to_string());
            }
        }
    }

    /// Requests that waited on a claim that was won: the key is now in progress (409), or
    /// they carry another payload (422).
    pub(super) fn answer_waiters_of_won(
        &self,
        event: &Event,
        attempts: i32,
        waiters: Vec<(Arc<Event>, oneshot::Sender<Answer>)>,
    ) {
        let retry_after = ceil_secs(self.settings.lease);
        for (waiter, waiter_reply) in waiters {
            let answer =
                mismatch_with(&self.log, &waiter, event, Some(attempts)).unwrap_or(Answer {
                    path: Path::InProgressElsewhere,
                    attempts: Some(attempts),
                    reply: Reply::Busy { retry_after },
                });
            self.log_claim(&waiter, answer.path, answer.attempts);
            let _ = waiter_reply.send(answer);
        }
    }

    /// The answer for a row the claim did not win; caches it when it is done.
    pub(super) fn answer_existing(&mut self, event: &Event, row: RowState) -> Answer {
        let path = classify(&row, event.fingerprint.as_deref());
        let attempts = Some(row.attempts);
        let reply = match path {
            Path::DuplicateDone => match row.result {
                Some(result) => {
                    let result = Arc::new(result);
                    self.done.insert(
                        event.id.clone(),
                        CachedDone {
                            attempts: row.attempts,
                            fingerprint: row.fingerprint,
                            result: Arc::clone(&result),
                        },
                    );
                    Reply::Result(result)
                }
                None => {
                    let answer = Answer {
                        path,
                        attempts,
                        reply: Reply::RetryLater {
                            retry_after: 1,
                            reason: RetryReason::ResultMissing,
                        },
                    };
                    let cause = "a done row without its result";
                    log_refusal(&self.log, &event.id, &answer, cause);
                    return answer;
                }
            },
            Path::DuplicateDead => Reply::DeadLettered,
            Path::PayloadMismatch => {
                log_mismatch(
                    &self.log,
                    &event.id,
                    event.fingerprint.as_deref(),
                    row.fingerprint.as_deref(),
                );
                Reply::Mismatch
            }
            _ => Reply::Busy {
                retry_after: ceil_secs(row.lease_left),
            },
        };
        Answer {
            path,
            attempts,
            reply,
        }
    }
}
