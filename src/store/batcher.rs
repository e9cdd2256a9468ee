//! Group commit for a networked store: concurrent calls of one operation coalesce into
//! batches, each run as one statement (one round trip, one commit) for all of them.
//!
//! A batch starts as soon as a slot is free; while every slot is busy, new calls queue and
//! leave together in the next batch. So a lone request never waits for company, and under
//! load the batch size grows by itself until the store keeps up. Several batchers may share
//! their slots; a batcher takes a slot only once it has a call to run, so an idle one never
//! holds a slot the others need.
//!
//! A caller waits at most the statement deadline, queueing included; a call whose caller
//! has given up before its batch leaves is dropped, not run. With a queue bound, a call
//! still waiting for its batch when the bound passes is withdrawn and answered `Busy`:
//! that answer means the call was never run.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::{millis, within, StoreError};

/// Calls waiting for a batch, at most; beyond it callers wait to enqueue (backpressure).
const QUEUE: usize = 8192;

/// A queued call's state. The batching task runs a call only if it moves it from
/// `QUEUED` to `TAKEN`; a caller past the queue bound answers `Busy` only if it moves it
/// to `WITHDRAWN`. One of the two wins.
const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

struct Call<Req, Resp> {
    request: Req,
    reply: Reply<Resp>,
    state: Arc<AtomicU8>,
}

