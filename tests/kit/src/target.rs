//! The target: the one fake application of hookgate's tests and benches. A real HTTP
//! server that counts deliveries per `Idempotency-Key` (and per `Hookgate-Attempt`),
//! keeps when each key first arrived, and can be told to fail, throttle, slow down or
//! hang. For the tests it also keeps the last delivery of each key and, through a TCP
//! watch in front of the server, when each delivery started and ended (answered, or the
//! client hung up); a bench's target keeps neither ([`Setup::bench`]). Every target counts
//! the requests it has open at once, and what each request found when it arrived
//! ([`Arrival`]).
//!
//! The per-key counts are split over many locks ([`Shards`]), so a bench's millions of
//! keys never stall a delivery while one big map grows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::eventually;
use crate::shards::Shards;

/// How the target answers.
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// 500 for this share of deliveries, chosen at random; `Accept` for the rest.
    Flaky(f64),
    /// `Accept`, after this long.
    Slow(Duration),
}

/// How a target is set up: where it listens, on how many threads, and what it keeps
/// besides its counts.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The address the server binds.
    pub listen: String,
    /// The server's worker threads.
    pub workers: usize,
    /// Keep every delivery's [`Span`] (a TCP watch in front of the server).
    pub spans: bool,
    /// Keep each key's last delivery ([`Seen`]), its body included.
    pub last: bool,
}

impl Setup {
    /// A test's target: spans and last deliveries kept, two worker threads.
    pub fn test() -> Self {
        Self {
            listen: "127.0.0.1:0".into(),
            workers: 2,
            spans: true,
            last: true,
        }
    }

    /// A bench's target on `listen`: counts only, one worker thread, a deep backlog.
    pub fn bench(listen: &str) -> Self {
        Self {
            listen: listen.into(),
            workers: 1,
            spans: false,
            last: false,
        }
    }
}

/// One delivery as the target's connection lived it: from its request to its answer, or
/// to the moment the client closed the connection (`None` while it is still open).
/// Recorded by a TCP watch in front of the server, since an HTTP handler is not told when
/// its client hangs up.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    /// When the request's key went by.
    pub start: Instant,
    /// When the answer's first bytes went back, or the connection closed.
    pub end: Option<Instant>,
}

/// A delivery as the target received it.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Its `Hookgate-Attempt`.
    pub attempt: Option<String>,
    /// `(webhook-id, webhook-timestamp, webhook-signature)` when the request was signed.
    pub webhook: Option<(String, String, String)>,
    /// Its `Content-Type`.
    pub content_type: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
}

/// What one request found when it arrived at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Requests open at the target at once, this one included.
    pub open: usize,
    /// Requests the target had answered with a success (2xx) before this one arrived.
    pub succeeded: u64,
}

/// The requests open at the target now, and what each arrival found.
#[derive(Debug, Default)]
struct Concurrency {
    open: usize,
    succeeded: u64,
    arrivals: Vec<Arrival>,
}

/// What the target knows of one key.
#[derive(Debug)]
struct Key {
    /// Deliveries received.
    deliveries: u32,
    /// Deliveries answered with a success.
    ok: u32,
    /// When the first one arrived.
    first: Instant,
    /// The `Hookgate-Attempt` numbers received, a repeated one being a duplicate attempt.
    attempts: Vec<u32>,
}

/// Totals over every key.
#[derive(Debug, Default)]
struct Times {
    first: Option<Instant>,
    last_new: Option<Instant>,
}

struct State {
    keys: Shards<HashMap<String, Key>>,
    deliveries: AtomicU64,
    times: Mutex<Times>,
    last: Option<Mutex<HashMap<String, Seen>>>,
    /// Each key's `traceparent`s, in the order received (tests only: with `last`).
    traceparents: Mutex<HashMap<String, Vec<String>>>,
    spans: Mutex<HashMap<String, Vec<Span>>>,
    concurrency: Mutex<Concurrency>,
    behaviour: Mutex<Behaviour>,
    release: watch::Sender<bool>,
}

