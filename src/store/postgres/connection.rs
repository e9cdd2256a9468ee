//! One Postgres connection's life outside a statement: opening it (the pool's [`Connector`],
//! which also watches the server's notices for commits a synchronous standby did not
//! confirm), and ending it after a statement that missed its deadline ([`end_cancelled`]:
//! cancel on the server, wait until the backend has let go, only then close).
//!
//! It never decides what an operation answers; `pool` does.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Connect, Object};
use tokio::task::JoinHandle;
use tokio_postgres::error::DbError;
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config, Error};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long a cancel request may take to reach the server (it opens a connection of its
/// own): the store's connect timeout.
const CANCEL_CONNECT: Duration = Duration::from_secs(3);

/// How long the backend has, after a cancel request, to answer the cancelled statement and
/// the statement queued behind it before the cancel is sent again. A cancel takes effect at
/// the backend's next interrupt check (microseconds to milliseconds); a second is ample,
/// and short enough that a lost cancel request costs little.
const ANSWER_AFTER_CANCEL: Duration = Duration::from_secs(1);

/// How long a connection whose backend has said nothing since the first cancel request is
/// kept before it is let go unproven: its network has gone silent (an address moved to
/// another server, a firewall forgot the connection) while cancel requests, which open
/// connections of their own, still get through. Held longer, such connections would keep
/// the pool's slots until the kernel gave up on them, minutes later, with the database
/// reachable all along.
const SILENT_LIMIT: Duration = Duration::from_secs(5);

/// Ends this connection's own backend (a role may always end its own); the server logs it
/// as `FATAL: terminating connection due to administrator command`. Locks nothing.
const END_BACKEND: &str = "SELECT pg_terminate_backend(pg_backend_pid())";

/// Opens the pool's connections and drives each on a task of its own, counting the
/// commits whose wait for a synchronous standby was cancelled (the server's warning
/// "canceling wait for synchronous replication"): committed on this server, not known to
/// be on any standby.
pub(crate) struct Connector {
    pub(crate) tls: MakeRustlsConnect,
    /// Such commits seen on any of the pool's connections, ever.
    pub(crate) unconfirmed: Arc<AtomicU64>,
}

type Connected = Result<(Client, JoinHandle<()>), Error>;

impl Connect for Connector {
    fn connect(&self, config: &Config) -> Pin<Box<dyn Future<Output = Connected> + Send + '_>> {
        let (tls, config) = (self.tls.clone(), config.clone());
        let unconfirmed = Arc::clone(&self.unconfirmed);
        Box::pin(async move {
            let (client, mut connection) = config.connect(tls).await?;
            // Ends when the server closes the connection, or is aborted when the pool
            // drops the client.
            let driver = tokio::spawn(async move {
                while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
                    match message {
                        Ok(AsyncMessage::Notice(notice)) if unconfirmed_commit(&notice) => {
                            unconfirmed.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            });
            Ok((client, driver))
        })
    }
}

/// Whether a notice is one of PostgreSQL's two warnings that a commit stopped waiting for
/// a standby's confirmation, having taken effect locally: "canceling wait for synchronous
/// replication due to user request" (a cancel; the client is then told of success) and
/// "canceling the wait for synchronous replication and terminating connection" (the
/// backend ends; the client sees the connection close). Read from the message: the first
/// has no code of its own; a server whose `lc_messages` is not English goes unrecognised.
pub(crate) fn unconfirmed_commit(notice: &DbError) -> bool {
    let message = notice.message();
    message.starts_with("canceling wait for synchronous replication")
        || message.starts_with("canceling the wait for synchronous replication")
}

/// Ends the statement running on `client` past its deadline, then the connection.
///
/// Closing alone is not enough: a backend waiting for a synchronous standby does not read
/// its socket, so neither the client going away nor `statement_timeout` ends it; it would
/// hold a server connection while the pool opened a replacement. So: send a cancel
/// request (the backend then ends the statement), queue behind it a statement that ends
/// the backend itself ([`END_BACKEND`]), and wait for the server to close the connection —
/// its backend is gone then. `client` stays checked out of the pool until that moment, so
/// the pool opens no replacement meanwhile. The cancel is sent again each
/// [`ANSWER_AFTER_CANCEL`] while the backend stays silent; the connection is let go
/// without that proof when a cancel request cannot reach the server at all (nor could a
/// replacement), or after [`SILENT_LIMIT`] of silence. `ending` counts the connections in
/// here.
pub(crate) async fn end_cancelled(
    client: Object,
    token: CancelToken,
    tls: MakeRustlsConnect,
    ending: Arc<AtomicUsize>,
) {
    let silent_until = tokio::time::Instant::now() + SILENT_LIMIT;
    loop {
        let sent = tokio::time::timeout(CANCEL_CONNECT, token.cancel_query(tls.clone()))
            .await
            .is_ok_and(|sent| sent.is_ok());
        let answered = tokio::time::timeout(ANSWER_AFTER_CANCEL, client.simple_query(END_BACKEND))
            .await
            .is_ok();
        if answered {
            // Fails as soon as the connection is closed: the server closes it once the
            // backend has exited (at once, unless a late cancel request cancelled
            // END_BACKEND instead; the idle backend then exits on the close below).
            let _ = tokio::time::timeout(ANSWER_AFTER_CANCEL, client.simple_query("")).await;
            break;
        }
        if client.is_closed() || !sent || tokio::time::Instant::now() >= silent_until {
            break;
        }
    }
    drop(Object::take(client));
    ending.fetch_sub(1, Ordering::SeqCst);
}
