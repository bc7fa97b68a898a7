//! The validating admission webhook for ProxyPools: the API server sends each create and update
//! of a pool as an AdmissionReview v1 before it stores it, and the pool is refused there, naming
//! each field at fault, rather than stored and then marked `InvalidSpec` by the pool controller.
//! Both judge with the same function ([`egress_core::pool::validate_in`]) against the providers
//! config this replica has loaded now; the condition stays as the fallback for pools admitted
//! while the webhook could not be reached (the deploy's failurePolicy is Ignore).
//!
//! Proxies are not reviewed: their one check that depends on the config, a provider that
//! exists, is a state a Proxy may wait in (`ProviderNotFound` clears when the entry appears,
//! without a restart), and the operator's own creates of pool members would otherwise wait on
//! its own webhook.
//!
//! The endpoint is HTTPS on a listener of its own, with the certificate and key read again
//! when their files change (cert-manager renews them in place). It answers only whether the
//! object the request carries is valid and changes nothing, so it asks its callers for no
//! credential (README, "Validation at admission").

use crate::context::Loaded;
use crate::crd::ProxyPool;
use crate::server::{Limits, accept_bounded, serve_connection};
use egress_core::pool;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;

/// The path the ValidatingWebhookConfiguration calls.
pub const PATH: &str = "/validate-proxypool";

/// The largest review read. A review carries the pool and, on update, its old version; a
/// pool is a few KiB, and the API server bounds an object's annotations to 256 KiB.
pub const MAX_BODY: usize = 1 << 20;

/// A request must be read and answered within this. The API server waits at most the
/// configuration's timeoutSeconds (5 s in the deploy, 30 s at most) and then applies the
/// failurePolicy, so an answer later than that serves no one.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a pool is checked against beyond its own spec, owned: the providers config as loaded
/// now, and the most replicas the operator allows. The pool controller and the webhook both
/// take it from [`Loaded`] and the operator's options, so they judge alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolEnvironment {
    /// The provider entries loaded now.
    pub providers: Vec<String>,
    /// The egress check's startupTimeout, when the config has a check.
    pub startup_timeout: Option<Duration>,
    /// `run --max-replicas`.
    pub max_replicas: u32,
}

impl Default for PoolEnvironment {
    fn default() -> Self {
        Self {
            providers: Vec::new(),
            startup_timeout: None,
            max_replicas: pool::DEFAULT_MAX_REPLICAS,
        }
    }
}

impl PoolEnvironment {
    pub fn of(loaded: &Loaded, max_replicas: u32) -> Self {
        Self {
            providers: loaded.providers.iter().map(|p| p.name.clone()).collect(),
            startup_timeout: loaded.egress.as_ref().map(|c| c.settings().startup_timeout),
            max_replicas,
        }
    }

    pub fn as_core(&self) -> pool::Environment<'_> {
        pool::Environment {
            providers: &self.providers,
            startup_timeout: self.startup_timeout,
            max_replicas: self.max_replicas,
        }
    }
}

/// Why the body is not an AdmissionReview this webhook can answer: the request is refused
/// with 400, and the API server applies the failurePolicy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an AdmissionReview v1: {field}: {message}")]
pub struct MalformedReview {
    /// The JSON path at fault (`.` for the whole body).
    pub field: String,
    pub message: String,
}

fn malformed(field: &str, message: impl Into<String>) -> MalformedReview {
    MalformedReview {
        field: field.to_string(),
        message: message.into(),
    }
}

/// Answers one AdmissionReview: allowed, or denied with every problem of the pool, each
/// naming its field. A review that is not one (not JSON, another version, no request) is an
/// error; a request about an object that is not a ProxyPool is allowed with a warning, since
/// only a misconfigured webhook sends one and refusing it could block unrelated writes.
pub fn review(body: &[u8], env: &PoolEnvironment) -> Result<Vec<u8>, MalformedReview> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    let review: AdmissionReview<DynamicObject> = serde_path_to_error::deserialize(de)
        .map_err(|e| malformed(&e.path().to_string(), e.inner().to_string()))?;
    if review.types.api_version != kube::core::admission::META_API_VERSION_V1 {
        return Err(malformed(
            "apiVersion",
            format!(
                "{:?}, not {:?}",
                review.types.api_version,
                kube::core::admission::META_API_VERSION_V1
            ),
        ));
    }
    if review.types.kind != kube::core::admission::META_KIND {
        return Err(malformed(
            "kind",
            format!("{:?}, not \"AdmissionReview\"", review.types.kind),
        ));
    }
    let request: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| malformed("request", "missing"))?;
    if request.uid.is_empty() {
        return Err(malformed("request.uid", "empty"));
    }
    let response = answer(&request, env);
    serde_json::to_vec(&response.into_review())
        .map_err(|e| malformed(".", format!("the answer cannot be written: {e}")))
}

