//! The queue-mode chaos target: answers each attempt from a mix of the ways real targets
//! answer (fast 200, slow 200 longer than the lease, 429/503 with good and bad
//! `Retry-After` values, 400, 500) and records every attempt's start and end — the end
//! being when its handler finished or when the client hung up. It judges nothing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use actix_web::http::header::HttpDate;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

/// One attempt as the target saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `Idempotency-Key`: `provider:key`.
    pub key: String,
    /// `Hookgate-Attempt`.
    pub attempt: String,
    /// The node that made the attempt: the path's last segment when a node's config names
    /// the target as `/effects/NODE`, empty for plain `/effects`.
    pub node: String,
    pub start: Instant,
    /// When the handler returned, or was dropped because the client went away.
    pub end: Instant,
    /// What the target answered; `None`: the client hung up first.
    pub status: Option<u16>,
}

/// Slow answers: longer than the lease (3 s), shorter than the target timeout (8 s).
const SLOW: std::ops::Range<u64> = 5_000..7_000;

/// `Retry-After` values as RFC 9110 allows them or a careless target sends them: 0 and 1
/// delay-seconds, and garbage. An HTTP-date a few seconds ahead is made at answer time.
const RETRY_AFTERS: [&str; 3] = ["0", "1", "soon, maybe"];

/// Past `u64`'s range of seconds: overflows anything that adds it to a clock. Sent only
/// once [`ChaosTarget::overflow`] is on, so earlier faults meet nodes it has not hurt.
const OVERFLOW_RETRY_AFTER: &str = "18446744073709551615";

/// A year: parks whatever honours it unbounded. Sent only once [`ChaosTarget::year`] is on.
const YEAR_RETRY_AFTER: &str = "31536000";

/// The target's state, shared with the bench.
#[derive(Clone, Default)]
pub struct ChaosTarget {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Every attempt answers 200 at once (the drain).
    pub healthy: Arc<AtomicBool>,
    /// Also send the overflowing `Retry-After`.
    pub overflow: Arc<AtomicBool>,
    /// Also send the year-long `Retry-After`.
    pub year: Arc<AtomicBool>,
    /// Every attempt starting now is slow (so a fault meets deliveries in flight).
    pub all_slow: Arc<AtomicBool>,
    /// How long every answer that is not slow takes, in ms; 0: 2 to 20 ms at random.
    pub pause_ms: Arc<AtomicU64>,
    /// Keys (`provider:key`) whose next attempt is slow: replays meet a long delivery.
    slow_next: Arc<Mutex<HashSet<String>>>,
}

impl ChaosTarget {
    /// Serves on a free loopback port; answers the port.
    pub fn start(&self) -> u16 {
        let state = web::Data::new(self.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .default_service(web::to(receive))
        })
        .workers(1)
        // A client that hangs up ends the connection at once, dropping the handler's
        // future (and so recording the attempt's end); actix's default waits for it.
        .h1_allow_half_closed(false)
        .backlog(4096)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind the chaos target");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        port
    }

    /// Makes the next attempt of `key` (`provider:key`) slow.
    pub fn slow_next(&self, key: String) {
        self.slow_next.lock().unwrap().insert(key);
    }

    /// Every attempt seen so far, open ones excluded.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// An attempt in the handler: recorded when dropped, which actix does when the handler
/// returns or when the client closes the connection first.
struct Open {
    state: web::Data<ChaosTarget>,
    key: String,
    attempt: String,
    node: String,
    start: Instant,
    status: Option<u16>,
}

impl Drop for Open {
    fn drop(&mut self) {
        let seen = Seen {
            key: std::mem::take(&mut self.key),
            attempt: std::mem::take(&mut self.attempt),
            node: std::mem::take(&mut self.node),
            start: self.start,
            end: Instant::now(),
            status: self.status,
        };
        self.state.seen.lock().unwrap().push(seen);
    }
}

/// What one attempt gets.
enum Answer {
    Ok,
    Slow,
    Throttle(u16, String),
    Status(u16),
}

fn choose(state: &ChaosTarget, key: &str) -> Answer {
    if state.healthy.load(Ordering::SeqCst) {
        return Answer::Ok;
    }
    if state.slow_next.lock().unwrap().remove(key) || state.all_slow.load(Ordering::SeqCst) {
        return Answer::Slow;
    }
    match fastrand::u32(0..100) {
        0..=69 => Answer::Ok,
        70..=75 => Answer::Slow,
        76..=83 => {
            let status = if fastrand::bool() { 429 } else { 503 };
            let n = RETRY_AFTERS.len();
            let value = match fastrand::usize(0..n + 3) {
                i if i < n => RETRY_AFTERS[i].to_owned(),
                i if i == n && state.overflow.load(Ordering::SeqCst) => {
                    OVERFLOW_RETRY_AFTER.to_owned()
                }
                i if i == n + 1 && state.year.load(Ordering::SeqCst) => YEAR_RETRY_AFTER.to_owned(),
                // An HTTP-date (IMF-fixdate) a few seconds ahead.
                _ => HttpDate::from(SystemTime::now() + Duration::from_secs(3)).to_string(),
            };
            Answer::Throttle(status, value)
        }
        84..=89 => Answer::Status(400),
        _ => Answer::Status(500),
    }
}

/// Reads the whole body first, as an application does (see `target.rs`).
async fn receive(
    req: HttpRequest,
    _body: web::Bytes,
    state: web::Data<ChaosTarget>,
) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut open = Open {
        state: state.clone(),
        key: header("Idempotency-Key"),
        attempt: header("Hookgate-Attempt"),
        node: req
            .path()
            .strip_prefix("/effects/")
            .unwrap_or_default()
            .to_owned(),
        start: Instant::now(),
        status: None,
    };
    let answer = choose(&state, &open.key);
    let pause = match (&answer, state.pause_ms.load(Ordering::SeqCst)) {
        (Answer::Slow, _) => fastrand::u64(SLOW),
        (_, 0) => fastrand::u64(2..20),
        (_, fixed) => fixed,
    };
    actix_rt::time::sleep(Duration::from_millis(pause)).await;
    let response = match answer {
        Answer::Ok | Answer::Slow => HttpResponse::Ok()
            .content_type("application/json")
            .body(r#"{"ok":true}"#),
        Answer::Throttle(status, value) => {
            let status = actix_web::http::StatusCode::from_u16(status).expect("429 or 503");
            HttpResponse::build(status)
                .insert_header(("Retry-After", value))
                .finish()
        }
        Answer::Status(status) => {
            let status = actix_web::http::StatusCode::from_u16(status).expect("400 or 500");
            HttpResponse::build(status).finish()
        }
    };
    open.status = Some(response.status().as_u16());
    response
}
