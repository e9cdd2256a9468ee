//! TLS client settings (rustls with the ring provider; no system OpenSSL at build time),
//! for `https://` targets and for Postgres. Imports nothing of hookgate.
//!
//! Roots are the system's (`/etc/ssl/certs` on Debian) unless a CA file is named, which
//! then is the only trust anchor. Three levels of checking, with libpq's meanings for the
//! store: [`Verify::Full`] (chain and host name — targets always, `verify-full`),
//! [`Verify::Chain`] (chain only — `verify-ca`), [`Verify::Encrypt`] (encryption without
//! authentication — `require`/`prefer`, as libpq does without a root certificate).
//!
//! A certificate in the CA file that is exactly the one the server presents is trusted as
//! that server's identity, as curl and OpenSSL trust it: the self-signed certificate
//! `openssl req -x509` makes carries `CA:TRUE`, which webpki refuses as an end entity
//! (`CaUsedAsEndEntity`). Its validity period and (for [`Verify::Full`]) the host name are
//! still checked.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore};

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// The chain to a trusted root and the host name.
    Full,
    /// The chain to a trusted root, not the host name.
    Chain,
    /// Nothing: the connection is encrypted, the server not authenticated.
    Encrypt,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in a PEM file.
fn pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("reading CA file {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("CA file {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("CA file {} holds no certificate", path.display()));
    }
    Ok(certs)
}

/// The trust anchors: the certificates in `ca_file` (PEM), or the system's.
pub fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in pem_certs(path)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("CA file {}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system certificate rustls cannot use is skipped, as browsers do.
                let _ = roots.add(cert);
            }
        }
    }
    Ok(roots)
}

/// A client configuration checking servers as `verify` says, against `ca_file` or the
/// system roots.
pub fn client_config(ca_file: Option<&Path>, verify: Verify) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?;
    let webpki = || {
        WebPkiServerVerifier::builder_with_provider(Arc::new(roots(ca_file)?), provider())
            .build()
            .map_err(|e| format!("TLS settings: {e}"))
    };
    let pinned = ca_file.map(pem_certs).transpose()?.unwrap_or_default();
    let config = match verify {
        Verify::Full if pinned.is_empty() => builder
            .with_root_certificates(roots(ca_file)?)
            .with_no_client_auth(),
        Verify::Full => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                chain: ChainOnly(webpki()?),
                pinned,
                check_name: true,
            }))
            .with_no_client_auth(),
        Verify::Chain => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                chain: ChainOnly(webpki()?),
                pinned,
                check_name: false,
            }))
            .with_no_client_auth(),
        Verify::Encrypt => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider())))
            .with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The checks of a CA file: the chain to one of its certificates, or the presented
/// certificate being exactly one of them (within its validity period); then, when
/// `check_name`, the host name.
#[derive(Debug)]
struct Pinned {
    chain: ChainOnly,
    pinned: Vec<CertificateDer<'static>>,
    check_name: bool,
}

impl Pinned {
    /// Whether `cert` is one of the pinned certificates and valid `now`.
    fn is_pinned_and_current(&self, cert: &CertificateDer<'_>, now: UnixTime) -> bool {
        use x509_cert::der::Decode;
        if !self.pinned.iter().any(|p| p.as_ref() == cert.as_ref()) {
            return false;
        }
        let Ok(parsed) = x509_cert::Certificate::from_der(cert.as_ref()) else {
            return false;
        };
        let validity = parsed.tbs_certificate.validity;
        let now = std::time::Duration::from_secs(now.as_secs());
        validity.not_before.to_unix_duration() <= now
            && now <= validity.not_after.to_unix_duration()
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let chained =
            self.chain
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        if chained.is_err() && !self.is_pinned_and_current(end_entity, now) {
            return chained;
        }
        if self.check_name {
            let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_name(&parsed, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` / `prefer`: any certificate is accepted (the handshake's signatures are still
/// checked); the connection is encrypted, not authenticated.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_a_clear_error() {
        let err = client_config(Some(Path::new("/nonexistent/ca.pem")), Verify::Full).unwrap_err();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
        let empty = std::env::temp_dir().join(format!("hookgate-empty-{}.pem", std::process::id()));
        std::fs::write(&empty, "").unwrap();
        let err = client_config(Some(&empty), Verify::Full).unwrap_err();
        assert!(err.contains("no certificate"), "{err}");
        std::fs::remove_file(empty).unwrap();
    }

    #[test]
    fn every_level_builds_with_the_system_roots() {
        for verify in [Verify::Full, Verify::Chain, Verify::Encrypt] {
            assert!(client_config(None, verify).is_ok());
        }
    }
}
