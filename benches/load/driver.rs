//! The load driver: `connections` closed-loop clients, each on its own keep-alive
//! connection, sending until the duration or the request budget runs out, recording every
//! latency and status. Loopback only.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::scenario::Scenario;

/// What one run measured.
#[derive(Debug, Default)]
pub struct Report {
    pub requests: u64,
    pub elapsed: Duration,
    pub latencies_us: Vec<u32>,
    pub statuses: BTreeMap<u16, u64>,
    pub errors: u64,
}

/// The `p` quantile of `sorted` latencies (µs), in ms; 0 when there are none.
fn percentile_ms(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

impl Report {
    fn percentile(&self, p: f64) -> f64 {
        percentile_ms(&self.latencies_us, p)
    }

    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    pub fn p50_ms(&self) -> f64 {
        self.percentile(0.50)
    }

    pub fn p99_ms(&self) -> f64 {
        self.percentile(0.99)
    }

    pub fn max_ms(&self) -> f64 {
        self.latencies_us
            .last()
            .map_or(0.0, |&u| f64::from(u) / 1000.0)
    }
}

/// The requests a drive sends: how many at most, how fast, how large.
pub struct Requests {
    /// Most requests.
    pub max: u64,
    /// Requests a second over all connections (`None`: each as soon as the last is answered).
    pub rate: Option<u64>,
    /// Bytes of each body (`None`: the bare body).
    pub payload_bytes: Option<usize>,
}

/// An event's JSON body, padded to `bytes` with a `pad` field when asked.
fn body(key: &str, bytes: Option<usize>) -> String {
    let bare = format!(r#"{{"id":"{key}","type":"bench.event"}}"#);
    match bytes {
        Some(n) if n > bare.len() + 10 => format!(
            r#"{{"id":"{key}","type":"bench.event","pad":"{}"}}"#,
            "x".repeat(n - bare.len() - 9)
        ),
        _ => bare,
    }
}

/// Drives `scenario` against `urls` (`…/webhooks/{provider}`): with several, each event
/// (key) is sent to every one in turn, a request each. With `rate` (requests a second, over
/// all connections) each connection paces its requests instead of sending the next as soon
/// as the last is answered.
pub async fn drive(
    urls: Vec<String>,
    scenario: Scenario,
    connections: usize,
    duration: Duration,
    window: Option<Duration>,
    requests: Requests,
) -> Report {
    let Requests {
        max: max_requests,
        rate,
        payload_bytes,
    } = requests;
    let every = rate.map(|r| Duration::from_secs_f64(connections as f64 / r.max(1) as f64));
    let started = Instant::now();
    let deadline = started + duration;
    let sent = Rc::new(RefCell::new(0u64));
    let answered = Rc::new(std::cell::Cell::new(0u64));
    // The latencies answered in the window running now (kept only with `window`).
    let recent: Rc<RefCell<Vec<u32>>> = Rc::default();
    let reporter = window.map(|every| {
        let answered = Rc::clone(&answered);
        let recent = Rc::clone(&recent);
        actix_rt::spawn(async move {
            let mut last = 0;
            for n in 1.. {
                actix_rt::time::sleep_until((started + every * n).into()).await;
                let now = answered.get();
                let mut latencies = std::mem::take(&mut *recent.borrow_mut());
                latencies.sort_unstable();
                println!(
                    "# window {n} ({:.0}s): {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, \
                     max {:.2} ms, {now} answered so far",
                    (every * n).as_secs_f64(),
                    (now - last) as f64 / every.as_secs_f64(),
                    percentile_ms(&latencies, 0.50),
                    percentile_ms(&latencies, 0.99),
                    percentile_ms(&latencies, 1.0),
                );
                last = now;
            }
        })
    });
    let mut tasks = Vec::new();
    for conn in 0..connections {
        let urls = urls.clone();
        let sent = Rc::clone(&sent);
        let answered = Rc::clone(&answered);
        let recent = window.map(|_| Rc::clone(&recent));
        tasks.push(actix_rt::spawn(async move {
            let client = awc::Client::builder()
                .timeout(Duration::from_secs(60))
                .finish();
            let mut report = Report::default();
            let mut i = 0u64;
            loop {
                {
                    let mut sent = sent.borrow_mut();
                    if Instant::now() >= deadline || *sent >= max_requests {
                        break;
                    }
                    *sent += 1;
                }
                if let Some(every) = every {
                    // Request i of this connection is due at its slot, the connections'
                    // slots spread over one interval.
                    let offset = every.mul_f64(conn as f64 / connections as f64);
                    let due = started + offset + every.mul_f64(i as f64);
                    actix_rt::time::sleep_until(due.into()).await;
                }
                let url = &urls[(i % urls.len() as u64) as usize];
                let key = scenario.key(conn, i / urls.len() as u64, started.elapsed());
                i += 1;
                let body = body(&key, payload_bytes);
                let t = Instant::now();
                let result = client
                    .post(url)
                    .insert_header(("Content-Type", "application/json"))
                    .insert_header(("X-Idempotency-Key", key.as_str()))
                    .send_body(body)
                    .await;
                match result {
                    Ok(mut response) => {
                        let _ = response.body().await;
                        let us = t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
                        report.latencies_us.push(us);
                        if let Some(recent) = &recent {
                            recent.borrow_mut().push(us);
                        }
                        *report
                            .statuses
                            .entry(response.status().as_u16())
                            .or_default() += 1;
                        report.requests += 1;
                        answered.set(answered.get() + 1);
                    }
                    Err(_) => report.errors += 1,
                }
            }
            report
        }));
    }
    let mut total = Report::default();
    for task in tasks {
        let Ok(report) = task.await else { continue };
        total.requests += report.requests;
        total.errors += report.errors;
        total.latencies_us.extend(report.latencies_us);
        for (status, n) in report.statuses {
            *total.statuses.entry(status).or_default() += n;
        }
    }
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    total.elapsed = started.elapsed();
    total.latencies_us.sort_unstable();
    total
}