/// How the page [`Behaviour::LargePage`] answers with starts.
pub const ERROR_PAGE: &str = "<!doctype html><title>502 Bad Gateway</title><h1>upstream down</h1>";

/// The body [`Behaviour::Binary`] answers with.
const BINARY_ANSWER: &[u8] = b"o\0k\0";

/// Deliveries and duplicates over a whole run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Every delivery received.
    pub deliveries: u64,
    /// Keys answered with a success more than once, plus attempt numbers of one key
    /// received more than once.
    pub duplicates: u64,
}

/// A running target.
#[derive(Clone)]
pub struct Target {
    /// The URL to deliver to.
    pub url: String,
    state: Arc<State>,
}

impl Target {
    /// A test's target ([`Setup::test`]), answering [`Behaviour::Accept`].
    pub async fn start() -> Self {
        Self::start_with(Setup::test(), Behaviour::Accept).await
    }

    /// A target set up as `setup` says, answering as `behaviour` says.
    pub async fn start_with(setup: Setup, behaviour: Behaviour) -> Self {
        let (release, _) = watch::channel(false);
        let state = Arc::new(State {
            keys: Shards::default(),
            deliveries: AtomicU64::new(0),
            times: Mutex::default(),
            last: setup.last.then(Mutex::default),
            traceparents: Mutex::default(),
            spans: Mutex::default(),
            concurrency: Mutex::default(),
            behaviour: Mutex::new(behaviour),
            release,
        });
        let data = web::Data::from(Arc::clone(&state));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(receive))
        })
        .workers(setup.workers)
        .backlog(4096)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(&setup.listen)
        .expect("bind the target");
        let mut port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        if setup.spans {
            port = watch(port, Arc::clone(&state)).await;
        }
        Self {
            url: format!("http://127.0.0.1:{port}/effects"),
            state,
        }
    }

    /// Answers every later delivery as `behaviour` says.
    pub fn set(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().unwrap() = behaviour;
        if behaviour != Behaviour::Hang {
            self.state.release.send_replace(false);
        }
    }

    /// Lets every held request answer 201.
    pub fn release(&self) {
        self.release_with(Behaviour::Accept);
    }

    /// Lets every held request answer as `behaviour` says (a `Status` or a `Throttle`), and
    /// answers every later one so too.
    pub fn release_with(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().unwrap() = behaviour;
        self.state.release.send_replace(true);
    }

    /// Deliveries received for `idempotency_key`.
    pub fn count(&self, idempotency_key: &str) -> usize {
        self.state
            .keys
            .lock(idempotency_key)
            .get(idempotency_key)
            .map_or(0, |k| k.deliveries as usize)
    }

    /// The `traceparent` of each delivery of `idempotency_key`, in the order received
    /// (kept only by a test's target).
    pub fn traceparents(&self, idempotency_key: &str) -> Vec<String> {
        let all = self.state.traceparents.lock().unwrap();
        all.get(idempotency_key).cloned().unwrap_or_default()
    }

    /// The last delivery of `idempotency_key`, as the target received it (a default one
    /// when it kept none).
    pub fn last(&self, idempotency_key: &str) -> Seen {
        let Some(last) = &self.state.last else {
            return Seen::default();
        };
        last.lock()
            .unwrap()
            .get(idempotency_key)
            .cloned()
            .unwrap_or_default()
    }

    /// Every delivery of `idempotency_key` so far, in arrival order.
    pub fn spans(&self, idempotency_key: &str) -> Vec<Span> {
        self.state
            .spans
            .lock()
            .unwrap()
            .get(idempotency_key)
            .cloned()
            .unwrap_or_default()
    }

    /// Deliveries of `idempotency_key` whose connection is still open.
    pub fn open(&self, idempotency_key: &str) -> usize {
        self.spans(idempotency_key)
            .iter()
            .filter(|s| s.end.is_none())
            .count()
    }

    /// What each request found when it arrived, in arrival order (since the last
    /// [`reset`](Self::reset)).
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.state.concurrency.lock().unwrap().arrivals.clone()
    }

    /// The most requests the target had open at once (since the last
    /// [`reset`](Self::reset)).
    pub fn max_open(&self) -> usize {
        let concurrency = self.state.concurrency.lock().unwrap();
        concurrency
            .arrivals
            .iter()
            .map(|a| a.open)
            .max()
            .unwrap_or(0)
    }

    /// Forgets every count and last delivery (between sub-cases of one test); the requests
    /// open now stay counted as open.
    pub fn reset(&self) {
        self.state.keys.each_mut(HashMap::clear);
        self.state.deliveries.store(0, Ordering::SeqCst);
        {
            let mut concurrency = self.state.concurrency.lock().unwrap();
            concurrency.succeeded = 0;
            concurrency.arrivals.clear();
        }
        if let Some(last) = &self.state.last {
            last.lock().unwrap().clear();
        }
    }

    /// Every delivery received.
    pub fn total(&self) -> usize {
        self.state.deliveries.load(Ordering::SeqCst) as usize
    }

    /// Waits (with [`eventually`]'s deadline) for `n` deliveries of `idempotency_key`.
    pub async fn wait_for(&self, idempotency_key: &str, n: usize) {
        eventually(&format!("{n} deliveries of {idempotency_key}"), || async {
            self.count(idempotency_key) >= n
        })
        .await;
    }

    /// Deliveries, and duplicates: keys answered with a success more than once, plus
    /// attempt numbers of one key received more than once.
    pub fn tally(&self) -> Tally {
        let mut duplicates = 0;
        self.state.keys.each(|shard| {
            for key in shard.values() {
                duplicates += u64::from(key.ok > 1);
                let mut attempts = key.attempts.clone();
                attempts.sort_unstable();
                duplicates += attempts.windows(2).filter(|w| w[0] == w[1]).count() as u64;
            }
        });
        Tally {
            deliveries: self.state.deliveries.load(Ordering::SeqCst),
            duplicates,
        }
    }

    /// Keys delivered at least once.
    pub fn keys(&self) -> usize {
        let mut n = 0;
        self.state.keys.each(|shard| n += shard.len());
        n
    }

    /// When the first delivery arrived.
    pub fn first(&self) -> Option<Instant> {
        self.state.times.lock().unwrap().first
    }

    /// When the last key not seen before arrived.
    pub fn last_new(&self) -> Option<Instant> {
        self.state.times.lock().unwrap().last_new
    }

    /// Gaps longer than `longer_than` between one new key's arrival and the next: how
    /// many, and their sum.
    pub fn pauses(&self, longer_than: Duration) -> (u64, Duration) {
        let mut firsts: Vec<Instant> = Vec::new();
        self.state
            .keys
            .each(|shard| firsts.extend(shard.values().map(|k| k.first)));
        firsts.sort_unstable();
        firsts
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|&gap| gap > longer_than)
            .fold((0, Duration::ZERO), |(n, total), gap| (n + 1, total + gap))
    }

    /// When each of `keys` first arrived, `None` for one that has not.
    pub fn first_arrivals<'a>(&self, keys: impl Iterator<Item = &'a str>) -> Vec<Option<Instant>> {
        keys.map(|k| self.state.keys.lock(k).get(k).map(|key| key.first))
            .collect()
    }
}

