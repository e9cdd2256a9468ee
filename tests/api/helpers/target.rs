//! The target: a real HTTP server that counts deliveries per `Idempotency-Key`, records
//! when each one started and ended (answered, or the client hung up), and can be told to
//! fail, throttle or hang.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use tokio::sync::watch;

use super::eventually;

/// How the target answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 201 with `{"received": "<idempotency key>"}`.
    Accept,
    /// This status, with an empty body.
    Status(u16),
    /// Counts the delivery, then holds the request until `release()`.
    Hang,
    /// 200 with a body of this many bytes (`b'r'`), as a large application answer.
    Large(usize),
    /// This status with an HTML page of this many bytes that starts with [`ERROR_PAGE`], as
    /// a proxy's or a framework's error page.
    LargePage(u16, usize),
    /// This status with this `Retry-After` value (a rate-limited or overloaded target).
    Throttle(u16, &'static str),
    /// This status with a body holding NUL bytes ([`BINARY_ANSWER`]), as UTF-16 text or a
    /// binary format would.
    Binary(u16),
    /// This status and the first bytes of a body that never ends (the connection stays
    /// open, silent).
    Trickle(u16),
}

/// One delivery as the target's connection lived it: from its request to its answer, or
/// to the moment the client closed the connection (`None` while it is still open).
/// Recorded by a TCP watch in front of the server, since an HTTP handler is not told when
/// its client hangs up.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub start: Instant,
    pub end: Option<Instant>,
}

#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub attempt: Option<String>,
    /// `(webhook-id, webhook-timestamp, webhook-signature)` when the request was signed.
    pub webhook: Option<(String, String, String)>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

struct TargetState {
    counts: Mutex<HashMap<String, usize>>,
    last: Mutex<HashMap<String, Seen>>,
    spans: Mutex<HashMap<String, Vec<Span>>>,
    behaviour: Mutex<Behaviour>,
    release: watch::Sender<bool>,
}

/// How the page [`Behaviour::LargePage`] answers with starts.
pub const ERROR_PAGE: &str = "<!doctype html><title>502 Bad Gateway</title><h1>upstream down</h1>";

/// The body [`Behaviour::Binary`] answers with.
const BINARY_ANSWER: &[u8] = b"o\0k\0";

#[derive(Clone)]
pub struct TestTarget {
    pub url: String,
    state: Arc<TargetState>,
}

impl TestTarget {
    pub async fn start() -> Self {
        let (release, _) = watch::channel(false);
        let state = Arc::new(TargetState {
            counts: Mutex::default(),
            last: Mutex::default(),
            spans: Mutex::default(),
            behaviour: Mutex::new(Behaviour::Accept),
            release,
        });
        let data = web::Data::from(Arc::clone(&state));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(receive))
        })
        .workers(2)
        .disable_signals()
        .shutdown_timeout(0)
        .bind("127.0.0.1:0")
        .expect("bind target");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        let watched = watch(port, Arc::clone(&state)).await;
        Self {
            url: format!("http://127.0.0.1:{watched}/effects"),
            state,
        }
    }

    pub fn set(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().unwrap() = behaviour;
        if behaviour != Behaviour::Hang {
            self.state.release.send_replace(false);
        }
    }

    /// Lets every held request answer 201.
    pub fn release(&self) {
        *self.state.behaviour.lock().unwrap() = Behaviour::Accept;
        self.state.release.send_replace(true);
    }

    /// Lets every held request answer as `behaviour` says (a `Status` or a `Throttle`), and
    /// answers every later one so too.
    pub fn release_with(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().unwrap() = behaviour;
        self.state.release.send_replace(true);
    }

    /// Deliveries received for `provider:key`.
    pub fn count(&self, idempotency_key: &str) -> usize {
        self.state
            .counts
            .lock()
            .unwrap()
            .get(idempotency_key)
            .copied()
            .unwrap_or(0)
    }

    /// The last delivery of `provider:key`, as the target received it.
    pub fn last(&self, idempotency_key: &str) -> Seen {
        self.state
            .last
            .lock()
            .unwrap()
            .get(idempotency_key)
            .cloned()
            .unwrap_or_default()
    }

    /// Every delivery of `provider:key` so far, in arrival order.
    pub fn spans(&self, idempotency_key: &str) -> Vec<Span> {
        self.state
            .spans
            .lock()
            .unwrap()
            .get(idempotency_key)
            .cloned()
            .unwrap_or_default()
    }

    /// Deliveries of `provider:key` whose connection is still open.
    pub fn open(&self, idempotency_key: &str) -> usize {
        self.spans(idempotency_key)
            .iter()
            .filter(|s| s.end.is_none())
            .count()
    }

    /// Forgets every count (between sub-cases of one test).
    pub fn reset(&self) {
        self.state.counts.lock().unwrap().clear();
        self.state.last.lock().unwrap().clear();
    }

    pub fn total(&self) -> usize {
        self.state.counts.lock().unwrap().values().sum()
    }

    pub async fn wait_for(&self, idempotency_key: &str, n: usize) {
        eventually(&format!("{n} deliveries of {idempotency_key}"), || async {
            self.count(idempotency_key) >= n
        })
        .await;
    }
}

