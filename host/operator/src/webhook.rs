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
//! credential (the crate's README, "Validation at admission").

use crate::context::Loaded;
use egress_core::pool;
use egress_k8s_api::crd::ProxyPool;
use egress_serve::tls::Transport;
use egress_serve::{Limits, accept_bounded, serve_connection};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, Status};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The path the ValidatingWebhookConfiguration calls.
pub const PATH: &str = "/validate-proxypool";

/// The largest review read: 64 KiB. A review carries the pool and, on update, its old
/// version; the sample pool's review is under 3 KiB, and 64 KiB leaves room for a template
/// with a cloud-init of over 20 KiB in both versions. A larger review is refused with 413
/// before more of it is read, and the API server applies the failurePolicy (the pool
/// controller's InvalidSpec condition still judges the pool).
pub const MAX_BODY: usize = 64 << 10;

/// Reviews read and judged at once: each is parsed on the blocking pool, never on the
/// runtime that serves the operator, and no more than this many compete for the CPU.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 4;

/// How long a review waits for one of those places before it is answered 503 (with
/// Retry-After): the API server gives up on a webhook after its timeoutSeconds (5 s in the
/// deploy) anyway, and a queue longer than that only holds memory.
pub const REVIEW_WAIT: Duration = Duration::from_secs(1);

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

/// What the webhook answers with: the environment of the providers config loaded now.
pub type EnvironmentSource = Arc<dyn Fn() -> PoolEnvironment + Send + Sync>;

/// Serves the webhook on `listener` over TLS, at most `limits.max_connections` connections at
/// once; a handshake and a request head must each arrive within `limits.header_read_timeout`,
/// and a request must be read and answered within [`REQUEST_TIMEOUT`]. At most
/// [`MAX_REVIEWS_IN_FLIGHT`] reviews are judged at once, off the runtime.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    env: EnvironmentSource,
    limits: Limits,
) {
    let transport = Transport::tls(tls);
    let judges = Arc::new(tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT));
    accept_bounded(listener, limits.max_connections, "webhook", |stream| {
        let transport = transport.clone();
        let env = env.clone();
        let judges = judges.clone();
        async move {
            let Some(stream) = transport
                .accept(stream, limits.header_read_timeout, "webhook")
                .await
            else {
                return;
            };
            let svc = service_fn(move |req: Request<Incoming>| {
                let env = env.clone();
                let judges = judges.clone();
                async move {
                    let r = tokio::time::timeout(REQUEST_TIMEOUT, respond(req, &env, &judges))
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

async fn respond(
    req: Request<Incoming>,
    env: &EnvironmentSource,
    judges: &Arc<tokio::sync::Semaphore>,
) -> Response<Full<Bytes>> {
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
    let Ok(Ok(place)) = tokio::time::timeout(REVIEW_WAIT, judges.clone().acquire_owned()).await
    else {
        let mut r = plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many reviews at once; ask again\n".into(),
        );
        r.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        return r;
    };
    let env = env();
    let judged = tokio::task::spawn_blocking(move || {
        let _place = place;
        review(&body, &env)
    })
    .await;
    let Ok(judged) = judged else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the review could not be judged\n".into(),
        );
    };
    match judged {
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
