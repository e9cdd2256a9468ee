//! Capturing a node's JSON log lines, in the production drain format, for assertions.

use std::sync::{Arc, Mutex};

/// Log lines a node wrote, as JSON values (the same drain format as production).
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    pub fn logger(&self) -> slog::Logger {
        use slog::Drain;
        let drain = slog_json::Json::new(self.clone())
            .add_default_keys()
            .build();
        slog::Logger::root(Mutex::new(drain).fuse(), slog::o!())
    }

    /// Every finished line so far (one being written while a test reads — the node logs
    /// as it runs — has no newline yet and is left for the next read).
    pub fn lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| serde_json::from_str(l).expect("a JSON log line"))
            .collect()
    }

    /// Lines with message `msg` whose `event_key` is `key`.
    pub fn events(&self, msg: &str, key: &str) -> Vec<serde_json::Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["msg"] == msg && l["event_key"] == key)
            .collect()
    }

    /// How many lines have message `msg`, whatever they are about.
    pub fn count(&self, msg: &str) -> usize {
        self.lines().iter().filter(|l| l["msg"] == msg).count()
    }
}
