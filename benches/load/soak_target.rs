//! The soak's and the keepers scenario's target: answers every delivery 200 at once and
//! remembers which of the run's keys it has seen in a bit set, one bit per event (`soak-N`
//! is bit N), so an hours-long run holds a few MB where the other scenarios' target keeps
//! an entry per key. Counts keys delivered twice, and deliveries of keys the run never
//! sent. It never slows a delivery, and refuses one only while told to
//! ([`SoakTarget::refuse`]: the outage that leaves the keepers scenario's dead letters);
//! these runs measure retention, not redelivery.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

/// The prefix of the run's keys; the sequence number follows it.
pub const KEY_PREFIX: &str = "soak-";

/// What the target saw so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub deliveries: u64,
    /// Keys delivered more than once.
    pub duplicates: u64,
    /// Deliveries whose key is not one of the run's (`soak-N`).
    pub foreign: u64,
    /// Deliveries answered 400 while refusing ([`SoakTarget::refuse`]), not counted above.
    pub refused: u64,
}

#[derive(Default)]
struct Seen {
    /// Bit N set: `soak-N` was delivered.
    bits: Vec<u64>,
    tally: Tally,
}

/// The running target.
pub struct SoakTarget {
    pub url: String,
    seen: Arc<Mutex<Seen>>,
    refusing: Arc<AtomicBool>,
}

impl SoakTarget {
    /// Binds a free loopback port with one worker.
    pub fn start() -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let refusing = Arc::new(AtomicBool::new(false));
        let state = web::Data::new(Arc::clone(&seen));
        let refuse = web::Data::new(Arc::clone(&refusing));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(refuse.clone())
                // Any body hookgate forwards (the keepers scenario's are 1 MiB by hand):
                // past actix-web's 256 KiB default the target would answer 413, not 400.
                .app_data(web::PayloadConfig::new(64 << 20))
                .default_service(web::to(receive))
        })
        .workers(1)
        .backlog(4096)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind the soak target");
        let port = server.addrs()[0].port();
        actix_rt::spawn(server.run());
        Self {
            url: format!("http://127.0.0.1:{port}/effects"),
            seen,
            refusing,
        }
    }

    /// While `on`, every delivery is answered 400 (a final refusal: hookgate makes the
    /// event a dead letter at once) and counted as refused, whatever its key.
    pub fn refuse(&self, on: bool) {
        self.refusing.store(on, Ordering::SeqCst);
    }

    pub fn tally(&self) -> Tally {
        self.seen.lock().expect("the target's counts").tally
    }
}

/// Reads the whole body (an unread body makes actix-web close the connection), marks the
/// key's bit, answers 200; or, while refusing, counts the delivery and answers 400.
async fn receive(
    req: HttpRequest,
    _body: web::Bytes,
    seen: web::Data<Arc<Mutex<Seen>>>,
    refusing: web::Data<Arc<AtomicBool>>,
) -> HttpResponse {
    if refusing.load(Ordering::SeqCst) {
        seen.lock().expect("the target's counts").tally.refused += 1;
        return HttpResponse::BadRequest()
            .content_type("application/json")
            .body(r#"{"error":"outage"}"#);
    }
    // hookgate sends `provider:key`.
    let number = req
        .headers()
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit_once(KEY_PREFIX))
        .and_then(|(_, n)| n.parse::<usize>().ok());
    {
        let mut seen = seen.lock().expect("the target's counts");
        seen.tally.deliveries += 1;
        match number {
            Some(n) => {
                let (word, bit) = (n / 64, 1u64 << (n % 64));
                if seen.bits.len() <= word {
                    seen.bits.resize(word + 1, 0);
                }
                if seen.bits[word] & bit != 0 {
                    seen.tally.duplicates += 1;
                }
                seen.bits[word] |= bit;
            }
            None => seen.tally.foreign += 1,
        }
    }
    HttpResponse::Ok()
        .content_type("application/json")
        .body(r#"{"ok":true}"#)
}
