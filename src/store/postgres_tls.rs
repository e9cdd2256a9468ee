//! TLS to Postgres: `sslmode` and `sslrootcert` in `store.url`, with libpq's meanings,
//! through rustls.
//!
//! | sslmode | encrypted | server checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default, as in libpq) | when the server offers TLS | no |
//! | `require` | always; a server without TLS is an error | no |
//! | `verify-ca` | always | chain to `sslrootcert` (or the system roots) |
//! | `verify-full` | always | chain and host name |
//!
//! Both parameters are taken out of the URL here (tokio-postgres knows only the first
//! three modes); everything else in the URL is tokio-postgres's.

use std::path::PathBuf;

use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::api::StoreError;
use crate::tls::{client_config, Verify};

/// What the URL asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    /// For tokio-postgres: whether to ask for TLS, and whether it is required.
    pub(crate) mode: SslMode,
    /// How much of the server's certificate is checked.
    pub(crate) verify: Verify,
    /// `sslrootcert`: the trust anchors instead of the system's.
    pub(crate) root_cert: Option<PathBuf>,
}

/// Splits `sslmode` and `sslrootcert` off a `postgres://` URL.
pub(crate) fn split(url: &str) -> Result<(String, Tls), StoreError> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut tls = Tls {
        mode: SslMode::Prefer,
        verify: Verify::Encrypt,
        root_cert: None,
    };
    for param in query.split('&').filter(|p| !p.is_empty()) {
        match param.split_once('=') {
            Some(("sslmode", mode)) => {
                (tls.mode, tls.verify) = match mode {
                    "disable" => (SslMode::Disable, Verify::Encrypt),
                    "prefer" | "allow" => (SslMode::Prefer, Verify::Encrypt),
                    "require" => (SslMode::Require, Verify::Encrypt),
                    "verify-ca" => (SslMode::Require, Verify::Chain),
                    "verify-full" => (SslMode::Require, Verify::Full),
                    other => {
                        return Err(StoreError::Query(format!(
                            "store.url: sslmode {other:?} is not disable, prefer, require, \
                             verify-ca or verify-full"
                        )))
                    }
                }
            }
            Some(("sslrootcert", path)) => tls.root_cert = Some(PathBuf::from(path)),
            _ => kept.push(param),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, tls))
}

/// The rustls connector for `tls`.
pub(crate) fn connector(tls: &Tls) -> Result<MakeRustlsConnect, StoreError> {
    let config = client_config(tls.root_cert.as_deref(), tls.verify)
        .map_err(|e| StoreError::Query(format!("store.url TLS: {e}")))?;
    Ok(MakeRustlsConnect::new((*config).clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_and_the_rest_kept() {
        let (url, tls) =
            split("postgres://h/db?application_name=x&sslmode=verify-full&sslrootcert=/ca.pem")
                .unwrap();
        assert_eq!(url, "postgres://h/db?application_name=x");
        assert_eq!((tls.mode, tls.verify), (SslMode::Require, Verify::Full));
        assert_eq!(tls.root_cert, Some(PathBuf::from("/ca.pem")));
        let (url, tls) = split("postgres://h/db").unwrap();
        assert_eq!(url, "postgres://h/db");
        assert_eq!(tls.mode, SslMode::Prefer, "libpq's default");
        let (_, tls) = split("postgres://h/db?sslmode=verify-ca").unwrap();
        assert_eq!((tls.mode, tls.verify), (SslMode::Require, Verify::Chain));
        assert!(split("postgres://h/db?sslmode=sometimes").is_err());
    }
}
