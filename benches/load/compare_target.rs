//! The queue comparison's target, the same for hookgate and graphile-worker: a fast
//! loopback HTTP server (one worker thread, as the load bench's `target.rs`) that answers
//! 200, counts 2xx deliveries per `Idempotency-Key`, and keeps when each key first
//! arrived — for the burn-down's end and the ingest run's 202→target latency.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

use crate::shards::Shards;

/// A gap between two new keys at the target longer than this is reported as a pause: at
/// a thousand deliveries a second and more, a quarter second without one is no accident.
pub const PAUSE: Duration = Duration::from_millis(250);

/// What arrived.
#[derive(Default)]
struct Seen {
    /// Deliveries of each key, and when its first one arrived; split by key (see
    /// `shards.rs`: one map would stall every delivery as it doubles, and show as a pause).
    keys: Shards<HashMap<String, (u32, Instant)>>,
    times: Mutex<Times>,
}

#[derive(Default)]
struct Times {
    /// When the first key arrived.
    first: Option<Instant>,
    /// When the last new key arrived.
    last_new: Option<Instant>,
    deliveries: u64,
}

/// The running target.
#[derive(Clone)]
pub struct CompareTarget {
    pub url: String,
    seen: Arc<Seen>,
}

impl CompareTarget {
    /// Binds a free loopback port and serves on this actix system.
    pub fn start() -> Self {
        let seen = Arc::new(Seen::default());
        let state = web::Data::new(Arc::clone(&seen));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .default_service(web::to(receive))
        })
        .workers(1)
        .backlog(4096)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind the comparison target");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        Self {
            url: format!("http://127.0.0.1:{port}/effects"),
            seen,
        }
    }

    /// Distinct keys delivered.
    pub fn keys(&self) -> usize {
        let mut n = 0;
        self.seen.keys.each(|shard| n += shard.len());
        n
    }

    /// Deliveries in all, and keys delivered more than once.
    pub fn deliveries_and_duplicates(&self) -> (u64, u64) {
        let mut duplicates = 0;
        self.seen
            .keys
            .each(|shard| duplicates += shard.values().filter(|(n, _)| *n > 1).count() as u64);
        (self.seen.times.lock().unwrap().deliveries, duplicates)
    }

    /// When the first key arrived.
    pub fn first(&self) -> Option<Instant> {
        self.seen.times.lock().unwrap().first
    }

    /// When the last key not seen before arrived.
    pub fn last_new(&self) -> Option<Instant> {
        self.seen.times.lock().unwrap().last_new
    }

    /// Pauses longer than `longer_than` between one new key and the next, from the first
    /// to the last: how many, and their total length (time the worker delivered nothing
    /// new while work was left).
    pub fn pauses(&self, longer_than: Duration) -> (u64, Duration) {
        let mut firsts: Vec<Instant> = Vec::new();
        self.seen
            .keys
            .each(|shard| firsts.extend(shard.values().map(|&(_, at)| at)));
        firsts.sort_unstable();
        firsts
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|&gap| gap > longer_than)
            .fold((0, Duration::ZERO), |(n, total), gap| (n + 1, total + gap))
    }

    /// When `key` first arrived, for each key asked about.
    pub fn first_arrivals<'a>(&self, keys: impl Iterator<Item = &'a str>) -> Vec<Option<Instant>> {
        keys.map(|k| self.seen.keys.lock(k).get(k).map(|&(_, at)| at))
            .collect()
    }
}

/// Reads the whole body (an application does; actix-web closes a connection whose body was
/// left unread) and answers 200.
async fn receive(req: HttpRequest, _body: web::Bytes, seen: web::Data<Arc<Seen>>) -> HttpResponse {
    let now = Instant::now();
    let key = req
        .headers()
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    {
        let new = {
            let mut shard = seen.keys.lock(&key);
            let entry = shard.entry(key).or_insert((0, now));
            entry.0 += 1;
            entry.0 == 1
        };
        let mut times = seen.times.lock().unwrap();
        times.deliveries += 1;
        if new {
            times.first.get_or_insert(now);
            times.last_new = times.last_new.max(Some(now));
        }
    }
    HttpResponse::Ok()
        .content_type("application/json")
        .body(r#"{"ok":true}"#)
}
