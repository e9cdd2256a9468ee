//! The soak run's senders: `connections` clients on keep-alive connections posting events
//! with new keys (`soak-0`, `soak-1`, …) — or, in the redelivery phase, keys of the
//! prefill's rows — event N due `N / rate` seconds after the start (with rate 0, as fast
//! as the answers come), until the deadline. Each answer's latency
//! and status go into the current window, which the reporter takes each window. Runs on a
//! thread of its own so its CPU can be told apart from the node's.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::soak_target::KEY_PREFIX;
use hookgate_kit::proc_cpu;

/// How long one request may take before it counts as an error: far above any answer of a
/// healthy node, so only a stuck one shows.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The answers of one window.
#[derive(Debug, Default)]
pub struct Window {
    /// Latency of every answer, in µs.
    pub latencies_us: Vec<u32>,
    /// 2xx answers: events the node took.
    pub accepted: u64,
    /// Other answers (503 `overloaded` and the like); the event is not sent again.
    pub refused: u64,
    /// The other answers by status and `Hookgate-Path` (`"503/overloaded"`), so a run
    /// says what it was refused, not only how often.
    pub refused_by: BTreeMap<String, u64>,
    /// Requests that got no answer.
    pub errors: u64,
}

/// Which keys the senders post.
#[derive(Debug, Clone, Copy)]
pub enum Keys {
    /// New keys, `soak-N`: first runs.
    New,
    /// Keys of done rows the prefill wrote, `{prefix}I` for I below `rows`, spread over
    /// them (I = N × a large prime mod `rows`, so N < `rows` never repeats one): duplicates
    /// the node's cache has never seen, answered from their rows.
    Prefilled { prefix: &'static str, rows: u64 },
}

impl Keys {
    /// The key of the run's event `n`.
    fn key(self, n: u64) -> String {
        match self {
            Self::New => format!("{KEY_PREFIX}{n}"),
            Self::Prefilled { prefix, rows } => {
                // A prime larger than any prefill, so coprime with `rows`.
                const SPREAD: u128 = 2_305_843_009_213_693_951;
                let i = (u128::from(n) * SPREAD % u128::from(rows.max(1))) as u64;
                format!("{prefix}{i}")
            }
        }
    }
}

/// The senders, running.
pub struct Ingest {
    window: Arc<Mutex<Window>>,
    thread: JoinHandle<()>,
    /// The sending thread's id, for its CPU time while it runs.
    tid: Option<u32>,
    /// Its CPU ticks when it ended (its /proc entry goes with it).
    last_ticks: Arc<AtomicU64>,
}

impl Ingest {
    /// Starts sending `keys` to `url` (`…/webhooks/{provider}`) until `deadline`.
    pub fn start(
        url: String,
        keys: Keys,
        connections: usize,
        rate: u64,
        deadline: Instant,
    ) -> Self {
        let window = Arc::new(Mutex::new(Window::default()));
        let shared = Arc::clone(&window);
        let last_ticks = Arc::new(AtomicU64::new(0));
        let at_end = Arc::clone(&last_ticks);
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("soak-driver".into())
            .spawn(move || {
                let _ = tid_tx.send(proc_cpu::this_thread_id());
                actix_rt::System::new().block_on(send(
                    url,
                    keys,
                    connections,
                    rate,
                    deadline,
                    shared,
                ));
                at_end.store(proc_cpu::this_thread_ticks(), Ordering::SeqCst);
            })
            .expect("start the soak's senders");
        let tid = tid_rx.recv().ok().flatten();
        Self {
            window,
            thread,
            tid,
            last_ticks,
        }
    }

    /// The answers since the last call.
    pub fn take_window(&self) -> Window {
        std::mem::take(&mut *self.window.lock().expect("the soak's window"))
    }

    /// The senders' CPU ticks so far (their thread's).
    pub fn ticks(&self) -> u64 {
        match self.tid.map_or(0, proc_cpu::thread_ticks) {
            0 => self.last_ticks.load(Ordering::SeqCst),
            live => live,
        }
    }

    /// Whether every sender has stopped (the deadline passed, their last answers came).
    pub fn finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// The senders' loop, on the driver thread's own actix system.
async fn send(
    url: String,
    keys: Keys,
    connections: usize,
    rate: u64,
    deadline: Instant,
    window: Arc<Mutex<Window>>,
) {
    let started = Instant::now();
    let next = Rc::new(Cell::new(0u64));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (url, next, window) = (url.clone(), Rc::clone(&next), Arc::clone(&window));
        tasks.push(actix_rt::spawn(async move {
            let client = awc::Client::builder().timeout(REQUEST_TIMEOUT).finish();
            loop {
                let n = next.get();
                next.set(n + 1);
                if rate > 0 {
                    let due = started + Duration::from_secs_f64(n as f64 / rate as f64);
                    if due >= deadline {
                        break;
                    }
                    actix_rt::time::sleep_until(due.into()).await;
                } else if Instant::now() >= deadline {
                    break;
                }
                let key = keys.key(n);
                let sent = Instant::now();
                let answer = client
                    .post(&url)
                    .insert_header(("Content-Type", "application/json"))
                    .insert_header(("X-Idempotency-Key", key.as_str()))
                    .send_body(format!(r#"{{"id":"{key}","type":"bench.soak"}}"#))
                    .await;
                let status = match answer {
                    Ok(mut response) => {
                        let _ = response.body().await;
                        let path = response
                            .headers()
                            .get("Hookgate-Path")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned();
                        Some((response.status(), path))
                    }
                    Err(_) => None,
                };
                let us = sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                let mut window = window.lock().expect("the soak's window");
                match status {
                    Some((s, _)) if s.is_success() => {
                        window.accepted += 1;
                        window.latencies_us.push(us);
                    }
                    Some((s, path)) => {
                        window.refused += 1;
                        *window
                            .refused_by
                            .entry(format!("{}/{path}", s.as_u16()))
                            .or_default() += 1;
                        window.latencies_us.push(us);
                    }
                    None => window.errors += 1,
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}
