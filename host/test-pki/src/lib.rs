#![doc = include_str!("../README.md")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod registry;

/// A CA of a test's own.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A serving certificate and its key, as PEM, and where they were written.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name.push(DnType::CommonName, name);
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA certificate, DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// Writes the CA certificate to `dir/name` (for clients such as curl's `--cacert`).
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, self.pem()).unwrap();
        p
    }

    /// A serving certificate for `names` (DNS names or IP addresses) signed by this CA, not
    /// written anywhere.
    pub fn leaf_pem(&self, names: &[&str]) -> (String, String, Vec<u8>) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }

    /// A serving certificate for `names`, written to `dir/{stem}.crt` and `dir/{stem}.key`.
    pub fn leaf(&self, dir: &Path, stem: &str, names: &[&str]) -> Leaf {
        let (cert_pem, key_pem, der) = self.leaf_pem(names);
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &cert_pem).unwrap();
        std::fs::write(&key, &key_pem).unwrap();
        Leaf {
            cert_pem,
            key_pem,
            der,
            cert,
            key,
        }
    }

    /// A TLS client config trusting this CA alone, offering HTTP/1.1.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A TLS connection to `addr` as `name`, trusting this CA alone.
    pub async fn connect(
        &self,
        addr: std::net::SocketAddr,
        name: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let server = ServerName::try_from(name.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        tokio_rustls::TlsConnector::from(self.client_config())
            .connect(server, tcp)
            .await
    }
}