async fn receive(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<TargetState>,
) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let key = header("Idempotency-Key").unwrap_or_default();
    *state.counts.lock().unwrap().entry(key.clone()).or_default() += 1;
    state.last.lock().unwrap().insert(
        key.clone(),
        Seen {
            attempt: header("Hookgate-Attempt"),
            webhook: match (
                header("webhook-id"),
                header("webhook-timestamp"),
                header("webhook-signature"),
            ) {
                (Some(id), Some(ts), Some(sig)) => Some((id, ts, sig)),
                _ => None,
            },
            content_type: header("Content-Type"),
            body: body.to_vec(),
        },
    );
    let behaviour = *state.behaviour.lock().unwrap();
    match behaviour {
        Behaviour::Accept => {}
        Behaviour::Status(code) => {
            return HttpResponse::build(code.try_into().unwrap()).finish();
        }
        Behaviour::Large(n) => return HttpResponse::Ok().body(vec![b'r'; n]),
        Behaviour::LargePage(code, n) => {
            let mut page = ERROR_PAGE.as_bytes().to_vec();
            page.resize(n.max(page.len()), b'x');
            return HttpResponse::build(code.try_into().unwrap())
                .content_type("text/html")
                .body(page);
        }
        Behaviour::Binary(code) => {
            return HttpResponse::build(code.try_into().unwrap()).body(BINARY_ANSWER);
        }
        Behaviour::Trickle(code) => {
            use futures_util::StreamExt;
            let first = futures_util::stream::once(async {
                Ok::<_, actix_web::Error>(web::Bytes::from_static(b"partial"))
            });
            let never = futures_util::stream::pending();
            return HttpResponse::build(code.try_into().unwrap()).streaming(first.chain(never));
        }
        Behaviour::Throttle(code, retry_after) => {
            return HttpResponse::build(code.try_into().unwrap())
                .insert_header(("Retry-After", retry_after))
                .finish();
        }
        Behaviour::Hang => {
            let mut released = state.release.subscribe();
            let _ = released.wait_for(|r| *r).await;
            let released_as = *state.behaviour.lock().unwrap();
            match released_as {
                Behaviour::Status(code) => {
                    return HttpResponse::build(code.try_into().unwrap()).finish();
                }
                Behaviour::Throttle(code, retry_after) => {
                    return HttpResponse::build(code.try_into().unwrap())
                        .insert_header(("Retry-After", retry_after))
                        .finish();
                }
                _ => {}
            }
        }
    }
    HttpResponse::Created().json(serde_json::json!({ "received": key }))
}

/// A TCP watch in front of the target server on `port`: forwards every connection, and
/// records a [`Span`] per request — opened when a request's `Idempotency-Key` header goes
/// by, ended by the first bytes of the answer or by the connection's close. Answers the
/// port it listens on.
async fn watch(port: u16, state: Arc<TargetState>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the watch");
    let watched = listener.local_addr().unwrap().port();
    actix_rt::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let state = Arc::clone(&state);
            actix_rt::spawn(async move {
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", port)).await else {
                    return;
                };
                let open: Mutex<Option<(String, usize)>> = Mutex::new(None);
                let close = || {
                    if let Some((key, index)) = open.lock().unwrap().take() {
                        if let Some(span) = state
                            .spans
                            .lock()
                            .unwrap()
                            .get_mut(&key)
                            .and_then(|s| s.get_mut(index))
                        {
                            span.end = Some(Instant::now());
                        }
                    }
                };
                let (mut client_read, mut client_write) = inbound.into_split();
                let (mut server_read, mut server_write) = outbound.into_split();
                let requests = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match client_read.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if let Some(key) = idempotency_key(&buf[..n]) {
                            let mut spans = state.spans.lock().unwrap();
                            let spans = spans.entry(key.clone()).or_default();
                            spans.push(Span {
                                start: Instant::now(),
                                end: None,
                            });
                            *open.lock().unwrap() = Some((key, spans.len() - 1));
                        }
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                let answers = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match server_read.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        close();
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                tokio::select! {
                    () = requests => {}
                    () = answers => {}
                }
                close();
            });
        }
    });
    watched
}

/// The `Idempotency-Key` header's value in a request's bytes, if they hold one.
fn idempotency_key(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("idempotency-key")
            .then(|| value.trim().to_owned())
    })
}

/// A raw HTTP/1.1 target that answers every request with an interim `103 Early Hints` and,
/// `gap` later, its final answer: 200 with the body `answer-to-request-<n>`, `n` counting
/// the requests it has read. Answers its URL and that count.
pub async fn early_hints_target(gap: Duration) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering;
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().unwrap().port();
    let counter = Arc::clone(&seen);
    actix_rt::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let seen = Arc::clone(&counter);
            actix_rt::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // One request: its head, then a body of its Content-Length.
                    let (head_end, len) = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .map_or(0, |v| v.trim().parse().unwrap_or(0));
                            break (i + 4, len);
                        }
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    while buf.len() < head_end + len {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + len);
                    let n = seen.fetch_add(1, Ordering::SeqCst);
                    let hints = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n";
                    if socket.write_all(hints).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(gap).await;
                    let body = format!("answer-to-request-{n}");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if socket.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://127.0.0.1:{port}/effects"), seen)
}
