//! What wakes the queue scheduler before its poll interval: a worker freed up (while the
//! last pass found more due rows than workers), or an event was queued that no worker
//! could start at once. Between those it sleeps: a node with nothing queued does no work.

use std::time::Duration;

use tokio::sync::Notify;

/// The node's queue wake-ups (shared by the shards and the scheduler).
#[derive(Debug, Default)]
pub struct QueueSignals {
    freed: Notify,
    arrived: Notify,
}

impl QueueSignals {
    /// A worker became idle.
    pub fn freed(&self) {
        self.freed.notify_one();
    }

    /// An event was queued and is due now, with no worker to start it.
    pub fn arrived(&self) {
        self.arrived.notify_one();
    }

    /// Waits at most `poll` for an arrival — or, when the last pass was held back by the
    /// workers (`busy`), for a freed worker too. A signal given while nobody waited is kept
    /// for the next wait (one, however many were given).
    pub async fn wait(&self, busy: bool, poll: Duration) {
        let freed = async {
            if busy {
                self.freed.notified().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = freed => {}
            () = self.arrived.notified() => {}
            () = tokio::time::sleep(poll) => {}
        }
    }
}
