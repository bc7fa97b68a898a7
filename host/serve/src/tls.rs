//! TLS on the listeners that carry callers' tokens (the HTTP API, the gateway) and on the
//! admission webhook: a certificate and key read from files and read again when they change,
//! and the stream a listener serves, TLS or, where a deploy says so on purpose, plain.
//!
//! cert-manager renews a certificate into its Secret and the kubelet swaps the mounted files;
//! the new pair serves from the next handshake, with no restart. A pair that does not load (a
//! key that does not match the certificate, as between the two files' updates) is refused and
//! the last good pair serves on.

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Why a certificate cannot serve. Names the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("certificate {}: {message}", path.display())]
    Certificate { path: PathBuf, message: String },
    #[error("key {}: {message}", path.display())]
    Key { path: PathBuf, message: String },
}

/// A serving certificate and key, read again when their files change.
#[derive(Debug)]
pub struct Certificates {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    /// The files' bytes as last loaded, and what they made.
    current: RwLock<(Vec<u8>, Vec<u8>, Arc<CertifiedKey>)>,
}

impl Certificates {
    pub fn load(cert: &Path, key: &Path) -> Result<Self, CertificateError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (c, k) = read_pair(cert, key)?;
        let certified = certified(cert, key, &c, &k, &provider)?;
        Ok(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            current: RwLock::new((c, k, Arc::new(certified))),
        })
    }

    /// Reads both files again: `Ok(true)` when they changed and the new pair serves,
    /// `Ok(false)` when they are as they were, an error (the old pair serving on) when the
    /// new one does not load. Compared by content, as a renewal may keep the modification time.
    pub fn reload(&self) -> Result<bool, CertificateError> {
        let (c, k) = read_pair(&self.cert, &self.key)?;
        {
            let now = self.current.read().unwrap_or_else(|p| p.into_inner());
            if now.0 == c && now.1 == k {
                return Ok(false);
            }
        }
        let certified = certified(&self.cert, &self.key, &c, &k, &self.provider)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (c, k, Arc::new(certified));
        Ok(true)
    }

    /// Reads the files again every `interval`, for as long as the task runs.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let cert = self.cert.display().to_string();
        crate::reload::reload_every(
            interval,
            || self.reload(),
            || tracing::info!(%cert, "the certificate changed: the new one serves"),
            |e| tracing::warn!("{e}; the certificate loaded before serves on"),
        )
        .await
    }

    /// The TLS server config that presents the current pair at every handshake, offering
    /// `alpn` (HTTP/1.1 alone where nothing else is served).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, CertificateError> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| CertificateError::Certificate {
                path: self.cert.clone(),
                message: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .2
                .clone(),
        )
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), CertificateError> {
    let c = std::fs::read(cert).map_err(|e| CertificateError::Certificate {
        path: cert.to_path_buf(),
        message: e.to_string(),
    })?;
    let k = std::fs::read(key).map_err(|e| CertificateError::Key {
        path: key.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok((c, k))
}

fn certified(
    cert: &Path,
    key: &Path,
    c: &[u8],
    k: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, CertificateError> {
    let cert_error = |message: String| CertificateError::Certificate {
        path: cert.to_path_buf(),
        message,
    };
    let chain = CertificateDer::pem_slice_iter(c)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_error(e.to_string()))?;
    if chain.is_empty() {
        return Err(cert_error("holds no certificate".into()));
    }
    // The key's own parse error names no byte of it.
    let private = PrivateKeyDer::from_pem_slice(k).map_err(|e| CertificateError::Key {
        path: key.to_path_buf(),
        message: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, private, provider).map_err(|e| CertificateError::Key {
        path: key.to_path_buf(),
        message: format!("does not serve with the certificate: {e}"),
    })
}

/// How a listener meets its clients: over TLS, or in plain text where a deploy chose it on
/// purpose (the tokens its callers present then cross the network in clear).
#[derive(Clone)]
pub enum Transport {
    Tls(tokio_rustls::TlsAcceptor),
    Plaintext,
}

impl Transport {
    pub fn tls(config: Arc<rustls::ServerConfig>) -> Self {
        Self::Tls(tokio_rustls::TlsAcceptor::from(config))
    }

    /// The URL scheme a client uses to reach it.
    pub fn scheme(&self) -> &'static str {
        match self {
            Self::Tls(_) => "https",
            Self::Plaintext => "http",
        }
    }

    /// This transport offering `protocols` by ALPN, most preferred first, for a listener that
    /// serves more than HTTP/1.1 (the gateway's HTTP/2) while the others sharing its
    /// certificate offer HTTP/1.1 alone. The certificate is the same one, reloaded with it.
    pub fn with_alpn(&self, protocols: &[&[u8]]) -> Self {
        match self {
            Self::Tls(acceptor) => {
                let mut config = rustls::ServerConfig::clone(acceptor.config());
                config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
                Self::tls(Arc::new(config))
            }
            Self::Plaintext => Self::Plaintext,
        }
    }

    /// The stream to serve over `tcp`: TLS once its handshake completes within `timeout`
    /// (a client that never finishes it holds its slot no longer than one that never sends a
    /// head), or the socket itself. None when the handshake failed or timed out.
    pub async fn accept<S>(&self, tcp: S, timeout: Duration, what: &str) -> Option<Stream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        match self {
            Self::Plaintext => Some(Stream::Plain(tcp)),
            Self::Tls(acceptor) => {
                match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => Some(Stream::Tls(Box::new(s))),
                    Ok(Err(e)) => {
                        tracing::debug!("{what} TLS handshake: {e}");
                        None
                    }
                    Err(_) => {
                        tracing::debug!("{what} TLS handshake timed out");
                        None
                    }
                }
            }
        }
    }
}

/// A served connection: a socket, or TLS over one.
pub enum Stream<S = TcpStream> {
    Plain(S),
    Tls(Box<tokio_rustls::server::TlsStream<S>>),
}

impl<S> Stream<S> {
    /// The protocol the client and the server agreed on by ALPN, if any (never over plain).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        match self {
            Self::Plain(_) => None,
            Self::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// How a listener that carries callers' tokens is to serve: over TLS from a certificate and
/// key (PEM files, read again on change), or in plain text, which must be asked for by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Tls { cert: PathBuf, key: PathBuf },
    Plaintext,
}

impl Mode {
    /// The URL scheme a client uses to reach a listener serving this way.
    pub fn scheme(&self) -> &'static str {
        match self {
            Self::Tls { .. } => "https",
            Self::Plaintext => "http",
        }
    }

    /// The transport to serve with: for TLS the certificate loaded now and read again every
    /// `reload` for as long as the runtime runs; `what` names the listener in the log.
    pub fn start(&self, reload: Duration, what: &str) -> Result<Transport, CertificateError> {
        match self {
            Self::Tls { cert, key } => {
                let certificates = Arc::new(Certificates::load(cert, key)?);
                let config = certificates.server_config()?;
                tokio::spawn(certificates.watch(reload));
                Ok(Transport::tls(config))
            }
            Self::Plaintext => {
                tracing::warn!(
                    "{what} serves plain HTTP (--plaintext): the tokens its callers present cross the network in clear"
                );
                Ok(Transport::Plaintext)
            }
        }
    }
}
