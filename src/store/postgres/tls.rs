//! TLS to Postgres: `sslmode` and `sslrootcert` in `store.url` (URL or key=value form),
//! with libpq's meanings, through rustls.
//!
//! | sslmode | encrypted | server checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `allow`, `prefer` (the default, as in libpq) | when the server offers TLS | no |
//! | `require` | always; a server without TLS is an error | no — but with a root certificate file (`sslrootcert`, or the default below), as `verify-ca` (libpq's rule) |
//! | `verify-ca` | always | chain to `sslrootcert` |
//! | `verify-full` | always | chain to `sslrootcert`, and the host name |
//!
//! `verify-ca` and `verify-full` need trust anchors: `sslrootcert`, else libpq's default
//! `~/.postgresql/root.crt` if it exists, else it is an error naming `sslrootcert` (never a
//! silent fall-back to the system roots, which any public certificate chains to).
//! `sslrootcert=system` (PostgreSQL 16's meaning) is the system roots with `verify-full`;
//! with a weaker `sslmode` it is an error. Both parameters are taken out here
//! (tokio-postgres knows only the first three modes), the key=value form read by libpq's
//! grammar ([`key_values`]); the rest is tokio-postgres's, and an `sslmode` it still finds
//! there is refused, never overwritten.

use std::path::PathBuf;

use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::store::key_values;
use crate::store::StoreError;
use crate::tls::{client_config, Verify};

/// What the URL asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    /// For tokio-postgres: whether to ask for TLS, and whether it is required.
    pub(crate) mode: SslMode,
    /// How much of the server's certificate is checked.
    pub(crate) verify: Verify,
    /// The trust anchors (`None` with [`Verify::Full`]: the system's, `sslrootcert=system`).
    pub(crate) root_cert: Option<PathBuf>,
}

fn error(text: String) -> StoreError {
    StoreError::Query(format!("store.url: {text}").into())
}

/// Splits `sslmode` and `sslrootcert` off a `postgres://` URL or a key=value string, and
/// reads them by libpq's rules.
///
/// Unit tests never look in the real `$HOME`: a `~/.postgresql/root.crt` on the machine
/// running them would turn their `require` into verify-ca. The test of that default file
/// gives its own home to [`split_with_home`].
fn split(url: &str) -> Result<(String, Tls), StoreError> {
    let home = if cfg!(test) {
        None
    } else {
        std::env::var_os("HOME").map(PathBuf::from)
    };
    split_with_home(url, home)
}

