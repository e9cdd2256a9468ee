//! The embedded store's writer thread: owns the one SQLite connection and runs every job
//! sent to it, batched: all jobs waiting when it wakes run inside one `BEGIN IMMEDIATE …
//! COMMIT` (group commit), and each job's answer is released only after that commit.
//!
//! Blocking SQLite calls never run on an async runtime thread. A failed job does not spoil
//! its batch: each runs inside its own savepoint. But a savepoint that cannot be released
//! or rolled back leaves the transaction in a state nobody can vouch for: the whole batch
//! is rolled back and every job in it is told so. A job whose caller gave up (its deadline
//! passed while it was queued) is not run.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::store::api::{within, Cause, StoreError};

/// Jobs one transaction takes at most: bounds the time a batch holds the write lock.
const MAX_BATCH: usize = 256;

/// What a job does once its batch has committed (or failed to).
type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// What running a job left behind: its [`Finish`], and whether its savepoint bookkeeping
/// failed (the batch must then be rolled back whole).
struct Ran {
    finish: Finish,
    poisoned: bool,
}

/// A job: runs on the connection inside the batch's transaction (or is handed `None` when
/// it must not run: the transaction could not begin, or the batch is already poisoned).
type Job = Box<dyn FnOnce(Option<&Connection>) -> Ran + Send>;

/// Sends jobs to the writer thread.
#[derive(Clone)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Job>,
    deadline: Duration,
}

impl Writer {
    /// Starts the thread owning `conn`; it ends when every `Writer` is dropped. A caller
    /// waits at most `deadline` for its answer.
    pub(crate) fn start(conn: Connection, deadline: Duration) -> Result<Self, StoreError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("hookgate-sqlite".into())
            .spawn(move || run(conn, queue))
            .map_err(|e| {
                StoreError::Unavailable(format!("starting the SQLite thread: {e}").into())
            })?;
        Ok(Self { jobs, deadline })
    }

    /// Runs `f` in the next batch; answers once the batch committed.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, answer) = job(f);
        self.jobs
            .send(job)
            .map_err(|_| StoreError::Unavailable("the SQLite thread has stopped".into()))?;
        within(self.deadline, async {
            answer.await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(
                    "the SQLite thread has stopped".into(),
                ))
            })
        })
        .await
    }
}

/// `f` as a job, and where its answer arrives.
fn job<T, F>(f: F) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let job: Job = Box::new(move |conn| {
        if reply.is_closed() {
            return Ran {
                finish: Box::new(|_| {}),
                poisoned: false,
            };
        }
        let ran = conn.map(|conn| in_savepoint(conn, f));
        let poisoned = matches!(ran, Some(Err(_)));
        Ran {
            finish: Box::new(move |committed: Result<(), StoreError>| {
                // Not run (or poisoned) means the batch did not commit: `committed` is Err.
                let answer = committed.and_then(|()| match ran {
                    Some(Ok(result)) => result,
                    Some(Err(e)) => Err(e),
                    None => Err(StoreError::Query("job did not run".into())),
                });
                let _ = reply.send(answer);
            }),
            poisoned,
        }
    });
    (job, answer)
}

/// Runs `f` in its own savepoint. The outer `Err` means the savepoint itself could not be
/// released or rolled back; the inner result is the job's own.
fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<Result<T, StoreError>, StoreError> {
    conn.execute_batch("SAVEPOINT job").map_err(sql_error)?;
    let result = f(conn);
    let end = if result.is_ok() {
        "RELEASE job"
    } else {
        "ROLLBACK TO job; RELEASE job"
    };
    conn.execute_batch(end).map_err(sql_error)?;
    Ok(result)
}

fn run(conn: Connection, queue: mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        run_batch(&conn, batch);
    }
}

/// One transaction for `batch`: committed when every savepoint was kept in order, rolled
/// back whole (and every job told so) otherwise.
fn run_batch(conn: &Connection, batch: Vec<Job>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_error) {
        for job in batch {
            (job(None).finish)(Err(e.clone()));
        }
        return;
    }
    let mut poisoned = false;
    let mut finishers = Vec::with_capacity(batch.len());
    for job in batch {
        let ran = job(if poisoned { None } else { Some(conn) });
        poisoned |= ran.poisoned;
        finishers.push(ran.finish);
    }
    let committed = if poisoned {
        let _ = conn.execute_batch("ROLLBACK");
        Err(StoreError::Query(
            "a savepoint could not be ended; the whole batch was rolled back".into(),
        ))
    } else {
        let committed = conn.execute_batch("COMMIT").map_err(sql_error);
        if committed.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        committed
    };
    for finish in finishers {
        finish(committed.clone());
    }
}

/// Maps a SQLite error: a busy or locked database is `Unavailable` (retry later);
/// anything else is a `Query` error.
pub(crate) fn sql_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(Cause::of(e))
        }
        _ => StoreError::Query(Cause::of(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_error_keeps_the_drivers_error_whole() {
        let e = sql_error(rusqlite::Error::QueryReturnedNoRows);
        assert!(matches!(e, StoreError::Query(_)));
        let kept = e.cause().downcast_ref::<rusqlite::Error>();
        assert!(
            matches!(kept, Some(rusqlite::Error::QueryReturnedNoRows)),
            "{kept:?}"
        );
        assert!(e.to_string().contains("Query returned no rows"), "{e}");
    }

    fn count(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_savepoint_that_cannot_be_released_rolls_back_the_whole_batch_truthfully() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let insert = |x: i64| {
            move |c: &Connection| {
                c.execute("INSERT INTO t VALUES (?1)", [x])
                    .map_err(sql_error)
            }
        };
        let (a, answer_a) = job(insert(1));
        // Ends the savepoint behind the writer's back: its RELEASE then fails.
        let (evil, answer_evil) =
            job(|c: &Connection| c.execute_batch("RELEASE job").map_err(sql_error));
        let (b, answer_b) = job(insert(2));
        run_batch(&conn, vec![a, evil, b]);
        assert!(answer_a.blocking_recv().unwrap().is_err());
        assert!(answer_evil.blocking_recv().unwrap().is_err());
        assert!(answer_b.blocking_recv().unwrap().is_err());
        assert_eq!(count(&conn), 0, "nothing of the batch was committed");

        let (c, answer_c) = job(insert(3));
        run_batch(&conn, vec![c]);
        assert_eq!(answer_c.blocking_recv().unwrap().unwrap(), 1);
        assert_eq!(count(&conn), 1, "the next batch works");
    }

    #[test]
    fn a_job_whose_caller_gave_up_is_not_run() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let (a, answer) =
            job(|c: &Connection| c.execute("INSERT INTO t VALUES (1)", []).map_err(sql_error));
        drop(answer);
        run_batch(&conn, vec![a]);
        assert_eq!(count(&conn), 0);
    }
}
