//! The `hookgate` binary: parses the command line and runs it (see [`hookgate::cli`]).

#[actix_web::main]
async fn main() -> anyhow::Result<()> {
    hookgate::cli::run().await
}