/// [`split`], with libpq's default root certificate looked for under `home`.
fn split_with_home(url: &str, home: Option<PathBuf>) -> Result<(String, Tls), StoreError> {
    // tokio-postgres's test for its URL form; anything else is key=value to it.
    let (rest, mode, root) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (mut mode, mut root, mut kept) = (None, None, Vec::new());
        for param in query.split('&').filter(|p| !p.is_empty()) {
            match param.split_once('=') {
                Some(("sslmode", m)) => mode = Some(m.to_owned()),
                Some(("sslrootcert", r)) => root = Some(r.to_owned()),
                _ => kept.push(param),
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (rest, mode, root)
    } else {
        let (mut mode, mut root, mut kept) = (None, None, Vec::new());
        for param in key_values(url) {
            let param = param.map_err(|e| error(format!("does not parse: {e}")))?;
            match param.key {
                "sslmode" => mode = Some(param.value),
                "sslrootcert" => root = Some(param.value),
                // As written, quotes and escapes included.
                _ => kept.push(&url[param.written]),
            }
        }
        (kept.join(" "), mode, root)
    };
    let tls = resolve(mode.as_deref(), root.as_deref(), home)?;
    Ok((rest, tls))
}

/// libpq's table for `sslmode` and `sslrootcert`.
fn resolve(
    mode: Option<&str>,
    root: Option<&str>,
    home: Option<PathBuf>,
) -> Result<Tls, StoreError> {
    let tls = |mode, verify, root_cert| {
        Ok(Tls {
            mode,
            verify,
            root_cert,
        })
    };
    if root == Some("system") {
        return match mode {
            None | Some("verify-full") => tls(SslMode::Require, Verify::Full, None),
            Some(other) => Err(error(format!(
                "sslrootcert=system needs sslmode=verify-full (not {other:?}): the system's \
                 roots authenticate a server only together with its host name"
            ))),
        };
    }
    let root = root.map(PathBuf::from);
    let anchors = || {
        root.clone().or_else(|| {
            home.map(|h| h.join(".postgresql/root.crt"))
                .filter(|p| p.exists())
        })
    };
    match mode.unwrap_or("prefer") {
        "disable" => tls(SslMode::Disable, Verify::Encrypt, None),
        "allow" | "prefer" => tls(SslMode::Prefer, Verify::Encrypt, None),
        "require" => match anchors() {
            Some(file) => tls(SslMode::Require, Verify::Chain, Some(file)),
            None => tls(SslMode::Require, Verify::Encrypt, None),
        },
        m @ ("verify-ca" | "verify-full") => {
            let verify = if m == "verify-ca" {
                Verify::Chain
            } else {
                Verify::Full
            };
            match anchors() {
                Some(file) => tls(SslMode::Require, verify, Some(file)),
                None => Err(error(format!(
                    "sslmode={m} needs trust anchors: set sslrootcert=/path/ca.pem (or \
                     sslrootcert=system for the system's roots with verify-full), or put the \
                     CA in ~/.postgresql/root.crt"
                ))),
            }
        }
        other => Err(error(format!(
            "sslmode {other:?} is not disable, allow, prefer, require, verify-ca or verify-full"
        ))),
    }
}

/// tokio-postgres's settings for `url`, with the `sslmode` read here, and what it asks of
/// TLS.
pub(crate) fn config(url: &str) -> Result<(tokio_postgres::Config, Tls), StoreError> {
    let (rest, tls) = split(url)?;
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| error(format!("does not parse: {e}")))?;
    // `split` took every `sslmode` out, so tokio-postgres kept its default. Had it read one
    // in a spelling `split` missed, setting ours would replace it unseen, perhaps with a
    // weaker one.
    if config.get_ssl_mode() != tokio_postgres::Config::new().get_ssl_mode() {
        return Err(error(
            "names sslmode in a way hookgate does not read (a percent-encoded key?): \
             write it plainly, sslmode=..."
                .into(),
        ));
    }
    config.ssl_mode(tls.mode);
    Ok((config, tls))
}

/// Whether `url` authenticates its server over TLS, and the hosts it names.
pub(crate) fn authenticated_hosts(url: &str) -> Result<(bool, Vec<String>), StoreError> {
    let (config, tls) = config(url)?;
    let hosts = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    Ok((tls.verify != Verify::Encrypt, hosts))
}

/// The rustls connector for `tls`.
pub(crate) fn connector(tls: &Tls) -> Result<MakeRustlsConnect, StoreError> {
    let config = client_config(tls.root_cert.as_deref(), tls.verify)
        .map_err(|e| StoreError::Query(format!("store.url TLS: {e}").into()))?;
    Ok(MakeRustlsConnect::new((*config).clone()))
}