/// What the target answers `behaviour` with, once any hang is over.
fn answer(behaviour: Behaviour, key: &str) -> HttpResponse {
    let status = |code: u16| HttpResponse::build(code.try_into().unwrap());
    match behaviour {
        Behaviour::Accept | Behaviour::Slow(_) | Behaviour::Hang | Behaviour::Flaky(_) => {
            HttpResponse::Created().json(serde_json::json!({ "received": key }))
        }
        Behaviour::Status(code) => status(code).finish(),
        Behaviour::Large(n) => HttpResponse::Ok().body(vec![b'r'; n]),
        Behaviour::LargePage(code, n) => {
            let mut page = ERROR_PAGE.as_bytes().to_vec();
            page.resize(n.max(page.len()), b'x');
            status(code).content_type("text/html").body(page)
        }
        Behaviour::Binary(code) => status(code).body(BINARY_ANSWER),
        Behaviour::Trickle(code) => {
            use futures_util::StreamExt;
            let first = futures_util::stream::once(async {
                Ok::<_, actix_web::Error>(web::Bytes::from_static(b"partial"))
            });
            let never = futures_util::stream::pending();
            status(code).streaming(first.chain(never))
        }
        Behaviour::Throttle(code, retry_after) => status(code)
            .insert_header(("Retry-After", retry_after))
            .finish(),
    }
}

