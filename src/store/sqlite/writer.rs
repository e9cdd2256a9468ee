//! The embedded store's writer thread: owns the SQLite connection that writes and runs
//! every job sent to it, batched: all jobs waiting when it wakes run inside one
//! `BEGIN IMMEDIATE … COMMIT` (group commit), and each job's answer is released only after
//! that commit.
//!
//! Blocking SQLite calls never run on an async runtime thread. A failed job does not spoil
//! its batch: each runs inside its own savepoint. A savepoint that cannot be ended (the
//! job ended it itself, or a full disk, an I/O error or lack of memory made SQLite roll
//! back the whole transaction) poisons the batch: that job is answered with its own error,
//! the jobs already run in the lost transaction with a transient one, and the jobs not yet
//! run go into the next batch. A job whose caller gave up (its deadline passed while it was
//! queued) is not run.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::store::{within, Cause, StoreError};

/// Jobs one transaction takes at most: bounds the time a batch holds the write lock.
const MAX_BATCH: usize = 256;

/// What a job does once its batch has ended: `Ok` when it committed, else the error a job
/// whose own work succeeded is answered with (that work was lost).
type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// What running a job left behind: its [`Finish`], and whether its savepoint could not be
/// ended (the batch's transaction is then lost or cannot be vouched for: it is rolled back,
/// and no further job of the batch runs in it).
struct Ran {
    finish: Finish,
    poisoned: bool,
}

/// A job: runs on the connection inside the batch's transaction, or is handed `None` when
/// it must not run (the transaction could not begin) and only answers. A job left uncalled
/// keeps its caller waiting for a later batch.
type Job = Box<dyn FnOnce(Option<&Connection>) -> Ran + Send>;

/// Work the writer thread does between two batches, on its connection, outside any
/// transaction: after the first batch's callers have their answers.
pub(crate) type BetweenBatches = Box<dyn FnMut(&Connection) + Send>;

/// Sends jobs to the writer thread.
#[derive(Clone)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Job>,
    deadline: Duration,
}

impl Writer {
    /// Starts the thread owning `conn`; it ends when every `Writer` is dropped. A caller
    /// waits at most `deadline` for its answer. `between` runs after each batch is
    /// answered, before the next begins.
    pub(crate) fn start(
        conn: Connection,
        deadline: Duration,
        between: Option<BetweenBatches>,
    ) -> Result<Self, StoreError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("hookgate-sqlite".into())
            .spawn(move || run(conn, queue, between))
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
            finish: Box::new(move |batch: Result<(), StoreError>| {
                let answer = match ran {
                    // Its savepoint was rolled back: it had nothing to lose with the batch.
                    Some(Ok(Err(own)) | Err(own)) => Err(own),
                    Some(Ok(Ok(value))) => batch.map(|()| value),
                    // Only when the transaction did not begin, so `batch` is that error.
                    None => batch.and_then(|()| Err(StoreError::Query("job did not run".into()))),
                };
                let _ = reply.send(answer);
            }),
            poisoned,
        }
    });
    (job, answer)
}

/// Runs `f` in its own savepoint. The outer `Err` means the savepoint could not be ended
/// (the batch is poisoned): it carries `f`'s own error if `f` failed (a full disk, say, is
/// why the savepoint is gone), else the savepoint's. The inner result is `f`'s.
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
    match conn.execute_batch(end) {
        Ok(()) => Ok(result),
        Err(e) => Err(result.err().unwrap_or_else(|| sql_error(e))),
    }
}

/// Runs batches until every `Writer` is dropped and the queue is empty. A poisoned batch's
/// untried jobs lead the next batch, which is topped up from the queue; `between` runs
/// after each batch is answered.
fn run(conn: Connection, queue: mpsc::Receiver<Job>, mut between: Option<BetweenBatches>) {
    let mut batch = Vec::new();
    loop {
        if batch.is_empty() {
            match queue.recv() {
                Ok(job) => batch.push(job),
                Err(_) => return,
            }
        }
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        batch = run_batch(&conn, batch);
        if let Some(between) = &mut between {
            between(&conn);
        }
    }
}

/// One transaction for `batch`, in order, until a job poisons it: committed when none
/// does, rolled back otherwise. Every job run is answered; the jobs after a poisoned one
/// are returned untouched, to run in the next batch (each poisoned batch answers at least
/// its poisoner, so this ends).
fn run_batch(conn: &Connection, batch: Vec<Job>) -> Vec<Job> {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_error) {
        for job in batch {
            (job(None).finish)(Err(e.clone()));
        }
        return Vec::new();
    }
    let mut jobs = batch.into_iter();
    let mut finishers = Vec::with_capacity(jobs.len());
    let mut poisoned = false;
    for job in jobs.by_ref() {
        let ran = job(Some(conn));
        finishers.push(ran.finish);
        if ran.poisoned {
            poisoned = true;
            break;
        }
    }
    let ended = if poisoned {
        // Fails harmlessly when SQLite already rolled the transaction back.
        let _ = conn.execute_batch("ROLLBACK");
        Err(StoreError::Transient(
            "rolled back with another call's failure; nothing written".into(),
        ))
    } else {
        conn.execute_batch("COMMIT").map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            commit_error(e)
        })
    };
    for finish in finishers {
        finish(ended.clone());
    }
    jobs.collect()
}

