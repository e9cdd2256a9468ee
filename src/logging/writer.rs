//! The log writer thread. A record is copied onto a bounded channel on the caller's thread
//! (or dropped, and counted, when the channel is full: blocking a shard on stdout would be
//! worse than losing a line). The thread wakes for the first record, lets the next ones
//! gather for [`BATCH_WINDOW`], formats all of them and writes them out at once: one
//! wake-up and one `write` for every batch instead of one of each per line, and no line
//! waits longer than the window (plus formatting) to be written.
//!
//! A record's control characters are escaped (`\x1b`), its final newline kept, so a value
//! an unauthenticated caller chose can neither forge a line nor send escape sequences to a
//! terminal, whatever the format. Every dropped record is counted in [`dropped_total`].

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, LazyLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use slog::{Drain, Never, OwnedKVList, Record};
use slog_async::AsyncRecord;

/// How long the thread lets records gather after the first one wakes it.
pub const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// Records one batch takes at most, so that a flood of them is still written as it goes.
const BATCH_RECORDS: usize = 1024;

/// Records dropped since the process started, over every writer: a counter the node's
/// metrics serve (a clone shares the count).
static DROPPED_TOTAL: LazyLock<Counter> = LazyLock::new(Counter::default);

/// The process's count of dropped log records, as a metric to register.
pub fn dropped_total() -> Counter {
    DROPPED_TOTAL.clone()
}

/// Where the formatting drain writes a batch's lines until the thread writes them out.
/// It lives on the writer thread only, so it needs no lock.
#[derive(Clone, Default)]
pub struct Lines(Rc<RefCell<Vec<u8>>>);

impl Lines {
    /// Writes what gathered to `out` and empties it (keeping its memory for the next).
    fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut lines = self.0.borrow_mut();
        let written = out.write_all(&lines).and_then(|()| out.flush());
        lines.clear();
        written
    }

    /// Escapes every control character of what was written from `start` on (one record),
    /// except the newline that ends it.
    fn escape_controls_from(&self, start: usize) {
        let mut lines = self.0.borrow_mut();
        let record = &lines[start..];
        let body = record.strip_suffix(b"\n").unwrap_or(record);
        let control = |b: u8| b < 0x20 || b == 0x7f;
        if !body.iter().copied().any(control) {
            return;
        }
        let body_len = body.len();
        let written = lines.split_off(start);
        for (i, &b) in written.iter().enumerate() {
            if control(b) && i < body_len {
                lines.extend_from_slice(format!("\\x{b:02x}").as_bytes());
            } else {
                lines.push(b);
            }
        }
    }

    fn len(&self) -> usize {
        self.0.borrow().len()
    }
}

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

enum Message {
    Record(AsyncRecord),
    Stop,
}

/// The drain callers log to: hands each record to the writer thread.
pub struct Batched {
    records: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

impl Drain for Batched {
    type Ok = ();
    type Err = Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), Never> {
        let message = Message::Record(AsyncRecord::from(record, values));
        if self.records.try_send(message).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            DROPPED_TOTAL.inc();
        }
        Ok(())
    }
}

/// Stops the writer thread when dropped, after it wrote every record logged before.
pub struct Guard {
    records: SyncSender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.records.send(Message::Stop).is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// Starts the writer thread: the drain `format` makes (on that thread) turns each record
/// into text in the [`Lines`] it is given, and every batch of it is written to `out`. At
/// most `capacity` records wait for the thread.
pub fn start<D>(
    format: impl FnOnce(Lines) -> D + Send + 'static,
    out: impl Write + Send + 'static,
    capacity: usize,
) -> std::io::Result<(Batched, Guard)>
where
    D: Drain<Ok = (), Err = Never>,
{
    let (records, queue) = sync_channel(capacity);
    let dropped = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&dropped);
    let thread = thread::Builder::new()
        .name("hookgate-log".into())
        .spawn(move || {
            let lines = Lines::default();
            run(queue, &format(lines.clone()), &lines, out, &counted);
        })?;
    let drain = Batched {
        records: records.clone(),
        dropped,
    };
    Ok((
        drain,
        Guard {
            records,
            thread: Some(thread),
        },
    ))
}

