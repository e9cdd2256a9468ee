//! What hookgate's integration tests (`tests/api`) and its benches (`benches/`) share, so
//! each exists once: the target, the one fake application, that counts deliveries
//! (`target`), the node runner that starts the `hookgate` binary as a child process
//! (`node`), the TCP proxy in front of Postgres whose network can be cut (`proxy`), one
//! sender's POST of an event (`sender`), and CPU time read from /proc (`proc_cpu`).
//!
//! It knows nothing of hookgate's code: it speaks to a node over HTTP and to its database
//! over TCP, as a user's systems do. The binary's path comes from the caller
//! (`env!("CARGO_BIN_EXE_hookgate")`, which only hookgate's own tests and benches see).

pub mod node;
pub mod proc_cpu;
pub mod proxy;
pub mod sender;
mod shards;
pub mod target;

use std::future::Future;
use std::time::{Duration, Instant};

/// Waits for `condition` to hold, polling, and panics naming `what` after a generous
/// deadline (20 s): a wait on a condition, never a sleep-and-hope.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
