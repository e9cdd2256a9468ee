//! The target: a real HTTP server that counts deliveries per `Idempotency-Key`, and can be
//! told to fail or hang.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
}

/// What the target saw of the last delivery of a key.
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
    behaviour: Mutex<Behaviour>,
    release: watch::Sender<bool>,
}

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
        Self {
            url: format!("http://127.0.0.1:{port}/effects"),
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
        Behaviour::Hang => {
            let mut released = state.release.subscribe();
            let _ = released.wait_for(|r| *r).await;
        }
    }
    HttpResponse::Created().json(serde_json::json!({ "received": key }))
}