fn run<D>(
    queue: Receiver<Message>,
    format: &D,
    lines: &Lines,
    mut out: impl Write,
    dropped: &AtomicU64,
) where
    D: Drain<Ok = (), Err = Never>,
{
    while let Ok(first) = queue.recv() {
        let mut stop = matches!(first, Message::Stop);
        if !stop {
            thread::sleep(BATCH_WINDOW);
        }
        let waiting = queue.try_iter().take(BATCH_RECORDS - 1);
        for message in std::iter::once(first).chain(waiting) {
            match message {
                Message::Record(record) => {
                    let start = lines.len();
                    let _ = record.log_to(format);
                    lines.escape_controls_from(start);
                }
                Message::Stop => {
                    stop = true;
                    break;
                }
            }
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            report_dropped(format, lost);
        }
        // Nothing to do about a failed write to stdout but to go on.
        let _ = lines.write_to(&mut out);
        if stop {
            break;
        }
    }
}

/// Says, in the log itself, how many records were dropped since the last batch.
fn report_dropped<D>(format: &D, count: u64)
where
    D: Drain<Ok = (), Err = Never>,
{
    let values = slog::o!("service" => "hookgate").into();
    let _ = format.log(
        &slog::record!(
            slog::Level::Error,
            "",
            &format_args!("log lines dropped: the log writer fell behind"),
            slog::b!("count" => count)
        ),
        &values,
    );
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Sender};
    use std::sync::Mutex;

    use super::*;

    /// An output that records each `write` call; with a gate, every write first says it
    /// has begun and then waits for the test's go-ahead (a test drops its side of the
    /// gate before the guard, so a writer making more writes than expected cannot hang
    /// it: the extra writes pass and the assertions fail).
    struct Out {
        writes: Arc<Mutex<Vec<String>>>,
        gate: Option<(Sender<()>, Receiver<()>)>,
    }

    impl Write for Out {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            // Once the test has dropped its side of the gate, writes go straight through.
            if let Some((begun, go)) = &self.gate {
                let _ = begun.send(());
                let _ = go.recv();
            }
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            self.writes.lock().unwrap().push(text);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Gate {
        begun: Receiver<()>,
        go: Sender<()>,
    }

    impl Gate {
        /// Waits until the writer thread is inside a write (a deadline, not a pause: it
        /// fails the test instead of hanging it).
        fn begun(&self) {
            self.begun
                .recv_timeout(Duration::from_secs(30))
                .expect("the writer thread began a write");
        }

        /// Lets the write in progress finish, then `more` writes after it.
        fn let_through(&self, more: usize) {
            self.go.send(()).unwrap();
            for _ in 0..more {
                self.begun();
                self.go.send(()).unwrap();
            }
        }
    }

    /// A JSON logger on a writer thread over `Out`, with a gate when `gated`.
    fn logger(
        capacity: usize,
        gated: bool,
    ) -> (slog::Logger, Guard, Arc<Mutex<Vec<String>>>, Option<Gate>) {
        let format = |lines| {
            slog_json::Json::new(lines)
                .add_default_keys()
                .build()
                .fuse()
        };
        let writes = Arc::new(Mutex::new(Vec::new()));
        let (gate, test_side) = if gated {
            let (begun_tx, begun) = channel();
            let (go, go_rx) = channel();
            (Some((begun_tx, go_rx)), Some(Gate { begun, go }))
        } else {
            (None, None)
        };
        let out = Out {
            writes: Arc::clone(&writes),
            gate,
        };
        let (drain, guard) = start(format, out, capacity).unwrap();
        (
            slog::Logger::root(drain, slog::o!()),
            guard,
            writes,
            test_side,
        )
    }

    /// Logs "first" and, while the writer thread is inside that write, runs `meanwhile`;
    /// then lets that write and `more` after it through, stops the thread and returns
    /// every write it made.
    fn while_stuck(
        capacity: usize,
        meanwhile: impl FnOnce(&slog::Logger),
        more: usize,
    ) -> Vec<String> {
        let (log, guard, writes, gate) = logger(capacity, true);
        let gate = gate.unwrap();
        slog::info!(log, "first");
        gate.begun();
        meanwhile(&log);
        gate.let_through(more);
        drop(gate);
        drop(guard);
        let writes = writes.lock().unwrap().clone();
        writes
    }

    #[test]
    fn control_characters_in_a_term_record_are_escaped_and_cannot_forge_a_line() {
        let format = |lines| {
            let decorator = slog_term::PlainDecorator::new(lines);
            slog_term::FullFormat::new(decorator).build().fuse()
        };
        let writes = Arc::new(Mutex::new(Vec::new()));
        let out = Out {
            writes: Arc::clone(&writes),
            gate: None,
        };
        let (drain, guard) = start(format, out, 16).unwrap();
        let log = slog::Logger::root(drain, slog::o!());
        slog::info!(log, "seen"; "provider" => "x\nINFO forged line\x1b[31m");
        drop(guard);
        let text = writes.lock().unwrap().concat();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(text.ends_with('\n'));
        assert!(text.contains("x\\x0aINFO forged line\\x1b[31m"), "{text:?}");
    }

    fn messages(write: &str) -> Vec<serde_json::Value> {
        write
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn what_arrives_while_a_batch_is_written_goes_out_in_one_write() {
        let burst = |log: &slog::Logger| {
            for n in 0..50 {
                slog::info!(log, "burst"; "n" => n);
            }
        };
        let writes = while_stuck(100, burst, 1);
        assert_eq!(
            writes.len(),
            2,
            "one write per batch, not per line: {writes:?}"
        );
        assert_eq!(messages(&writes[0])[0]["msg"], "first");
        let burst = messages(&writes[1]);
        assert_eq!(burst.len(), 50);
        for (n, line) in burst.iter().enumerate() {
            assert_eq!(
                (line["msg"].as_str(), line["n"].as_u64()),
                (Some("burst"), Some(n as u64))
            );
        }
    }

    #[test]
    fn a_flood_is_written_in_batches_of_at_most_batch_records() {
        let flood = |log: &slog::Logger| {
            for n in 0..BATCH_RECORDS + 10 {
                slog::info!(log, "flood"; "n" => n);
            }
        };
        let writes = while_stuck(2 * BATCH_RECORDS, flood, 2);
        let sizes: Vec<_> = writes.iter().map(|w| w.lines().count()).collect();
        assert_eq!(sizes, [1, BATCH_RECORDS, 10]);
    }

    #[test]
    fn records_past_the_capacity_are_dropped_counted_and_the_count_logged() {
        // The writer is stuck in a write: two records wait, eight are dropped, and
        // logging them never blocks.
        let ten = |log: &slog::Logger| {
            for n in 0..10 {
                slog::info!(log, "waiting"; "n" => n);
            }
        };
        let before = dropped_total().get();
        let writes = while_stuck(2, ten, 1);
        assert!(
            dropped_total().get() >= before + 8,
            "the process-wide count"
        );
        let second = messages(&writes[1]);
        let kept: Vec<_> = second.iter().filter(|l| l["msg"] == "waiting").collect();
        assert_eq!(kept.len(), 2);
        let report = second.iter().find(|l| l["msg"] != "waiting").unwrap();
        assert_eq!(report["count"], 8, "{report}");
        assert!(report["msg"].as_str().unwrap().contains("dropped"));
    }

    #[test]
    fn dropping_the_guard_writes_every_line_logged_before() {
        let (log, guard, writes, _) = logger(100, false);
        for n in 0..3 {
            slog::info!(log, "line"; "n" => n);
        }
        drop(guard);
        let written: Vec<_> = writes
            .lock()
            .unwrap()
            .iter()
            .flat_map(|w| messages(w))
            .collect();
        let numbers: Vec<_> = written.iter().map(|l| l["n"].as_u64().unwrap()).collect();
        assert_eq!(numbers, [0, 1, 2]);
    }
}