/// One request open at the target, counted from its arrival until its answer — or until
/// the client hangs up, which drops the handler (and this) without an answer.
struct Open {
    state: web::Data<State>,
    succeeded: bool,
}

impl Open {
    fn arrive(state: &web::Data<State>) -> Self {
        let mut concurrency = state.concurrency.lock().unwrap();
        concurrency.open += 1;
        let arrival = Arrival {
            open: concurrency.open,
            succeeded: concurrency.succeeded,
        };
        concurrency.arrivals.push(arrival);
        Self {
            state: state.clone(),
            succeeded: false,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut concurrency = self.state.concurrency.lock().unwrap();
        concurrency.open = concurrency.open.saturating_sub(1);
        concurrency.succeeded += u64::from(self.succeeded);
    }
}

async fn receive(req: HttpRequest, body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    let mut open = Open::arrive(&state);
    let answer = respond(req, body, state).await;
    open.succeeded = answer.status().is_success();
    answer
}

/// The answer to one request, as the target's behaviour says, once counted.
async fn respond(req: HttpRequest, body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    let now = Instant::now();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let key = header("Idempotency-Key").unwrap_or_default();
    let mut behaviour = *state.behaviour.lock().unwrap();
    match behaviour {
        Behaviour::Slow(delay) => actix_rt::time::sleep(delay).await,
        Behaviour::Flaky(share) if fastrand::f64() < share => behaviour = Behaviour::Status(500),
        _ => {}
    }
    let attempt = header("Hookgate-Attempt");
    let ok = matches!(
        behaviour,
        Behaviour::Accept | Behaviour::Slow(_) | Behaviour::Flaky(_) | Behaviour::Large(_)
    );
    record(&state, &key, attempt.as_deref(), ok, now);
    if let Some(last) = &state.last {
        if let Some(traceparent) = header("traceparent") {
            let mut all = state.traceparents.lock().unwrap();
            all.entry(key.clone()).or_default().push(traceparent);
        }
        last.lock().unwrap().insert(
            key.clone(),
            Seen {
                attempt,
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
    }
    if behaviour == Behaviour::Hang {
        let mut released = state.release.subscribe();
        let _ = released.wait_for(|r| *r).await;
        let released_as = *state.behaviour.lock().unwrap();
        if matches!(released_as, Behaviour::Status(_) | Behaviour::Throttle(..)) {
            return answer(released_as, &key);
        }
    }
    answer(behaviour, &key)
}

/// Counts one delivery of `key`.
fn record(state: &State, key: &str, attempt: Option<&str>, ok: bool, now: Instant) {
    state.deliveries.fetch_add(1, Ordering::SeqCst);
    let new = {
        let mut shard = state.keys.lock(key);
        let entry = shard.entry(key.to_owned()).or_insert(Key {
            deliveries: 0,
            ok: 0,
            first: now,
            attempts: Vec::new(),
        });
        entry.deliveries += 1;
        entry.ok += u32::from(ok);
        if let Some(n) = attempt.and_then(|a| a.parse().ok()) {
            entry.attempts.push(n);
        }
        entry.deliveries == 1
    };
    if new {
        let mut times = state.times.lock().unwrap();
        times.first.get_or_insert(now);
        times.last_new = times.last_new.max(Some(now));
    }
}

/// A TCP watch in front of the target server on `port`: forwards every connection, and
/// records a [`Span`] per request — opened when a request's `Idempotency-Key` header goes
/// by, ended by the first bytes of the answer or by the connection's close. Answers the
/// port it listens on.
async fn watch(port: u16, state: Arc<State>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the watch");
    let watched = listener.local_addr().unwrap().port();
    actix_rt::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            actix_rt::spawn(watch_one(inbound, port, Arc::clone(&state)));
        }
    });
    watched
}

