//! The edges an operator deploys with: the shipped config safe by default, the files in
//! `deploy/`, commands that explain themselves, the warnings a node gives at start.
//!
//! * `check_config.rs` — what `hookgate check-config` prints, and that it fails exactly
//!   when `serve` would refuse to start.
//! * `edges.rs` — signed forwarding, config errors and commands (`migrate`, a closed
//!   pipe), and the files in `deploy/` (systemd unit, Dockerfile, alerts and dashboard).
//! * `safe_defaults.rs` — the shipped config and `deploy/` safe by default, and
//!   `hookgate send`.
//! * `startup_warnings.rs` — what a node logs at start about the Postgres it reaches.

mod check_config;
mod edges;
mod safe_defaults;
mod startup_warnings;

/// Runs the binary with `config_text` as its config file (a temporary one) and `args`.
fn run(args: &[&str], config_text: &str) -> std::process::Output {
    let dir = std::env::temp_dir().join(format!(
        "hookgate-edges-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(&file, config_text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(args)
        .arg("--config")
        .arg(&file)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    out
}
