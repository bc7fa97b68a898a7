//! TLS for the tunnel check and the echo: what the checker trusts an https echo by, and the
//! echo's certificate.
//!
//! The checker trusts one of: the system's roots (rustls-platform-verifier, as the rest of the
//! host does), a CA bundle from a PEM file, or the SHA-256 of the echo's certificate (a pin,
//! what `egress-proxies echo` prints for the certificate it makes itself). A pinned certificate
//! is the echo's whatever names it holds: the pin is its identity. Everything runs on ring.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why a TLS setup cannot be built. Holds paths and library messages, never key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the PEM file {}: {message}", path.display())]
    Pem { path: PathBuf, message: String },
    #[error("{} holds no certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} holds a certificate rustls refuses as a root: {message}", path.display())]
    BadRoot { path: PathBuf, message: String },
    #[error("the system's TLS roots cannot be used: {0}")]
    SystemRoots(String),
    #[error("TLS cannot be set up: {0}")]
    Setup(String),
    #[error("the certificate cannot be made: {0}")]
    Generate(String),
}

/// What the checker trusts an https echo by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// The system's roots, for the URL's host name.
    System,
    /// These CA certificates, for the URL's host name.
    Roots(Vec<CertificateDer<'static>>),
    /// Only the certificate whose DER has this SHA-256.
    Pinned([u8; 32]),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The SHA-256 of a certificate's DER.
pub fn fingerprint(cert: &[u8]) -> [u8; 32] {
    Sha256::digest(cert).into()
}

/// `AB:CD:…`, as `openssl x509 -fingerprint -sha256` prints it.
pub fn fingerprint_text(fp: &[u8; 32]) -> String {
    let mut out = String::with_capacity(95);
    for (i, b) in fp.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        let _ = write!(out, "{b:02X}");
    }
    out
}

/// The certificates of a PEM file (a CA bundle, or a server's chain).
pub fn certificates_from_pem(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |message: String| TlsError::Pem {
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

impl Trust {
    /// A CA bundle read from `path`, each certificate checked to be usable as a root.
    pub fn from_ca_file(path: &Path) -> Result<Trust, TlsError> {
        let certs = certificates_from_pem(path)?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in &certs {
            roots.add(cert.clone()).map_err(|e| TlsError::BadRoot {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        }
        Ok(Trust::Roots(certs))
    }

    /// The client config probes use inside the tunnel: HTTP/1.1 only, no client certificate.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?;
        let mut config = match self {
            Trust::System => {
                let verifier = rustls_platform_verifier::Verifier::new(provider)
                    .map_err(|e| TlsError::SystemRoots(e.to_string()))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(verifier))
                    .with_no_client_auth()
            }
            Trust::Roots(certs) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certs {
                    roots
                        .add(cert.clone())
                        .map_err(|e| TlsError::Setup(e.to_string()))?;
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            Trust::Pinned(pin) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                    pin: *pin,
                    algorithms: provider.signature_verification_algorithms,
                }))
                .with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Accepts exactly the certificate with the pinned fingerprint, and checks that the server
/// holds its key (the handshake's signature), as any verifier must.
#[derive(Debug)]
struct PinnedVerifier {
    pin: [u8; 32],
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = fingerprint(end_entity.as_ref());
        if seen == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the certificate's SHA-256 is {}, not the pinned {}",
                fingerprint_text(&seen),
                fingerprint_text(&self.pin)
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The echo's TLS side: its server config and the fingerprint of its certificate.
#[derive(Clone)]
pub struct ServerIdentity {
    pub config: Arc<ServerConfig>,
    pub certificate: CertificateDer<'static>,
    pub fingerprint: [u8; 32],
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("fingerprint", &fingerprint_text(&self.fingerprint))
            .finish_non_exhaustive()
    }
}

impl ServerIdentity {
    fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<ServerIdentity, TlsError> {
        let certificate = chain
            .first()
            .cloned()
            .ok_or_else(|| TlsError::Setup("no certificate".into()))?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Setup(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerIdentity {
            fingerprint: fingerprint(certificate.as_ref()),
            certificate,
            config: Arc::new(config),
        })
    }

    /// A certificate chain and its key from PEM files.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<ServerIdentity, TlsError> {
        let chain = certificates_from_pem(cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
            path: key.to_path_buf(),
            message: e.to_string(),
        })?;
        ServerIdentity::new(chain, key)
    }

    /// A fresh self-signed certificate for `names` (DNS names or IP addresses), valid for
    /// about a year: for an echo a checker pins by fingerprint.
    pub fn self_signed(names: &[String]) -> Result<ServerIdentity, TlsError> {
        let made = rcgen::generate_simple_self_signed(names.to_vec())
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
        ServerIdentity::new(vec![made.cert.der().clone()], key)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn fingerprints_print_as_openssl_does() {
        let fp = fingerprint(b"abc");
        let text = fingerprint_text(&fp);
        assert_eq!(text.len(), 95);
        assert!(text.starts_with("BA:78:16:BF:"), "{text}");
    }

    #[test]
    fn a_self_signed_identity_is_pinned_by_its_fingerprint() {
        let id = ServerIdentity::self_signed(&["echo.test".into(), "127.0.0.9".into()]).unwrap();
        assert_eq!(id.fingerprint, fingerprint(id.certificate.as_ref()));
        assert!(Trust::Pinned(id.fingerprint).client_config().is_ok());
    }

    #[test]
    fn a_pem_file_without_certificates_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem\n").unwrap();
        let e = Trust::from_ca_file(&empty).unwrap_err();
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");
        assert!(e.to_string().contains("empty.pem"), "{e}");
        let e = Trust::from_ca_file(&dir.path().join("missing.pem")).unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
    }
}