impl<Req, Resp> Call<Req, Resp> {
    /// Takes the call for a batch, unless its caller gave up or withdrew it.
    fn take(&self) -> bool {
        !self.reply.is_closed()
            && self
                .state
                .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

/// The caller's side of one batched operation.
pub(crate) struct Batcher<Req, Resp> {
    calls: mpsc::Sender<Call<Req, Resp>>,
    deadline: Duration,
    queue_bound: Option<Duration>,
}

impl<Req: Send + 'static, Resp: Send + 'static> Batcher<Req, Resp> {
    /// Starts the batching task: batches of at most `max_batch` calls, each run through
    /// `run` (which answers one result per request, in order) while holding one permit of
    /// `slots`. A caller waits at most `deadline` for its answer, and at most `queue_bound`
    /// (if any) for its batch to leave.
    pub(crate) fn start<F, Fut>(
        max_batch: usize,
        slots: Arc<Semaphore>,
        deadline: Duration,
        queue_bound: Option<Duration>,
        run: F,
    ) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<Resp, StoreError>>> + Send + 'static,
    {
        let (calls, mut queue) = mpsc::channel::<Call<Req, Resp>>(QUEUE);
        let run = Arc::new(run);
        tokio::spawn(async move {
            loop {
                let Some(first) = queue.recv().await else {
                    return;
                };
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match queue.try_recv() {
                        Ok(call) => batch.push(call),
                        Err(_) => break,
                    }
                }
                // Calls whose callers gave up or withdrew them while queued are not run.
                batch.retain(Call::take);
                if batch.is_empty() {
                    continue;
                }
                let (requests, replies): (Vec<Req>, Vec<Reply<Resp>>) =
                    batch.into_iter().map(|c| (c.request, c.reply)).unzip();
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
        Self {
            calls,
            deadline,
            queue_bound,
        }
    }

    /// Runs `request` in the next batch.
    pub(crate) async fn call(&self, request: Req) -> Result<Resp, StoreError> {
        let queued_at = Instant::now();
        within(self.deadline, async {
            let (reply, mut answer) = oneshot::channel();
            let state = Arc::new(AtomicU8::new(QUEUED));
            let call = Call {
                request,
                reply,
                state: Arc::clone(&state),
            };
            self.calls
                .send(call)
                .await
                .map_err(|_| StoreError::Unavailable("the store's batcher has stopped".into()))?;
            if let Some(bound) = self.queue_bound {
                if let Ok(answered) = tokio::time::timeout_at(queued_at + bound, &mut answer).await
                {
                    return answered.unwrap_or_else(|_| Err(dropped()));
                }
                let withdrawn =
                    state.compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire);
                if withdrawn.is_ok() {
                    return Err(StoreError::Busy(
                        format!("no batch took the call within {} ms", millis(bound)).into(),
                    ));
                }
            }
            answer.await.unwrap_or_else(|_| Err(dropped()))
        })
        .await
    }
}

fn dropped() -> StoreError {
    StoreError::Unavailable("a batch was dropped".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn one_slot() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(1))
    }

    #[tokio::test]
    async fn concurrent_calls_share_batches_and_each_gets_its_own_answer() {
        let batches = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&batches);
        let deadline = std::time::Duration::from_secs(60);
        let batcher = Arc::new(Batcher::start(
            64,
            one_slot(),
            deadline,
            None,
            move |xs: Vec<u32>| {
                seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    xs.into_iter().map(|x| Ok(x * 2)).collect()
                }
            },
        ));
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

    #[tokio::test]
    async fn a_call_still_queued_past_its_bound_is_answered_busy_and_never_run() {
        let ran = Arc::new(std::sync::Mutex::new(Vec::new()));
        let started = Arc::new(tokio::sync::Notify::new());
        let gate = Arc::new(Semaphore::new(0));
        let deadline = Duration::from_secs(60);
        let bound = Some(Duration::from_millis(50));
        let batcher = Arc::new(Batcher::start(64, one_slot(), deadline, bound, {
            let (ran, started, gate) = (Arc::clone(&ran), Arc::clone(&started), Arc::clone(&gate));
            move |xs: Vec<u32>| {
                let (ran, started, gate) =
                    (Arc::clone(&ran), Arc::clone(&started), Arc::clone(&gate));
                async move {
                    ran.lock().unwrap().extend(xs.iter().copied());
                    started.notify_one();
                    // The only slot stays busy until the test opens the gate.
                    let _ = gate.acquire().await.unwrap();
                    xs.into_iter().map(Ok).collect()
                }
            }
        }));
        let first = tokio::spawn({
            let b = Arc::clone(&batcher);
            async move { b.call(1).await }
        });
        started.notified().await;
        let second = batcher.call(2).await;
        assert!(matches!(second, Err(StoreError::Busy(_))), "{second:?}");
        gate.add_permits(10);
        assert_eq!(first.await.unwrap().unwrap(), 1);
        // A later call runs: the withdrawn one was dropped, not left in the queue.
        assert_eq!(batcher.call(3).await.unwrap(), 3);
        assert_eq!(*ran.lock().unwrap(), vec![1, 3]);
    }

    #[tokio::test]
    async fn batchers_sharing_a_slot_take_turns_and_an_idle_one_holds_none() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let started = Arc::new(tokio::sync::Notify::new());
        let gate = Arc::new(Semaphore::new(0));
        let slots = one_slot();
        let deadline = Duration::from_secs(60);
        let gated = Batcher::start(64, Arc::clone(&slots), deadline, None, {
            let (log, started, gate) = (Arc::clone(&log), Arc::clone(&started), Arc::clone(&gate));
            move |xs: Vec<u32>| {
                let (log, started, gate) =
                    (Arc::clone(&log), Arc::clone(&started), Arc::clone(&gate));
                async move {
                    log.lock().unwrap().push("gated starts");
                    started.notify_one();
                    let _ = gate.acquire().await.unwrap();
                    log.lock().unwrap().push("gated ends");
                    xs.into_iter().map(Ok).collect()
                }
            }
        });
        let other = Arc::new(Batcher::start(64, Arc::clone(&slots), deadline, None, {
            let log = Arc::clone(&log);
            move |xs: Vec<u32>| {
                log.lock().unwrap().push("other runs");
                std::future::ready(xs.into_iter().map(Ok).collect())
            }
        }));
        // The gated batcher is idle: the other one's call must not wait for it.
        let answer = tokio::time::timeout(Duration::from_secs(10), other.call(1)).await;
        assert_eq!(
            answer
                .expect("an idle batcher held the shared slot")
                .unwrap(),
            1
        );
        // While the gated batch runs, the other batcher's call waits for the slot.
        let gated_call = tokio::spawn(async move { gated.call(2).await });
        started.notified().await;
        let waiting = tokio::spawn({
            let other = Arc::clone(&other);
            async move { other.call(3).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        assert_eq!(gated_call.await.unwrap().unwrap(), 2);
        assert_eq!(waiting.await.unwrap().unwrap(), 3);
        assert_eq!(
            *log.lock().unwrap(),
            vec!["other runs", "gated starts", "gated ends", "other runs"]
        );
    }
}