/// `check-config`'s word on TLS for the Postgres `url`: `None` when the server is
/// authenticated or only local hosts are named; else why a man in the middle could read
/// and change the traffic.
pub fn tls_warning(url: &str) -> Result<Option<String>, StoreError> {
    let (authenticated, hosts) = authenticated_hosts(url)?;
    let local =
        |h: &String| h.starts_with('/') || matches!(h.as_str(), "localhost" | "127.0.0.1" | "::1");
    Ok((!authenticated && !hosts.iter().all(local)).then(|| {
        format!(
            "{} reached with sslmode prefer or require: encrypted at best, the server not \
             authenticated; use sslmode=verify-full with sslrootcert",
            hosts.join(",")
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(url: &str) -> Result<(String, Tls), StoreError> {
        split_with_home(url, None)
    }

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_and_the_rest_kept() {
        let (url, tls) =
            read("postgres://h/db?application_name=x&sslmode=verify-full&sslrootcert=/ca.pem")
                .unwrap();
        assert_eq!(url, "postgres://h/db?application_name=x");
        assert_eq!((tls.mode, tls.verify), (SslMode::Require, Verify::Full));
        assert_eq!(tls.root_cert, Some(PathBuf::from("/ca.pem")));
        let (url, tls) = read("postgres://h/db").unwrap();
        assert_eq!(url, "postgres://h/db");
        assert_eq!(tls.mode, SslMode::Prefer, "libpq's default");
        assert!(read("postgres://h/db?sslmode=sometimes").is_err());
    }

    #[test]
    fn the_modes_mean_what_libpq_says() {
        let verify = |url: &str| read(url).map(|(_, t)| (t.verify, t.root_cert));
        // require with a root certificate file is verify-ca.
        assert_eq!(
            verify("postgres://h/db?sslmode=require&sslrootcert=/ca.pem").unwrap(),
            (Verify::Chain, Some(PathBuf::from("/ca.pem")))
        );
        assert_eq!(
            verify("postgres://h/db?sslmode=require").unwrap(),
            (Verify::Encrypt, None)
        );
        // verify-ca and verify-full need anchors: never the system roots silently.
        for mode in ["verify-ca", "verify-full"] {
            let e = read(&format!("postgres://h/db?sslmode={mode}")).unwrap_err();
            assert!(e.to_string().contains("sslrootcert"), "{e}");
        }
        // sslrootcert=system: the system roots, with the host name.
        assert_eq!(
            verify("postgres://h/db?sslrootcert=system").unwrap(),
            (Verify::Full, None)
        );
        assert!(read("postgres://h/db?sslrootcert=system&sslmode=verify-ca").is_err());
        assert!(read("postgres://h/db?sslrootcert=system&sslmode=require").is_err());
    }

    #[test]
    fn libpqs_default_root_certificate_is_honoured() {
        let home = std::env::temp_dir().join(format!("hookgate-home-{}", fastrand::u64(..)));
        std::fs::create_dir_all(home.join(".postgresql")).unwrap();
        let ca = home.join(".postgresql/root.crt");
        std::fs::write(&ca, "not read here").unwrap();
        let read = |url: &str| {
            let (_, tls) = split_with_home(url, Some(home.clone())).unwrap();
            (tls.mode, tls.verify, tls.root_cert)
        };
        let full = read("postgres://h/db?sslmode=verify-full");
        // require with a root certificate file is verify-ca, the default file included.
        let require = read("postgres://h/db?sslmode=require");
        let require_kv = read("host=h sslmode=require");
        std::fs::remove_dir_all(&home).unwrap();
        assert_eq!(full, (SslMode::Require, Verify::Full, Some(ca.clone())));
        assert_eq!(require, (SslMode::Require, Verify::Chain, Some(ca.clone())));
        assert_eq!(require_kv, (SslMode::Require, Verify::Chain, Some(ca)));
        // Without the file, require only encrypts.
        assert_eq!(
            read("postgres://h/db?sslmode=require"),
            (SslMode::Require, Verify::Encrypt, None)
        );
    }

    #[test]
    fn a_remote_server_reached_without_authentication_is_told_apart() {
        let (ok, hosts) =
            authenticated_hosts("postgres://u@db.example:5432/x?sslmode=require").unwrap();
        assert_eq!((ok, hosts), (false, vec!["db.example".to_owned()]));
        let (ok, _) = authenticated_hosts(
            "postgres://u@db.example/x?sslmode=verify-full&sslrootcert=/ca.pem",
        )
        .unwrap();
        assert!(ok);
        assert!(
            crate::store::postgres::tls_warning("postgres://u@127.0.0.1/x")
                .unwrap()
                .is_none()
        );
        let warned = crate::store::postgres::tls_warning("host=db.example sslmode=prefer");
        assert!(warned.unwrap().unwrap().contains("db.example"));
    }

    #[test]
    fn a_url_naming_several_hosts_keeps_them_all_and_their_order() {
        let url = "postgres://app:pw@db1:5432,db2:5433/app?target_session_attrs=read-write\
                   &sslmode=verify-full&sslrootcert=/ca.pem&application_name=x";
        let (rest, tls) = read(url).unwrap();
        assert_eq!(
            rest,
            "postgres://app:pw@db1:5432,db2:5433/app?target_session_attrs=read-write\
             &application_name=x"
        );
        assert_eq!(tls.verify, Verify::Full);
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_ports(), [5432, 5433]);
        assert_eq!(
            config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        let (authenticated, hosts) = authenticated_hosts(url).unwrap();
        assert!(authenticated);
        assert_eq!(hosts, ["db1", "db2"]);

        let kv = "host=db1,db2 port=5432,5433 dbname=app target_session_attrs=read-write \
                  sslmode=require";
        let (rest, tls) = read(kv).unwrap();
        assert_eq!(
            rest,
            "host=db1,db2 port=5432,5433 dbname=app target_session_attrs=read-write"
        );
        assert_eq!(tls.verify, Verify::Encrypt);
        let config: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(config.get_hosts().len(), 2);
        let warned = crate::store::postgres::tls_warning(kv).unwrap().unwrap();
        assert!(warned.starts_with("db1,db2 reached"), "{warned}");
        let local = "postgres://u@127.0.0.1:5432,localhost:5433/x?target_session_attrs=read-write";
        assert!(crate::store::postgres::tls_warning(local)
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_key_value_form_is_read_the_same_way() {
        let (rest, tls) =
            read("host=db dbname=app sslmode=verify-full sslrootcert=/ca.pem").unwrap();
        assert_eq!(rest, "host=db dbname=app");
        assert_eq!(
            (tls.verify, tls.root_cert),
            (Verify::Full, Some(PathBuf::from("/ca.pem")))
        );
        assert!(read("host=db sslmode=verify-ca").is_err());
        let (_, tls) = read("host=db sslmode=require sslrootcert=/ca.pem").unwrap();
        assert_eq!(tls.verify, Verify::Chain);
    }

    #[test]
    fn spaces_around_the_equals_sign_do_not_hide_sslmode_or_sslrootcert() {
        let (rest, tls) = read("host = db sslmode = require").unwrap();
        assert_eq!(rest, "host = db");
        assert_eq!((tls.mode, tls.verify), (SslMode::Require, Verify::Encrypt));
        let (rest, tls) = read("host=db sslmode='verify-full' sslrootcert = '/x/ca.pem'").unwrap();
        assert_eq!(rest, "host=db");
        assert_eq!(
            (tls.mode, tls.verify, tls.root_cert),
            (
                SslMode::Require,
                Verify::Full,
                Some(PathBuf::from("/x/ca.pem"))
            )
        );
        // The whole connection, as the pool gets it: tokio-postgres is told require.
        let (pg, _) = config("host = db sslmode = require").unwrap();
        assert_eq!(pg.get_ssl_mode(), SslMode::Require);
    }

    #[test]
    fn the_other_key_value_parameters_reach_tokio_postgres_as_written() {
        let url = "host = db user= app dbname ='my db' sslmode = require \
                   password = 'a b\\'c' application_name=x\\ y";
        let (pg, tls) = config(url).unwrap();
        assert_eq!(tls.mode, SslMode::Require);
        assert_eq!(pg.get_ssl_mode(), SslMode::Require);
        assert_eq!(
            pg.get_hosts(),
            [tokio_postgres::config::Host::Tcp("db".into())]
        );
        assert_eq!(pg.get_user(), Some("app"));
        assert_eq!(pg.get_dbname(), Some("my db"));
        assert_eq!(pg.get_password(), Some(&b"a b'c"[..]));
        assert_eq!(pg.get_application_name(), Some("x y"));
    }

    #[test]
    fn an_sslmode_tokio_postgres_reads_and_hookgate_does_not_is_refused() {
        // A percent-encoded key: tokio-postgres decodes it, this file's reading does not.
        for url in [
            "postgres://h/db?ssl%6Dode=disable",
            "postgres://h/db?sslmode=verify-full&sslrootcert=/ca.pem&ssl%6dode=disable",
        ] {
            let e = config(url).unwrap_err();
            assert!(e.to_string().contains("sslmode"), "{url}: {e}");
        }
    }
}
