//! The `hookgate` binary: parses the command line and runs it (see [`hookgate::cli`]).
//! A failure prints its message and causes — never a backtrace, whatever `RUST_BACKTRACE`
//! says — and exits with status 1. Output whose reader has gone (`| head`) ends the
//! command quietly, as it ends ripgrep's.

/// mimalloc: about 10 % less CPU per first run than glibc's malloc (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[actix_web::main]
async fn main() -> std::process::ExitCode {
    match hookgate::cli::run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if reader_gone(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hookgate: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Whether `e` is stdout's reader going away (a broken pipe).
fn reader_gone(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
