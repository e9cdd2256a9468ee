//! Group commit for a networked store: concurrent calls of one operation coalesce into
//! batches, each run as one statement (one round trip, one commit) for all of them.
//!
//! A batch starts as soon as a slot is free; while every slot is busy, new calls queue and
//! leave together in the next batch. So a lone request never waits for company, and under
//! load the batch size grows by itself until the store keeps up.
//!
//! A caller waits at most the statement deadline, queueing included; a call whose caller
//! has given up before its batch leaves is dropped, not run.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::api::{within, StoreError};

/// Calls waiting for a batch, at most; beyond it callers wait to enqueue (backpressure).
const QUEUE: usize = 8192;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// The caller's side of one batched operation.
pub(crate) struct Batcher<Req, Resp> {
    calls: mpsc::Sender<(Req, Reply<Resp>)>,
    deadline: std::time::Duration,
}

impl<Req: Send + 'static, Resp: Send + 'static> Batcher<Req, Resp> {
    /// Starts the batching task: at most `in_flight` batches of at most `max_batch` calls
    /// run at once, each through `run`, which answers one result per request, in order.
    /// A caller waits at most `deadline` for its answer.
    pub(crate) fn start<F, Fut>(
        max_batch: usize,
        in_flight: usize,
        deadline: std::time::Duration,
        run: F,
    ) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<Resp, StoreError>>> + Send + 'static,
    {
        let (calls, mut queue) = mpsc::channel::<(Req, Reply<Resp>)>(QUEUE);
        let slots = Arc::new(Semaphore::new(in_flight));
        let run = Arc::new(run);
        tokio::spawn(async move {
            loop {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let Some(first) = queue.recv().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match queue.try_recv() {
                        Ok(call) => batch.push(call),
                        Err(_) => break,
                    }
                }
                // Callers that gave up (their deadline passed while queued) are not run.
                batch.retain(|(_, reply)| !reply.is_closed());
                if batch.is_empty() {
                    continue;
                }
                let (requests, replies): (Vec<Req>, Vec<Reply<Resp>>) = batch.into_iter().unzip();
                let run = Arc::clone(&run);
                tokio::spawn(async move {
                    let results = run(requests).await;
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                    drop(slot);
                });
            }
        });
        Self { calls, deadline }
    }

    /// Runs `request` in the next batch.
    pub(crate) async fn call(&self, request: Req) -> Result<Resp, StoreError> {
        within(self.deadline, async {
            let (reply, answer) = oneshot::channel();
            self.calls
                .send((request, reply))
                .await
                .map_err(|_| StoreError::Unavailable("the store's batcher has stopped".into()))?;
            answer
                .await
                .unwrap_or_else(|_| Err(StoreError::Unavailable("a batch was dropped".into())))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_calls_share_batches_and_each_gets_its_own_answer() {
        let batches = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&batches);
        let deadline = std::time::Duration::from_secs(60);
        let batcher = Arc::new(Batcher::start(64, 1, deadline, move |xs: Vec<u32>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                xs.into_iter().map(|x| Ok(x * 2)).collect()
            }
        }));
        let calls = (0..100u32).map(|i| {
            let b = Arc::clone(&batcher);
            tokio::spawn(async move { b.call(i).await })
        });
        let answers: Vec<u32> = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        assert_eq!(answers, (0..100).map(|i| i * 2).collect::<Vec<_>>());
        assert!(
            batches.load(Ordering::SeqCst) < 100,
            "calls were not batched"
        );
    }
}
