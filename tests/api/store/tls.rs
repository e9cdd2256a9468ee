//! TLS both ways: to Postgres (`sslmode`, `sslrootcert` in `store.url`, libpq's meanings)
//! and to `https://` targets (system roots or a provider's `target.ca_file`). The test
//! cluster runs with TLS on, its certificate signed by a CA `scripts/pg-throwaway.sh` made
//! (`HOOKGATE_TEST_DATABASE_CA`); the target's certificates are made here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix_web::{web, App, HttpResponse, HttpServer};
use hookgate::config::StoreConfig;
use hookgate::key::EventId;
use hookgate::store::Store;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use crate::helpers::{base_config, spawn_app_with, start_node, TestDb, TestTarget, PROVIDER};

fn test_ca() -> String {
    std::env::var("HOOKGATE_TEST_DATABASE_CA")
        .expect("scripts/test.sh starts the test cluster with TLS and sets the CA")
}

/// A CA, written to a PEM file, and a certificate for `localhost` it signed.
struct Certs {
    ca_file: std::path::PathBuf,
    server: rustls::ServerConfig,
}

fn make_certs() -> Certs {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let ca_file = std::env::temp_dir().join(format!(
        "hookgate-target-ca-{}-{}.pem",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    Certs { ca_file, server }
}

/// An https:// target on localhost counting deliveries.
fn https_target(server: rustls::ServerConfig) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    let srv = HttpServer::new(move || {
        let seen = Arc::clone(&seen);
        App::new().default_service(web::to(move || {
            seen.fetch_add(1, Ordering::SeqCst);
            async { HttpResponse::Created().body("ok") }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind_rustls_0_23("127.0.0.1:0", server)
    .unwrap();
    let port = srv.addrs()[0].port();
    actix_rt::spawn(srv.run());
    (format!("https://localhost:{port}/effects"), count)
}

#[actix_web::test]
async fn the_store_connection_is_encrypted_and_verified_when_the_url_asks() {
    let db = TestDb::new().await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    let name = format!("hookgate_tls_{}", fastrand::u32(..));
    config.store.url = format!(
        "{}?sslmode=verify-full&sslrootcert={}&application_name={name}",
        db.url,
        test_ca()
    );
    let app = start_node(db, target, config, Arc::new(hookgate::worker::HttpDelivery)).await;
    assert_eq!(app.deliver("evt_tls", "{}").await.status, 201);
    let (connections, encrypted) = app.db.tls_connections(&name).await;
    assert!(connections >= 1, "hookgate's connections are visible");
    assert_eq!(
        encrypted, connections,
        "every one of them is encrypted (pg_stat_ssl)"
    );
}

async fn ping(url: String) -> Result<(), hookgate::store::StoreError> {
    let config = StoreConfig {
        url,
        schema: "public".into(),
        ..StoreConfig::default()
    };
    let store: Arc<dyn Store> = hookgate::store::open(&config).await?;
    store.ping().await
}

#[actix_web::test]
async fn require_refuses_a_server_without_tls_and_verify_full_a_certificate_it_cannot_trust() {
    // A "server" that answers the TLS request with 'N', as PostgreSQL without TLS does.
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = plain.local_addr().unwrap().port();
    actix_rt::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = plain.accept().await {
            let mut request = [0u8; 8];
            let _ = socket.read_exact(&mut request).await;
            let _ = socket.write_all(b"N").await;
        }
    });
    let err = ping(format!("postgres://x@127.0.0.1:{port}/db?sslmode=require"))
        .await
        .unwrap_err();
    assert!(err.to_string().to_lowercase().contains("tls"), "{err}");

    let db_url = std::env::var("HOOKGATE_TEST_DATABASE_URL").unwrap();
    let other_ca = make_certs().ca_file;
    let err = ping(format!(
        "{db_url}?sslmode=verify-full&sslrootcert={}",
        other_ca.display()
    ))
    .await
    .unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    // The right CA works; so does `require`, which encrypts without checking.
    ping(format!(
        "{db_url}?sslmode=verify-full&sslrootcert={}",
        test_ca()
    ))
    .await
    .unwrap();
    ping(format!("{db_url}?sslmode=require")).await.unwrap();
}

#[actix_web::test]
async fn an_https_target_is_verified_against_its_ca_file_and_a_bad_certificate_fails_clearly() {
    let certs = make_certs();
    let (url, delivered) = https_target(certs.server);
    let trusted = spawn_app_with(|c| {
        c.providers[0].target.url = url.clone();
        c.providers[0].target.ca_file = Some(certs.ca_file.clone());
    })
    .await;
    let answer = trusted.deliver("evt_https", "{}").await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(delivered.load(Ordering::SeqCst), 1);

    // Without the CA file the system roots do not know the certificate: a failed attempt,
    // never a fallback to plain HTTP.
    let untrusted = spawn_app_with(|c| c.providers[0].target.url = url.clone()).await;
    let answer = untrusted.deliver("evt_untrusted", "{}").await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(
        delivered.load(Ordering::SeqCst),
        1,
        "nothing reached the target"
    );
    let row = untrusted
        .store
        .lookup(&EventId::new(PROVIDER, "evt_untrusted"))
        .await
        .unwrap()
        .expect("row");
    assert_eq!(row.status.as_str(), "failed");
    let error = row.last_error.unwrap_or_default().to_lowercase();
    assert!(
        error.contains("certificate") || error.contains("issuer"),
        "{error}"
    );
    std::fs::remove_file(certs.ca_file).unwrap();
}

/// What `openssl req -x509` makes: a self-signed certificate for `localhost` that says
/// `CA:TRUE`, written to a PEM file, and the server that presents it.
fn self_signed() -> Certs {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let ca_file = std::env::temp_dir().join(format!(
        "hookgate-self-signed-{}-{}.pem",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::write(&ca_file, cert.pem()).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    Certs { ca_file, server }
}

#[actix_web::test]
async fn a_ca_file_holding_the_targets_own_self_signed_certificate_trusts_it_by_host_name() {
    let certs = self_signed();
    let (url, delivered) = https_target(certs.server);
    let app = spawn_app_with(|c| {
        c.providers[0].target.url = url.clone();
        c.providers[0].target.ca_file = Some(certs.ca_file.clone());
    })
    .await;
    let answer = app.deliver("evt_self_signed", "{}").await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(delivered.load(Ordering::SeqCst), 1);

    // The host name is still checked: the certificate names localhost, not 127.0.0.1.
    let by_address = url.replace("localhost", "127.0.0.1");
    let app = spawn_app_with(|c| {
        c.providers[0].target.url = by_address;
        c.providers[0].target.ca_file = Some(certs.ca_file.clone());
    })
    .await;
    assert_eq!(app.deliver("evt_by_address", "{}").await.status, 503);
    // Another self-signed certificate in the file trusts nothing of this server.
    let other = self_signed();
    let app = spawn_app_with(|c| {
        c.providers[0].target.url = url.clone();
        c.providers[0].target.ca_file = Some(other.ca_file.clone());
    })
    .await;
    assert_eq!(app.deliver("evt_other", "{}").await.status, 503);
    assert_eq!(delivered.load(Ordering::SeqCst), 1, "nothing else arrived");
    std::fs::remove_file(certs.ca_file).unwrap();
    std::fs::remove_file(other.ca_file).unwrap();
}
