//! The embedded store's reader thread: owns a second, read-only connection and runs the
//! operators' plain reads on it (searches, counts, histories, listings), one at a time,
//! each in a snapshot of its own. In WAL mode a reader neither takes nor waits for the
//! write lock, so a slow read delays no claim, completion or lease renewal.
//!
//! Blocking SQLite calls never run on an async runtime thread. A read gets the writer's
//! deadline: past it the caller stops waiting and SQLite's progress handler stops the
//! statement, so the thread is free for the next read. Nothing here writes: the
//! connection is opened read-only.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::writer::{sql_error, Writer};
use crate::store::{millis, within, StoreError};

/// Virtual machine steps between two looks at the clock. A look costs tens of nanoseconds
/// and a thousand steps take from microseconds to a fraction of a millisecond, so the cost
/// is lost in the noise and a read stops soon after its deadline.
const STEPS: c_int = 1000;

/// When the read running now must stop, in nanoseconds after the thread's start;
/// `u64::MAX` while none runs (or its deadline is too far away to count).
type StopAt = Arc<AtomicU64>;

/// A read: runs on the reader's connection, until its deadline (`None`: none to count).
type Job = (Option<Instant>, Box<dyn FnOnce(&Connection) + Send>);

/// Test only: run once, first thing, by the next read, on its connection.
#[cfg(test)]
pub(crate) type ReadHook = Box<dyn FnOnce(&Connection) + Send>;

/// Sends plain reads to the reader thread — or to the writer, when the database has no
/// reader thread (see [`Reader::start`]).
#[derive(Clone)]
pub(crate) struct Reader {
    /// `None`: reads run on the writer.
    jobs: Option<mpsc::Sender<Job>>,
    writer: Writer,
    deadline: Duration,
    #[cfg(test)]
    hook: Arc<std::sync::Mutex<Option<ReadHook>>>,
}

impl Reader {
    /// Starts the thread owning `conn`, a read-only connection to the writer's database;
    /// it ends when every `Reader` is dropped. Without `conn` (no second connection can
    /// read beside the writer: an in-memory database, which a second connection would
    /// not even see, or one not in WAL mode, where a reader blocks the writer's commits)
    /// reads run on `writer`, in its batches, as writes do. A caller waits at most
    /// `deadline` for its answer.
    pub(crate) fn start(
        conn: Option<Connection>,
        writer: Writer,
        deadline: Duration,
    ) -> Result<Self, StoreError> {
        let jobs = conn.map(|conn| spawn(conn)).transpose()?;
        Ok(Self {
            jobs,
            writer,
            deadline,
            #[cfg(test)]
            hook: Arc::default(),
        })
    }

    /// Runs the read `f`, stopped at the deadline if it is still running then.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        #[cfg(test)]
        let f = {
            let hook = self.hook.lock().ok().and_then(|mut h| h.take());
            move |conn: &Connection| {
                if let Some(hook) = hook {
                    hook(conn);
                }
                f(conn)
            }
        };
        let Some(jobs) = &self.jobs else {
            return self.writer.call(f).await;
        };
        let deadline = self.deadline;
        let stop = Instant::now().checked_add(deadline);
        let (reply, answer) = oneshot::channel();
        let read = move |conn: &Connection| {
            // Not for a caller that gave up (its deadline passed while the read was queued).
            if reply.is_closed() {
                return;
            }
            let answer = f(conn);
            // Past its deadline a statement may have been interrupted: whatever it left is
            // answered as `within` answers, never as a query error.
            let late = stop.is_some_and(|stop| Instant::now() >= stop);
            let _ = reply.send(if late {
                Err(timed_out(deadline))
            } else {
                answer
            });
        };
        let stopped = || StoreError::Unavailable("the SQLite reader thread has stopped".into());
        jobs.send((stop, Box::new(read))).map_err(|_| stopped())?;
        within(self.deadline, async {
            answer.await.unwrap_or_else(|_| Err(stopped()))
        })
        .await
    }

    /// Test only: `hook` runs once, first thing in the next read, on its connection.
    #[cfg(test)]
    pub(crate) fn set_hook(&self, hook: ReadHook) {
        if let Ok(mut slot) = self.hook.lock() {
            *slot = Some(hook);
        }
    }
}

/// Starts the thread owning `conn`, with the progress handler that stops each read at its
/// deadline.
fn spawn(mut conn: Connection) -> Result<mpsc::Sender<Job>, StoreError> {
    let since = Instant::now();
    let stop_at: StopAt = Arc::new(AtomicU64::new(u64::MAX));
    let limit = Arc::clone(&stop_at);
    conn.progress_handler(
        STEPS,
        Some(move || nanos(since.elapsed()) >= limit.load(Ordering::Relaxed)),
    )
    .map_err(sql_error)?;
    let (jobs, queue) = mpsc::channel();
    thread::Builder::new()
        .name("hookgate-sqlite-read".into())
        .spawn(move || run(&conn, &queue, since, &stop_at))
        .map_err(|e| {
            StoreError::Unavailable(format!("starting the SQLite reader thread: {e}").into())
        })?;
    Ok(jobs)
}

/// Runs reads until every `Reader` is dropped, each under its deadline.
fn run(conn: &Connection, queue: &mpsc::Receiver<Job>, since: Instant, stop_at: &StopAt) {
    for (stop, read) in queue {
        let at = stop.map_or(u64::MAX, |stop| {
            nanos(stop.saturating_duration_since(since))
        });
        stop_at.store(at, Ordering::Relaxed);
        read(conn);
        stop_at.store(u64::MAX, Ordering::Relaxed);
    }
}

/// A read's answer past its deadline.
fn timed_out(deadline: Duration) -> StoreError {
    StoreError::TimedOut(format!("stopped at the {} ms deadline", millis(deadline)).into())
}

/// Whole nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_reader_connection_reads_run_on_the_writer_and_see_its_database() {
        let writer = Writer::start(
            Connection::open_in_memory().unwrap(),
            Duration::from_secs(5),
            None,
        )
        .unwrap();
        writer
            .call(|c| {
                c.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (7)")
                    .map_err(sql_error)
            })
            .await
            .unwrap();
        let reader = Reader::start(None, writer, Duration::from_secs(5)).unwrap();
        let x: i64 = reader
            .call(|c| {
                c.query_row("SELECT x FROM t", [], |r| r.get(0))
                    .map_err(sql_error)
            })
            .await
            .unwrap();
        assert_eq!(x, 7);
    }
}
