//! Keep-alive without a hole: actix-http times only a connection's *first* request head
//! (`client_request_timeout`), and its keep-alive timer stops at the first byte of the next
//! request. A client that sent one request and then one byte of another would hold its
//! connection for ever. The watch closes it instead.
//!
//! Nor does actix time its writes: a client that asked for an answer larger than the
//! socket's buffers and read nothing would hold its connection for ever too, keep-alive on
//! or off. [`bound_writes`] gives every accepted socket the kernel's own write timeout
//! (`TCP_USER_TIMEOUT`): sent bytes left unacknowledged, or a receive window left shut, for
//! longer than it end the connection, while a client that reads, however slowly, keeps
//! opening its window and is not cut.
//!
//! Each connection is entered when accepted ([`ConnWatch::on_connect`]) with a duplicate of
//! its socket, and left when actix drops it. The middleware ([`ConnWatch::busy`]) marks a
//! connection busy from the moment a request's head is parsed until its answer has been
//! sent ([`Sent`]).
//! A connection that has been idle — no request in hand — for longer than `keep_alive`
//! (actix's own timer closes an honest idle one by then) plus `read_timeout` (the time a
//! head may take) is stuck in a head that never ends: [`ConnWatch::sweep`] shuts its socket
//! down, and actix closes the connection.

use std::any::Any;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix_web::body::{BodySize, MessageBody};
use actix_web::dev::{Extensions, ServiceRequest};
use actix_web::web::Bytes;
use dashmap::DashMap;

/// A connection's state, shared by its entry and its requests.
#[derive(Debug)]
struct Conn {
    /// The requests in hand now, and when the connection last had none.
    state: Mutex<(usize, Instant)>,
    /// A duplicate of the connection's socket: shutting it down ends the connection.
    #[cfg(unix)]
    socket: std::net::TcpStream,
}

/// The open connections of one node's HTTP server.
#[derive(Debug)]
pub struct ConnWatch {
    conns: DashMap<u64, Arc<Conn>>,
    next: AtomicU64,
    /// Longest idle time before a connection is stuck: keep-alive plus the head deadline.
    stuck_after: Duration,
}

/// Kept in the connection's data; leaves the watch when actix drops the connection.
struct Entry {
    watch: Arc<ConnWatch>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.watch.conns.remove(&self.id);
    }
}

/// A request in hand on its connection; the connection is idle again when it is dropped.
pub struct Busy(Arc<Conn>);

/// An answer's body that keeps its connection busy until it has been sent whole (or
/// dropped): a large answer read slowly is not taken for a stuck head.
pub struct Sent<B> {
    body: B,
    busy: Option<Busy>,
}

impl<B> Sent<B> {
    /// `body`, keeping `busy` until it has been sent.
    pub fn new(body: B, busy: Option<Busy>) -> Self {
        Self { body, busy }
    }
}

impl<B: MessageBody + Unpin> MessageBody for Sent<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.get_mut();
        let next = Pin::new(&mut this.body).poll_next(cx);
        if matches!(next, Poll::Ready(None | Some(Err(_)))) {
            this.busy = None;
        }
        next
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = state.0.saturating_sub(1);
        state.1 = Instant::now();
    }
}

/// Bounds how long the socket of an accepted connection (`HttpServer::on_connect`) may hold
/// bytes its client does not take: `limit`, through `TCP_USER_TIMEOUT` (Linux; elsewhere
/// nothing is set). A socket the option cannot be set on keeps the system's default.
pub fn bound_writes(io: &dyn Any, limit: Duration) {
    #[cfg(target_os = "linux")]
    if let Some(stream) = io.downcast_ref::<actix_web::rt::net::TcpStream>() {
        let _ = socket2::SockRef::from(stream).set_tcp_user_timeout(Some(limit));
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (io, limit);
}

impl ConnWatch {
    /// A watch for a server whose keep-alive is `keep_alive` and head deadline
    /// `read_timeout`.
    pub fn new(keep_alive: Duration, read_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            conns: DashMap::new(),
            next: AtomicU64::new(0),
            stuck_after: keep_alive + read_timeout,
        })
    }

    /// Enters a connection actix accepted (`HttpServer::on_connect`). A socket that cannot
    /// be duplicated is not watched.
    pub fn on_connect(self: &Arc<Self>, io: &dyn Any, data: &mut Extensions) {
        #[cfg(unix)]
        {
            use std::os::fd::AsFd;
            let Some(stream) = io.downcast_ref::<actix_web::rt::net::TcpStream>() else {
                return;
            };
            let Ok(socket) = stream.as_fd().try_clone_to_owned() else {
                return;
            };
            let conn = Arc::new(Conn {
                state: Mutex::new((0, Instant::now())),
                socket: std::net::TcpStream::from(socket),
            });
            let id = self.next.fetch_add(1, Ordering::Relaxed);
            self.conns.insert(id, Arc::clone(&conn));
            data.insert(Entry {
                watch: Arc::clone(self),
                id,
                conn,
            });
        }
        #[cfg(not(unix))]
        let _ = (io, data);
    }

    /// Marks the connection of `req` busy until the returned guard is dropped (when its
    /// answer is made); `None` for a connection not watched.
    pub fn busy(req: &ServiceRequest) -> Option<Busy> {
        let entry = req.conn_data::<Entry>()?;
        let mut state = entry.conn.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 += 1;
        Some(Busy(Arc::clone(&entry.conn)))
    }

    /// Shuts down every connection idle for longer than keep-alive and the head deadline
    /// together.
    pub fn sweep(&self) {
        let now = Instant::now();
        for conn in self.conns.iter() {
            let (requests, idle_since) = *conn.state.lock().unwrap_or_else(|e| e.into_inner());
            if requests == 0 && now.duration_since(idle_since) > self.stuck_after {
                #[cfg(unix)]
                let _ = conn.socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
