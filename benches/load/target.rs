//! The bench's target: a fast in-process HTTP server that counts deliveries per
//! `Idempotency-Key` and attempt, and can fail a fraction of them or add latency.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

use crate::shards::Shards;

/// How the target behaves during one scenario.
#[derive(Debug, Clone, Copy, Default)]
pub struct Behaviour {
    /// Fraction of deliveries answered 500, `0.0..1.0`.
    pub fail_rate: f64,
    /// Added before answering.
    pub delay: Duration,
}

/// What one shard of the keys saw.
#[derive(Default)]
struct KeyCounts {
    /// Successful deliveries per key.
    ok: HashMap<String, u32>,
    /// Deliveries per (key, attempt): more than one means an attempt ran twice.
    attempts: HashMap<(String, String), u32>,
}

#[derive(Default)]
struct Counts {
    /// Split by key (see `shards.rs`: one map would stall every delivery as it doubles).
    keys: Shards<KeyCounts>,
    total: AtomicU64,
}

/// The running target.
#[derive(Clone)]
pub struct Target {
    pub url: String,
    counts: Arc<Counts>,
}

/// What the target saw.
#[derive(Debug, Default)]
pub struct Tally {
    pub deliveries: u64,
    /// Keys delivered successfully more than once, plus attempts delivered more than once.
    pub duplicates: u64,
}

impl Target {
    pub fn start(behaviour: Behaviour, listen: &str) -> Self {
        let counts = Arc::new(Counts::default());
        let state = web::Data::new((Arc::clone(&counts), behaviour));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .default_service(web::to(receive))
        })
        .workers(1)
        .backlog(4096)
        .disable_signals()
        .bind(listen)
        .expect("bind the bench target");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        Self {
            url: format!("http://127.0.0.1:{port}/effects"),
            counts,
        }
    }

    pub fn tally(&self) -> Tally {
        let mut duplicates = 0;
        self.counts.keys.each(|shard| {
            let dup_ok = shard.ok.values().filter(|&&n| n > 1).count() as u64;
            let dup_attempts = shard.attempts.values().filter(|&&n| n > 1).count() as u64;
            duplicates += dup_ok + dup_attempts;
        });
        Tally {
            deliveries: self.counts.total.load(Ordering::Relaxed),
            duplicates,
        }
    }
}

type State = (Arc<Counts>, Behaviour);

/// Reads the whole body, as an application does: actix-web closes a connection whose
/// request body was left unread, which would cost hookgate a new connection per delivery.
async fn receive(req: HttpRequest, _body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    let (counts, behaviour) = state.get_ref();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let key = header("Idempotency-Key");
    let attempt = header("Hookgate-Attempt");
    if !behaviour.delay.is_zero() {
        actix_rt::time::sleep(behaviour.delay).await;
    }
    let fail = behaviour.fail_rate > 0.0 && fastrand::f64() < behaviour.fail_rate;
    {
        counts.total.fetch_add(1, Ordering::Relaxed);
        let mut shard = counts.keys.lock(&key);
        *shard.attempts.entry((key.clone(), attempt)).or_default() += 1;
        if !fail {
            *shard.ok.entry(key).or_default() += 1;
        }
    }
    if fail {
        HttpResponse::InternalServerError().finish()
    } else {
        HttpResponse::Ok()
            .content_type("application/json")
            .body(r#"{"ok":true}"#)
    }
}
