//! Keep-alive without a hole: actix-http times only a connection's *first* request head
//! (`client_request_timeout`), and its keep-alive timer stops at the first byte of the next
//! request. A client that sent one request and then one byte of another would hold its
//! connection for ever. Nor does actix time its writes: a client that asks for an answer
//! larger than the socket's buffers and never reads it would hold its connection for ever
//! too. The watch closes both.
//!
//! Each connection is entered when accepted ([`ConnWatch::on_connect`]) with a duplicate of
//! its socket, and left when actix drops it. The middleware ([`ConnWatch::busy`]) marks a
//! connection busy from the moment a request's head is parsed until its answer has been
//! sent ([`Sent`]).
//! A connection that has been idle — no request in hand — for longer than `keep_alive`
//! (actix's own timer closes an honest idle one by then) plus `read_timeout` (the time a
//! head may take) is stuck in a head that never ends; one whose answer is being sent and
//! whose client has taken none of it for `read_timeout` is stuck on a reader that does not
//! read. [`ConnWatch::sweep`] shuts the socket of either down, and actix closes the
//! connection.
//!
//! [`Sent`] hands actix the answer in slices of [`SLICE`] bytes and notes each slice taken:
//! actix asks for the next one only when its write buffer has room, that is when the client
//! has read, so a slice taken is the client's progress.

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

/// The most an answer's body gives actix at once (see the module's docs).
const SLICE: usize = 16 * 1024;
const SLICE_U64: u64 = SLICE as u64;

/// What a connection is doing.
#[derive(Debug, Clone, Copy)]
struct State {
    /// The requests in hand now.
    requests: usize,
    /// When the connection last had none.
    idle_since: Instant,
    /// While an answer is being sent: when its client last took a slice of it.
    sending: Option<Instant>,
}

/// A connection's state, shared by its entry and its requests.
#[derive(Debug)]
struct Conn {
    state: Mutex<State>,
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
    /// Longest time an answer may wait for its client to take a slice of it.
    stalled_after: Duration,
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

impl Busy {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An answer's body that keeps its connection busy until it has been sent whole (or
/// dropped), handed to actix in slices whose taking is noted (see the module's docs): a
/// large answer read slowly is not taken for a stuck head, one not read at all is found.
pub struct Sent<B> {
    body: B,
    /// What is left of the chunk the body gave last.
    rest: Bytes,
    /// Whether the whole answer fits in one slice (it is passed through).
    short: bool,
    /// Whether the answer has been longer than one slice.
    long: bool,
    busy: Option<Busy>,
}

impl<B: MessageBody> Sent<B> {
    /// `body`, keeping `busy` until it has been sent.
    pub fn new(body: B, busy: Option<Busy>) -> Self {
        // An answer of one slice or less is passed through as it is: nothing to note.
        let short = matches!(body.size(), BodySize::None | BodySize::Sized(0..=SLICE_U64));
        Self {
            body,
            rest: Bytes::new(),
            short,
            long: false,
            busy,
        }
    }

    /// The next slice of `rest`, noted as taken once the answer is longer than one slice
    /// (a short answer is never waited on: actix asks for its end at once, the connection
    /// is idle, and the idle rule covers what is left in the buffers).
    fn slice(&mut self) -> Bytes {
        let slice = self.rest.split_to(self.rest.len().min(SLICE));
        if !self.rest.is_empty() || self.long {
            self.long = true;
            if let Some(busy) = &self.busy {
                busy.lock().sending = Some(Instant::now());
            }
        }
        slice
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
        if this.short {
            let next = Pin::new(&mut this.body).poll_next(cx);
            if matches!(next, Poll::Ready(None | Some(Err(_)))) {
                this.busy = None;
            }
            return next;
        }
        if this.rest.is_empty() {
            match Pin::new(&mut this.body).poll_next(cx) {
                Poll::Ready(Some(Ok(chunk))) => this.rest = chunk,
                end @ Poll::Ready(None | Some(Err(_))) => {
                    this.busy = None;
                    return end;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Some(Ok(this.slice())))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.lock();
        state.requests = state.requests.saturating_sub(1);
        state.idle_since = Instant::now();
        // HTTP/1 sends one answer at a time: this one has ended, sent or not.
        state.sending = None;
    }
}

impl ConnWatch {
    /// A watch for a server whose keep-alive is `keep_alive` (zero: off) and head deadline
    /// `read_timeout`; an answer's client may take nothing for `read_timeout` too.
    pub fn new(keep_alive: Duration, read_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            conns: DashMap::new(),
            next: AtomicU64::new(0),
            stuck_after: keep_alive + read_timeout,
            stalled_after: read_timeout,
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
                state: Mutex::new(State {
                    requests: 0,
                    idle_since: Instant::now(),
                    sending: None,
                }),
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
        let busy = Busy(Arc::clone(&entry.conn));
        busy.lock().requests += 1;
        Some(busy)
    }

    /// Shuts down every connection idle for longer than keep-alive and the head deadline
    /// together, and every one whose answer's client has taken nothing for `read_timeout`.
    pub fn sweep(&self) {
        let now = Instant::now();
        for conn in self.conns.iter() {
            let state = *conn.state.lock().unwrap_or_else(|e| e.into_inner());
            let stuck =
                state.requests == 0 && now.duration_since(state.idle_since) > self.stuck_after;
            let stalled = state
                .sending
                .is_some_and(|taken| now.duration_since(taken) > self.stalled_after);
            if stuck || stalled {
                #[cfg(unix)]
                let _ = conn.socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
