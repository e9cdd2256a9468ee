//! The keepers scenario's probe: how long a claim waits behind the ring, seen from the
//! claim's side. Every [`PERIOD`] a connection of its own takes the lock a claim takes on
//! the events (`ROW EXCLUSIVE` on the parent; the ring's `EXCLUSIVE` conflicts with it) and
//! lets it go at once, and records how long taking it took. It holds the lock for one
//! round trip; it never writes.
//!
//! A probe that waits does not run the probes due meanwhile, so a lock held for a second
//! would give one sample of a second among a hundred of none, and its p99 would hide it.
//! Each wait therefore also counts the waits the probes due during it would have had (the
//! rest of it, a period less each time), as claims arriving then would: the samples stand
//! for every moment of the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the probe takes the lock: often enough that a lock held for tens of
/// milliseconds is met several times, and its own round trips (well under a millisecond)
/// stay a small share of a core.
const PERIOD: Duration = Duration::from_millis(10);

/// The probe's statement: the lock a claim's `INSERT … ON CONFLICT` or `UPDATE` takes on
/// the events' parent first (it then locks the partitions it touches, which the ring does
/// not lock).
const LOCK: &str = "LOCK TABLE ONLY webhook_events IN ROW EXCLUSIVE MODE";

/// How long one probe waits for the lock before it gives up (and records that long):
/// longer than any store deadline, so a wedge shows at its full length.
const LOCK_TIMEOUT: &str = "10s";

/// The probe, running on a thread of its own so that the node's work on the bench's
/// threads does not delay it.
pub struct Probe {
    waits: Arc<Mutex<Vec<u32>>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Probe {
    /// Starts probing the events of `schema` at `url`.
    pub fn start(url: &str, schema: &str) -> Self {
        let waits = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (url, schema) = (url.to_owned(), schema.to_owned());
        let (shared, stopped) = (Arc::clone(&waits), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("keepers-probe".into())
            .spawn(move || {
                actix_rt::System::new().block_on(probe(url, schema, shared, stopped));
            })
            .expect("start the lock probe");
        Self {
            waits,
            stop,
            thread,
        }
    }

    /// The waits since the last call, in µs.
    pub fn take_window(&self) -> Vec<u32> {
        std::mem::take(&mut *self.waits.lock().expect("the probe's waits"))
    }

    /// Stops the probe (after the wait in progress, at most [`LOCK_TIMEOUT`]).
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
    }
}

async fn probe(url: String, schema: String, waits: Arc<Mutex<Vec<u32>>>, stop: Arc<AtomicBool>) {
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect the lock probe");
    actix_rt::spawn(connection);
    client
        .batch_execute(&format!("SET search_path TO {schema}"))
        .await
        .expect("the probe's schema");
    let begin = format!("BEGIN; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'");
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) && !client.is_closed() {
        actix_rt::time::sleep_until(next.into()).await;
        if client.batch_execute(&begin).await.is_err() {
            continue;
        }
        let asked = Instant::now();
        // A lock timeout is a wait of LOCK_TIMEOUT, recorded as such.
        let _ = client.batch_execute(LOCK).await;
        let waited = asked.elapsed();
        let _ = client.batch_execute("ROLLBACK").await;
        {
            let mut waits = waits.lock().expect("the probe's waits");
            let mut rest = waited;
            loop {
                waits.push(rest.as_micros().min(u128::from(u32::MAX)) as u32);
                if rest <= PERIOD {
                    break;
                }
                rest -= PERIOD;
            }
        }
        // The probes due while this one waited are counted above.
        next = (next + PERIOD).max(Instant::now());
    }
}
