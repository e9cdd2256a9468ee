//! The name this process goes by in the rows it writes — an attempt's `node` in the
//! history, a replay job's owner: `host:pid`, read once.

use std::sync::{Arc, OnceLock};

static NAME: OnceLock<Arc<str>> = OnceLock::new();

/// This process's name, `host:pid`.
pub fn name() -> Arc<str> {
    Arc::clone(NAME.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        format!("{host}:{}", std::process::id()).into()
    }))
}