fn answer(request: &AdmissionRequest<DynamicObject>, env: &PoolEnvironment) -> AdmissionResponse {
    let allowed = AdmissionResponse::from(request);
    let kind = &request.kind;
    if kind.group != "crawl.example.com" || kind.kind != "ProxyPool" {
        let mut r = allowed;
        r.warnings = Some(vec![format!(
            "egress-proxies reviews ProxyPools only, not {}/{}; check the webhook's rules",
            kind.group, kind.kind
        )]);
        return r;
    }
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return allowed;
    }
    let pool = match request.object.as_ref().map(pool_of) {
        Some(Ok(p)) => p,
        Some(Err(problem)) => return denied(allowed, vec![problem]),
        None => return denied(allowed, vec!["object: missing".into()]),
    };
    let mut core = pool.to_core();
    if core.metadata.namespace.is_empty() {
        core.metadata.namespace = request.namespace.clone().unwrap_or_default();
    }
    // A pool named by generateName has no name yet: the API server appends five characters.
    if core.metadata.name.is_empty()
        && let Some(prefix) = pool.metadata.generate_name.as_deref()
    {
        core.metadata.name = format!("{prefix}xxxxx");
    }
    let problems = pool::validate_in(&core, env.as_core());
    if problems.is_empty() {
        return allowed;
    }
    // An update that leaves the spec as it was (a label, an annotation) is not refused for
    // what the spec already had: the config may have changed under a stored pool, and
    // refusing every metadata edit would not make the spec valid. The pool controller's
    // InvalidSpec condition says what is wrong; the client is warned as well.
    if request.operation == Operation::Update
        && let Some(Ok(old)) = request.old_object.as_ref().map(pool_of)
        && old.spec == pool.spec
    {
        let mut r = allowed;
        r.warnings = Some(problems);
        return r;
    }
    denied(allowed, problems)
}

/// The object as a ProxyPool, or the problem naming the field that does not read as one.
fn pool_of(object: &DynamicObject) -> Result<ProxyPool, String> {
    let value = serde_json::to_value(object).map_err(|e| format!("object: {e}"))?;
    serde_path_to_error::deserialize(value).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

/// Denied with every problem: the message joins them, and each is a cause naming its field,
/// as the API server's own validation answers.
fn denied(response: AdmissionResponse, problems: Vec<String>) -> AdmissionResponse {
    let causes = problems
        .iter()
        .map(|p| {
            let (field, message) = p.split_once(": ").unwrap_or(("", p.as_str()));
            StatusCause {
                reason: "FieldValueInvalid".into(),
                message: message.to_string(),
                field: field.to_string(),
            }
        })
        .collect();
    let message = problems.join("; ");
    let mut r = response.deny(&message);
    r.result = Status::failure(&message, "Invalid")
        .with_code(422)
        .with_details(StatusDetails {
            group: "crawl.example.com".into(),
            kind: "ProxyPool".into(),
            causes,
            name: String::new(),
            uid: String::new(),
            retry_after_seconds: 0,
        });
    r
}

/// Why the webhook's certificate cannot serve. Names the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("webhook certificate {}: {message}", path.display())]
    Certificate { path: PathBuf, message: String },
    #[error("webhook key {}: {message}", path.display())]
    Key { path: PathBuf, message: String },
}

/// The webhook's certificate and key, read again when their files change: cert-manager renews
/// the certificate into its Secret and the kubelet swaps the mounted files, with no restart.
/// A pair that does not load (a key that does not match the certificate, as between the
/// two files' updates) is refused and the last good pair serves on.
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
        crate::reload_every(
            interval,
            || self.reload(),
            || tracing::info!("the webhook certificate changed: the new one serves"),
            |e| tracing::warn!("{e}; the certificate loaded before serves on"),
        )
        .await
    }

    /// The TLS server config that presents the current pair at every handshake.
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

/// What the webhook answers with: the environment of the providers config loaded now.
pub type EnvironmentSource = Arc<dyn Fn() -> PoolEnvironment + Send + Sync>;

/// Serves the webhook on `listener` over TLS, at most `limits.max_connections` connections at
/// once; a handshake and a request head must each arrive within `limits.header_read_timeout`,
/// and a request must be read and answered within [`REQUEST_TIMEOUT`].
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    env: EnvironmentSource,
    limits: Limits,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    accept_bounded(listener, limits.max_connections, "webhook", |stream| {
        let acceptor = acceptor.clone();
        let env = env.clone();
        async move {
            let stream =
                match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream))
                    .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!("webhook TLS handshake: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("webhook TLS handshake timed out");
                        return;
                    }
                };
            let svc = service_fn(move |req: Request<Incoming>| {
                let env = env.clone();
                async move {
                    let r = tokio::time::timeout(REQUEST_TIMEOUT, respond(req, &env))
                        .await
                        .unwrap_or_else(|_| {
                            plain(
                                StatusCode::REQUEST_TIMEOUT,
                                format!(
                                    "the review was not read within {}s\n",
                                    REQUEST_TIMEOUT.as_secs()
                                ),
                            )
                        });
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            serve_connection(stream, svc, limits, "webhook").await;
        }
    })
    .await
}

async fn respond(req: Request<Incoming>, env: &EnvironmentSource) -> Response<Full<Bytes>> {
    if req.uri().path() != PATH {
        return plain(
            StatusCode::NOT_FOUND,
            format!("reviews are posted to {PATH}\n"),
        );
    }
    if req.method() != hyper::Method::POST {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "a review is a POST\n".into(),
        );
    }
    // A body past MAX_BODY is refused before more of it is read.
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a review is at most {MAX_BODY} bytes\n"),
            );
        }
    };
    match review(&body, &env()) {
        Ok(answer) => {
            let mut r = Response::new(Full::new(Bytes::from(answer)));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => {
            tracing::warn!("webhook: {e}");
            plain(StatusCode::BAD_REQUEST, format!("{e}\n"))
        }
    }
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    r
}