/// One connection through the watch.
async fn watch_one(inbound: TcpStream, port: u16, state: Arc<State>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    async fn deliver(target: &Target, key: &str, attempt: u32) -> u16 {
        awc::Client::new()
            .post(&target.url)
            .insert_header(("Idempotency-Key", key))
            .insert_header(("Hookgate-Attempt", attempt.to_string()))
            .send_body("{}")
            .await
            .expect("the target answers")
            .status()
            .as_u16()
    }

    #[actix_rt::test]
    async fn a_key_answered_twice_and_a_repeated_attempt_are_duplicates() {
        let target = Target::start().await;
        assert_eq!(deliver(&target, "a", 1).await, 201);
        deliver(&target, "b", 1).await;
        assert_eq!(target.tally().duplicates, 0);
        // b's attempt 1 again: answered twice, and the same attempt twice.
        deliver(&target, "b", 1).await;
        assert_eq!(target.tally().duplicates, 2);
        assert_eq!(
            (target.count("b"), target.total(), target.keys()),
            (2, 3, 2)
        );
        assert_eq!(target.last("b").attempt.as_deref(), Some("1"));
        assert_eq!(target.spans("b").len(), 2);
    }

    #[actix_rt::test]
    async fn each_arrival_finds_the_requests_open_and_the_successes_before_it() {
        let target = Target::start_with(Setup::test(), Behaviour::Hang).await;
        let (a, b) = (target.clone(), target.clone());
        let first = actix_rt::spawn(async move { deliver(&a, "a", 1).await });
        let second = actix_rt::spawn(async move { deliver(&b, "b", 1).await });
        eventually("both requests to be held", || async { target.total() == 2 }).await;
        target.release();
        assert_eq!((first.await.unwrap(), second.await.unwrap()), (201, 201));
        target.set(Behaviour::Status(500));
        assert_eq!(deliver(&target, "c", 1).await, 500);
        assert_eq!(deliver(&target, "d", 1).await, 500);
        let found: Vec<_> = target
            .arrivals()
            .iter()
            .map(|a| (a.open, a.succeeded))
            .collect();
        // Two at once with no success yet; then one at a time, after the two successes (a
        // 500 is none).
        assert_eq!(found, [(1, 0), (2, 0), (1, 2), (1, 2)]);
        assert_eq!(target.max_open(), 2);
        target.reset();
        assert_eq!((target.arrivals().len(), target.max_open()), (0, 0));
    }

    #[actix_rt::test]
    async fn a_retry_after_a_failure_is_no_duplicate() {
        let target = Target::start_with(Setup::bench("127.0.0.1:0"), Behaviour::Status(500)).await;
        assert_eq!(deliver(&target, "a", 1).await, 500);
        target.set(Behaviour::Accept);
        assert_eq!(deliver(&target, "a", 2).await, 201);
        let tally = target.tally();
        assert_eq!((tally.deliveries, tally.duplicates), (2, 0));
        // A bench's target keeps no last delivery and no spans.
        assert!(target.last("a").attempt.is_none());
        assert!(target.spans("a").is_empty());
    }

    #[actix_rt::test]
    async fn a_flaky_target_fails_about_its_share() {
        let target = Target::start_with(Setup::bench("127.0.0.1:0"), Behaviour::Flaky(0.5)).await;
        let mut failed = 0;
        for i in 0..200 {
            failed += u32::from(deliver(&target, &format!("k{i}"), 1).await == 500);
        }
        // 200 draws at one half: fewer than 60 or more than 140 failures is a 1-in-10^8 event.
        assert!((60..=140).contains(&failed), "{failed} of 200 failed");
    }
}
