//! The embedded store's writer thread: owns the one SQLite connection and runs every job
//! sent to it, batched: all jobs waiting when it wakes run inside one `BEGIN IMMEDIATE …
//! COMMIT` (group commit), and each job's answer is released only after that commit.
//!
//! Blocking SQLite calls never run on an async runtime thread. A failed job does not spoil
//! its batch: each runs inside its own savepoint.

use std::sync::mpsc;
use std::thread;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::StoreError;

/// Jobs one transaction takes at most: bounds the time a batch holds the write lock.
const MAX_BATCH: usize = 256;

/// What a job does once its batch has committed (or failed to).
type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// A job: runs on the connection inside the batch's transaction (or is handed `None` when
/// the transaction could not begin) and returns its [`Finish`].
type Job = Box<dyn FnOnce(Option<&Connection>) -> Finish + Send>;

/// Sends jobs to the writer thread.
#[derive(Clone)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the thread owning `conn`; it ends when every `Writer` is dropped.
    pub(crate) fn start(conn: Connection) -> Result<Self, StoreError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("hookgate-sqlite".into())
            .spawn(move || run(conn, queue))
            .map_err(|e| StoreError::Unavailable(format!("starting the SQLite thread: {e}")))?;
        Ok(Self { jobs })
    }

    /// Runs `f` in the next batch; answers once the batch committed.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = conn.map(|conn| in_savepoint(conn, f));
            Box::new(move |committed: Result<(), StoreError>| {
                // Without a connection the batch failed to begin, so `committed` is Err.
                let answer = committed.and_then(|()| {
                    result.unwrap_or_else(|| Err(StoreError::Query("job did not run".into())))
                });
                let _ = reply.send(answer);
            })
        });
        self.jobs
            .send(job)
            .map_err(|_| StoreError::Unavailable("the SQLite thread has stopped".into()))?;
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the SQLite thread has stopped".into(),
            ))
        })
    }
}

fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.execute_batch("SAVEPOINT job").map_err(sql_error)?;
    let result = f(conn);
    let end = if result.is_ok() {
        "RELEASE job"
    } else {
        "ROLLBACK TO job; RELEASE job"
    };
    conn.execute_batch(end).map_err(sql_error)?;
    result
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
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_error) {
            for job in batch {
                job(None)(Err(e.clone()));
            }
            continue;
        }
        let finishers: Vec<Finish> = batch.into_iter().map(|job| job(Some(&conn))).collect();
        let committed = conn.execute_batch("COMMIT").map_err(sql_error);
        if committed.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for finish in finishers {
            finish(committed.clone());
        }
    }
}

/// Maps a SQLite error: a busy or locked database is `Unavailable` (retry later);
/// anything else is a `Query` error.
pub(crate) fn sql_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Query(e.to_string()),
    }
}