/// The error of a failed COMMIT (the writer then rolls the batch back). SQLite did not
/// commit, so every kind is worth trying again: a busy or locked file as [`sql_error`] says,
/// anything else `Transient` — except an I/O error (a failed fsync, say), which may come
/// after the commit frame reached the WAL, where recovery after a crash could find it:
/// `TimedOut`, whose callers read the row to learn whether the write landed.
fn commit_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::SystemIoFailure) => StoreError::TimedOut(Cause::of(e)),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            sql_error(e)
        }
        _ => StoreError::Transient(Cause::of(e)),
    }
}

/// Maps a SQLite error: a busy or locked database, or a full disk, is `Unavailable`
/// (nothing written; retry later: an outcome that cannot be written now is tried again
/// until its deadline, not dropped); anything else is a `Query` error.
pub(crate) fn sql_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(
            rusqlite::ErrorCode::DatabaseBusy
            | rusqlite::ErrorCode::DatabaseLocked
            | rusqlite::ErrorCode::DiskFull,
        ) => StoreError::Unavailable(Cause::of(e)),
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

    /// A writable directory of its own, removed when dropped.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("hookgate-{name}-{}", fastrand::u64(..)));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn keys(conn: &Connection) -> Vec<i64> {
        let mut stmt = conn.prepare("SELECT x FROM t ORDER BY x").unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    fn insert(x: i64) -> impl FnOnce(&Connection) -> Result<usize, StoreError> + Send {
        move |c: &Connection| {
            c.execute("INSERT INTO t (x) VALUES (?1)", [x])
                .map_err(sql_error)
        }
    }

    #[test]
    fn a_savepoint_that_cannot_be_released_fails_its_job_and_retries_the_rest() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let (a, answer_a) = job(insert(1));
        // Ends the savepoint behind the writer's back: its RELEASE then fails.
        let (evil, answer_evil) =
            job(|c: &Connection| c.execute_batch("RELEASE job").map_err(sql_error));
        let (b, answer_b) = job(insert(2));
        let untried = run_batch(&conn, vec![a, evil, b]);
        assert_eq!(untried.len(), 1, "the job after the poisoned one is kept");
        let a = answer_a.blocking_recv().unwrap().unwrap_err();
        assert!(
            matches!(a, StoreError::Transient(_)) && a.to_string().contains("nothing written"),
            "{a}"
        );
        let evil = answer_evil.blocking_recv().unwrap().unwrap_err();
        assert!(
            matches!(evil, StoreError::Query(_)) && evil.to_string().contains("no such savepoint"),
            "{evil}"
        );
        assert_eq!(
            keys(&conn),
            Vec::<i64>::new(),
            "the lost batch wrote nothing"
        );

        assert!(run_batch(&conn, untried).is_empty());
        assert_eq!(answer_b.blocking_recv().unwrap().unwrap(), 1);
        assert_eq!(keys(&conn), [2], "the untried job ran in the next batch");
    }

    #[test]
    fn a_full_disk_fails_the_big_write_and_no_other_job_for_good() {
        let dir = TempDir::new("full");
        let conn = Connection::open(dir.0.join("full.db")).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER, b BLOB)")
            .unwrap();
        // 64 pages of 4 KiB: room for the small rows, not for 8 MiB.
        conn.pragma_update(None, "max_page_count", 64).unwrap();
        let (small, answer_small) = job(insert(1));
        let (big, answer_big) = job(|c: &Connection| {
            c.execute("INSERT INTO t (x, b) VALUES (2, ?1)", [vec![7u8; 8 << 20]])
                .map_err(sql_error)
        });
        let (after, answer_after) = job(insert(3));
        let mut batch = vec![small, big, after];
        while !batch.is_empty() {
            batch = run_batch(&conn, batch);
        }
        let big = answer_big.blocking_recv().unwrap().unwrap_err();
        assert_eq!(
            big.cause()
                .downcast_ref::<rusqlite::Error>()
                .and_then(rusqlite::Error::sqlite_error_code),
            Some(rusqlite::ErrorCode::DiskFull),
            "{big}"
        );
        assert!(big.is_transient(), "a full disk may free up: {big}");
        let small = answer_small.blocking_recv().unwrap().unwrap_err();
        assert!(small.is_transient(), "{small}");
        assert_eq!(answer_after.blocking_recv().unwrap().unwrap(), 1);
        assert_eq!(keys(&conn), [3]);
    }

    #[test]
    fn a_failed_commit_is_worth_retrying_and_unknown_after_an_io_error() {
        let failed = |code| {
            commit_error(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                None,
            ))
        };
        let full = failed(rusqlite::ffi::SQLITE_FULL);
        assert!(matches!(full, StoreError::Transient(_)), "{full}");
        let busy = failed(rusqlite::ffi::SQLITE_BUSY);
        assert!(matches!(busy, StoreError::Unavailable(_)), "{busy}");
        let fsync = failed(rusqlite::ffi::SQLITE_IOERR_FSYNC);
        assert!(matches!(fsync, StoreError::TimedOut(_)), "{fsync}");
    }

    #[test]
    fn a_job_whose_caller_gave_up_is_not_run() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER)").unwrap();
        let (a, answer) =
            job(|c: &Connection| c.execute("INSERT INTO t VALUES (1)", []).map_err(sql_error));
        drop(answer);
        run_batch(&conn, vec![a]);
        assert_eq!(keys(&conn), Vec::<i64>::new());
    }
}
