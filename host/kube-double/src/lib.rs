#![doc = include_str!("../README.md")]

pub mod rbac;
mod review;
mod route;

pub use review::{DEFAULT_AUDIENCE, Identity};

use egress_sim::kube::{
    ApiError, Cluster, DeleteOptions, FieldSelector, Key, Kind, LabelSelector, Options, Patch,
    Selection, Subresource,
};
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::rt::TokioIo;
use route::Target;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use egress_sim::kube as model;

type Body = BoxBody<Bytes, Infallible>;

/// A request as the double received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// The body as JSON (Null when empty or not JSON).
    pub body: Value,
}

impl Recorded {
    /// `METHOD /path`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    pub fn is_watch(&self) -> bool {
        self.query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1")
    }
}

/// What a route does instead of (or before) its ordinary answer.
#[derive(Clone)]
pub enum Fault {
    /// Answer this error.
    Error(ApiError),
    /// Answer what the function returns for the n-th matching request (from 1): an error, or
    /// None to serve it normally.
    With(Arc<dyn Fn(u64) -> Option<ApiError> + Send + Sync>),
    /// Serve it normally after this long.
    Delay(Duration),
    /// Hold the request until [`Double::release`] (then serve it normally), or forever.
    Hold,
    /// Serve it (a write is stored), then answer this error instead of the result: the reply
    /// an API server gives when etcd committed the write but the answer was lost on the way.
    ServeThenError(ApiError),
    /// Answer as the API server does when the resourceVersion a request names is older than
    /// its history (etcd compacted it): a watch gets one ERROR event carrying 410 Expired and
    /// ends, so its client lists again; any other request is 410 Gone. A request that names
    /// no resourceVersion, or "0" (any), cannot be too old: it is served normally.
    Expired,
}

/// Which requests a fault applies to.
#[derive(Debug, Clone)]
pub struct Route {
    pub method: Option<Method>,
    /// The path starts with this.
    pub path_prefix: String,
    /// Only watch requests, only non-watch requests, or both.
    pub watch: Option<bool>,
}

impl Route {
    pub fn new(method: Method, path_prefix: &str) -> Self {
        Self {
            method: Some(method),
            path_prefix: path_prefix.to_string(),
            watch: Some(false),
        }
    }

    fn matches(&self, r: &Recorded) -> bool {
        self.method.as_ref().is_none_or(|m| m.as_str() == r.method)
            && r.path.starts_with(&self.path_prefix)
            && self.watch.is_none_or(|w| w == r.is_watch())
    }
}

struct Rule {
    route: Route,
    fault: Fault,
    /// How many more times it fires (None: always).
    times: Option<u64>,
    seen: u64,
}

/// How the double is set up.
#[derive(Debug, Clone)]
pub struct Config {
    pub options: Options,
    /// The model's time at start (Unix milliseconds).
    pub start_ms: u64,
    /// How often an idle watch sends a BOOKMARK (when asked for bookmarks).
    pub bookmark_interval: Duration,
    /// How often the kubelet runs between requests (when there is one), so watchers of Pods
    /// see them start.
    pub tick_interval: Duration,
    /// Namespaces created at start.
    pub namespaces: Vec<String>,
    /// `gitVersion` at /version.
    pub server_version: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            options: Options {
                require_namespaces: true,
                ..Options::default()
            },
            // 2026-01-01T00:00:00Z.
            start_ms: 1_767_225_600_000,
            bookmark_interval: Duration::from_secs(60),
            tick_interval: Duration::from_millis(200),
            namespaces: vec!["default".into(), "kube-system".into()],
            server_version: "v1.33.0".into(),
        }
    }
}

struct Shared {
    cluster: Mutex<Cluster>,
    revision: tokio::sync::watch::Sender<u64>,
    requests: Mutex<Vec<Recorded>>,
    rules: Mutex<Vec<Rule>>,
    release: tokio::sync::watch::Sender<u64>,
    /// Bumped to end every watch open at that moment.
    cut: tokio::sync::watch::Sender<u64>,
    start_ms: u64,
    started: tokio::time::Instant,
    offset_ms: AtomicU64,
    bookmark_interval: Duration,
    server_version: String,
    /// The tokens TokenReview authenticates, and as whom.
    tokens: Mutex<HashMap<String, Identity>>,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.start_ms
            + self.started.elapsed().as_millis() as u64
            + self.offset_ms.load(Ordering::SeqCst)
    }

    /// Runs `f` on the model at the current time, and wakes watchers when it changed.
    fn with<T>(&self, f: impl FnOnce(&mut Cluster) -> T) -> T {
        let mut c = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
        c.set_now(self.now_ms());
        let before = c.revision();
        let out = f(&mut c);
        let after = c.revision();
        drop(c);
        if after != before {
            self.revision.send_replace(after);
        }
        out
    }
}

/// The kinds of rbac.authorization.k8s.io the double stores beside the model's.
const RBAC_KINDS: &[Kind] = &[
    Kind::namespaced(rbac::API_VERSION, "Role", "roles"),
    Kind::namespaced(rbac::API_VERSION, "RoleBinding", "rolebindings"),
    Kind::cluster(rbac::API_VERSION, "ClusterRole", "clusterroles"),
    Kind::cluster(
        rbac::API_VERSION,
        "ClusterRoleBinding",
        "clusterrolebindings",
    ),
];

/// A running double. Dropping it stops the server.
pub struct Double {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Double {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The double could not start.
#[derive(Debug)]
pub struct StartError(pub std::io::Error);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "binding the API double on 127.0.0.1: {}", self.0)
    }
}

impl std::error::Error for StartError {}

impl Double {
    /// Starts on 127.0.0.1 at a free port with the default config.
    pub async fn start() -> Result<Self, StartError> {
        Self::start_with(Config::default()).await
    }

    pub async fn start_with(config: Config) -> Result<Self, StartError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(StartError)?;
        let addr = listener.local_addr().map_err(StartError)?;
        let kubelet = config.options.kubelet.is_some();
        let mut options = config.options;
        // RBAC's kinds, which SubjectAccessReview reads.
        for kind in RBAC_KINDS {
            let served = egress_sim::kube::KINDS
                .iter()
                .chain(&options.extra_kinds)
                .any(|k| k.api_version == kind.api_version && k.kind == kind.kind);
            if !served {
                options.extra_kinds.push(kind.clone());
            }
        }
        let mut cluster = Cluster::new(options);
        cluster.set_now(config.start_ms);
        for ns in &config.namespaces {
            // Creating a namespace in a fresh cluster only fails for an invalid name.
            let _ = cluster.create("v1", "Namespace", None, json!({"metadata": {"name": ns}}));
        }
        let shared = Arc::new(Shared {
            revision: tokio::sync::watch::Sender::new(cluster.revision()),
            cluster: Mutex::new(cluster),
            requests: Mutex::new(Vec::new()),
            rules: Mutex::new(Vec::new()),
            release: tokio::sync::watch::Sender::new(0),
            cut: tokio::sync::watch::Sender::new(0),
            start_ms: config.start_ms,
            started: tokio::time::Instant::now(),
            offset_ms: AtomicU64::new(0),
            bookmark_interval: config.bookmark_interval,
            server_version: config.server_version,
            tokens: Mutex::new(HashMap::new()),
        });
        let mut tasks = vec![tokio::spawn(accept(listener, shared.clone()))];
        if kubelet {
            let s = shared.clone();
            let every = config.tick_interval;
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    tick.tick().await;
                    s.with(Cluster::tick);
                }
            }));
        }
        Ok(Self {
            shared,
            addr,
            tasks,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kube client of the double's URL, as `kube::Config::new` builds one.
    pub fn client(&self) -> kube::Client {
        self.client_in("default")
    }

    /// A client whose default namespace is `namespace`.
    pub fn client_in(&self, namespace: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().unwrap_or_default());
        config.default_namespace = namespace.to_string();
        // A URL of http://127.0.0.1:port always makes a client.
        kube::Client::try_from(config).unwrap_or_else(|_| unreachable!("a plain HTTP client"))
    }

    /// A client whose requests reach the same HTTP/1.1 server over an in-process pipe
    /// instead of a socket. With paused tokio time a test's clock then moves only when every
    /// task waits on a timer: over a socket it would also jump while a request sits in the
    /// kernel between the two ends, firing timeouts early.
    pub fn client_in_memory(&self) -> kube::Client {
        let shared = self.shared.clone();
        let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
            let shared = shared.clone();
            async move {
                let (client_io, server_io) = tokio::io::duplex(256 * 1024);
                tokio::spawn(serve_connection(server_io, shared));
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(client_io)).await?;
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!("API double pipe: {e}");
                    }
                });
                sender.send_request(req).await
            }
        });
        kube::Client::new(svc, "default")
    }

    /// A kubeconfig for the double, whose context is in `namespace`.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster: {{server: \"{}\"}}\nusers:\n- name: double\n  user: {{}}\ncontexts:\n- name: double\n  context: {{cluster: double, user: double, namespace: {namespace}}}\ncurrent-context: double\n",
            self.url()
        )
    }

    /// Runs `f` on the model (to seed or inspect it) at the double's time.
    pub fn with<T>(&self, f: impl FnOnce(&mut Cluster) -> T) -> T {
        self.shared.with(f)
    }

    /// The object stored at `key`.
    pub fn object(&self, key: &Key) -> Option<Value> {
        self.with(|c| c.peek(key)).map(|v| (*v).clone())
    }

    /// Every object stored, in key order.
    pub fn objects(&self) -> Vec<Value> {
        self.with(|c| c.objects().map(|(_, v)| (**v).clone()).collect())
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn clear_requests(&self) {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Injects `fault` on `route` for the next `times` matching requests (None: all).
    pub fn fault(&self, route: Route, fault: Fault, times: Option<u64>) {
        self.shared
            .rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Rule {
                route,
                fault,
                times,
                seen: 0,
            });
    }

    /// Removes every fault; held requests stay held until [`Double::release`].
    pub fn clear_faults(&self) {
        self.shared
            .rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Lets every held request go on.
    pub fn release(&self) {
        self.shared.release.send_modify(|n| *n += 1);
    }

    /// Ends every watch open now, as an API server restarting (or a load balancer's idle
    /// timeout) does: each stream ends without an event, and its client watches again from
    /// the last resourceVersion it saw. Watches started after this are not affected.
    pub fn cut_watches(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// Makes TokenReview authenticate `token` as `who` (replacing what it was).
    pub fn add_token(&self, token: &str, who: Identity) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_string(), who);
    }

    /// Makes TokenReview authenticate `token` as no one from now on.
    pub fn revoke_token(&self, token: &str) {
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token);
    }

    /// A new token of the ServiceAccount `namespace/name`, as its Pods mount one: issued for
    /// the API server's own audience.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.projected_token(namespace, name, &[review::DEFAULT_AUDIENCE])
    }

    /// A new token of the ServiceAccount `namespace/name` issued for `audiences`, as a
    /// projected `serviceAccountToken` volume with that audience mounts one (a TokenRequest
    /// may name several), shaped as a real one: a JWT (a header, claims naming the account, a
    /// signature, each base64url), signed by no key, which only this double's TokenReview
    /// accepts.
    pub fn projected_token(&self, namespace: &str, name: &str, audiences: &[&str]) -> String {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write(namespace.as_bytes());
        h.write(name.as_bytes());
        for a in audiences {
            h.write(a.as_bytes());
        }
        let part = |text: &str| {
            use base64::Engine;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
        };
        let token = format!(
            "{}.{}.{}",
            part(r#"{"alg":"RS256","kid":"kube-double"}"#),
            part(&format!(
                r#"{{"iss":"https://kubernetes.default.svc","sub":"system:serviceaccount:{namespace}:{name}"}}"#
            )),
            part(&format!("{:016x}", h.finish()))
        );
        let mut who = Identity::service_account(namespace, name);
        who.audiences = audiences.iter().map(|a| a.to_string()).collect();
        self.add_token(&token, who);
        token
    }

    /// Moves the model's clock on (the kubelet runs at the next request or tick).
    pub fn advance(&self, by: Duration) {
        self.shared
            .offset_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        self.with(Cluster::tick);
    }
}

async fn accept(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve_connection(stream, shared.clone()));
    }
}

/// Serves one HTTP/1.1 connection, over a socket or an in-process pipe.
async fn serve_connection<I>(io: I, shared: Arc<Shared>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(shared, req).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await
    {
        tracing::debug!("API double connection: {e}");
    }
}

fn full(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(e: &ApiError) -> Response<Body> {
    full(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.status(),
    )
}

fn object(status: StatusCode, v: &Value) -> Response<Body> {
    full(status, v)
}

/// The fault for a request, counting it against each rule it matches, in the order they were
/// added, until one answers: a [`Fault::With`] that lets the request through, or an
/// [`Fault::Expired`] of a request that names no version, leaves it to the next rule.
fn fault_for(shared: &Shared, r: &Recorded) -> Option<Fault> {
    let mut rules = shared.rules.lock().unwrap_or_else(|p| p.into_inner());
    for rule in rules
        .iter_mut()
        .filter(|rule| rule.route.matches(r) && rule.times != Some(0))
    {
        if let Some(t) = rule.times.as_mut() {
            *t -= 1;
        }
        rule.seen += 1;
        match &rule.fault {
            Fault::With(f) => {
                if let Some(e) = f(rule.seen) {
                    return Some(Fault::Error(e));
                }
            }
            Fault::Expired if !names_a_version(r) => {}
            other => return Some(other.clone()),
        }
    }
    None
}

/// Whether a request names a resourceVersion that could be too old: any but none and "0".
fn names_a_version(r: &Recorded) -> bool {
    route::query(Some(&r.query))
        .iter()
        .any(|(k, v)| k == "resourceVersion" && !v.is_empty() && v != "0")
}

/// The API server's answer to a resourceVersion older than its history: for a watch, a 200
/// stream of one ERROR event (410 Expired); for anything else, 410 Gone.
fn expired(r: &Recorded) -> Response<Body> {
    let e = ApiError::gone("too old resource version");
    if !r.is_watch() {
        return error(&e);
    }
    let mut out = Response::new(Full::new(line("ERROR", &e.status())).boxed());
    out.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    out
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let recorded = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or("").to_string(),
        content_type: parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    };
    shared
        .requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(recorded.clone());
    match fault_for(&shared, &recorded) {
        Some(Fault::Error(e)) => return error(&e),
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        Some(Fault::Hold) => {
            let mut rx = shared.release.subscribe();
            rx.mark_unchanged();
            if rx.changed().await.is_err() {
                return error(&ApiError::new(503, "ServiceUnavailable", "shutting down"));
            }
        }
        Some(Fault::ServeThenError(e)) => {
            let _ = serve(&shared, &parts.method, &recorded, &bytes).await;
            return error(&e);
        }
        Some(Fault::Expired) => return expired(&recorded),
        Some(Fault::With(_)) | None => {}
    }
    serve(&shared, &parts.method, &recorded, &bytes)
        .await
        .unwrap_or_else(|e| error(&e))
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

fn kind_of(shared: &Shared, api_version: &str, plural: &str) -> Result<Kind, ApiError> {
    shared
        .with(|c| c.kind_by_plural(api_version, plural))
        .ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })
}

fn json_body(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))
}

async fn serve(
    shared: &Arc<Shared>,
    method: &Method,
    r: &Recorded,
    bytes: &[u8],
) -> Result<Response<Body>, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    if *method == Method::POST && r.path == review::TOKEN_REVIEWS {
        let body = json_body(bytes)?;
        let tokens = shared.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let review = review::token_review(&body, |t| tokens.get(t).cloned())?;
        return Ok(object(StatusCode::CREATED, &review));
    }
    if *method == Method::POST && r.path == review::SUBJECT_ACCESS_REVIEWS {
        let body = json_body(bytes)?;
        let objects = shared.with(review::rbac_objects);
        let review = review::subject_access_review(&body, &objects)?;
        return Ok(object(StatusCode::CREATED, &review));
    }
    let target = route::parse(&r.path).ok_or_else(not_found)?;
    let q = route::query(Some(&r.query));
    let (api_version, plural, namespace, name, sub) = match target {
        Target::Version => {
            return Ok(object(
                StatusCode::OK,
                &json!({"major": "1", "minor": "33", "gitVersion": shared.server_version, "platform": "linux/amd64"}),
            ));
        }
        Target::Discovery { api_version } => return Ok(discovery(&api_version)),
        Target::Resource {
            api_version,
            plural,
            namespace,
            name,
            subresource,
        } => (api_version, plural, namespace, name, subresource),
    };
    let kind = kind_of(shared, &api_version, &plural)?;
    if kind.namespaced != namespace.is_some() && name.is_some() {
        return Err(not_found());
    }
    let sub = match sub.as_deref() {
        None => Subresource::Main,
        Some("status") if kind.status => Subresource::Status,
        Some("scale") if kind.scale.is_some() => {
            let Some(name) = name.filter(|_| namespace.is_some() || !kind.namespaced) else {
                return Err(not_found());
            };
            let key = Key::new(&kind.api_version, &kind.kind, namespace.as_deref(), &name);
            return scale(shared, method, r, &q, &key, bytes);
        }
        Some(_) => return Err(not_found()),
    };
    if param(&q, "dryRun").is_some() {
        return Err(ApiError::bad_request(
            "dryRun is not supported by this API double",
        ));
    }
    let ns = namespace.as_deref();
    let Some(name) = name else {
        return match *method {
            Method::GET => collection(shared, &kind, ns, &q),
            Method::POST => {
                let body = json_body(bytes)?;
                let created = shared.with(|c| c.create(&kind.api_version, &kind.kind, ns, body))?;
                Ok(object(StatusCode::CREATED, &created))
            }
            _ => Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{method} of a collection is not supported"),
            )),
        };
    };
    let key = Key::new(&kind.api_version, &kind.kind, ns, &name);
    match *method {
        Method::GET => Ok(object(StatusCode::OK, &*shared.with(|c| c.get(&key))?)),
        Method::PUT => {
            let body = json_body(bytes)?;
            Ok(object(
                StatusCode::OK,
                &*shared.with(|c| c.replace(&key, body, sub))?,
            ))
        }
        Method::PATCH => {
            let patch = patch_of(r, &q, bytes)?;
            let created_before = shared.with(|c| c.peek(&key).is_none());
            let out = shared.with(|c| c.patch(&key, &patch, sub))?;
            let code = if created_before {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(object(code, &out))
        }
        Method::DELETE => {
            let body: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
            let pre = &body["preconditions"];
            let opts = DeleteOptions {
                resource_version: pre["resourceVersion"].as_str().map(str::to_string),
                uid: pre["uid"].as_str().map(str::to_string),
            };
            let out = shared.with(|c| c.delete(&key, &opts))?;
            let gone = shared.with(|c| c.peek(&key).is_none());
            let code = if gone {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            Ok(object(code, &out))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported"),
        )),
    }
}

/// A PATCH's body as the patch its content type names.
fn patch_of(r: &Recorded, q: &[(String, String)], bytes: &[u8]) -> Result<Patch, ApiError> {
    let body = json_body(bytes)?;
    let ct = r.content_type.split(';').next().unwrap_or("").trim();
    Ok(match ct {
        "application/merge-patch+json" => Patch::Merge(body),
        "application/json-patch+json" => Patch::Json(body),
        "application/strategic-merge-patch+json" => Patch::Strategic(body),
        "application/apply-patch+yaml" | "application/apply-patch+json" => Patch::Apply {
            object: body,
            field_manager: param(q, "fieldManager").unwrap_or("").to_string(),
        },
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
                ),
            ));
        }
    })
}

/// The scale subresource: GET, PUT and PATCH of an `autoscaling/v1` Scale.
fn scale(
    shared: &Arc<Shared>,
    method: &Method,
    r: &Recorded,
    q: &[(String, String)],
    key: &Key,
    bytes: &[u8],
) -> Result<Response<Body>, ApiError> {
    let out = match *method {
        Method::GET => shared.with(|c| c.get_scale(key))?,
        Method::PUT => {
            let body = json_body(bytes)?;
            shared.with(|c| c.replace_scale(key, body))?
        }
        Method::PATCH => {
            let patch = patch_of(r, q, bytes)?;
            shared.with(|c| c.patch_scale(key, &patch))?
        }
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{method} of a scale subresource is not supported"),
            ));
        }
    };
    Ok(object(StatusCode::OK, &out))
}

fn discovery(api_version: &str) -> Response<Body> {
    let kinds: Vec<Kind> = egress_sim::kube::KINDS
        .iter()
        .filter(|k| k.api_version == api_version)
        .cloned()
        .collect();
    let mut resources = Vec::new();
    for k in &kinds {
        resources.push(
            json!({"name": k.plural, "namespaced": k.namespaced, "kind": k.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}),
        );
        if k.status {
            resources.push(
                json!({"name": format!("{}/status", k.plural), "namespaced": k.namespaced,
                "kind": k.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if k.scale.is_some() {
            resources.push(
                json!({"name": format!("{}/scale", k.plural), "namespaced": k.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale",
                "verbs": ["get", "patch", "update"]}),
            );
        }
    }
    if kinds.is_empty() {
        return error(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    object(
        StatusCode::OK,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version, "resources": resources}),
    )
}

fn selection(kind: &Kind, ns: Option<&str>, q: &[(String, String)]) -> Result<Selection, ApiError> {
    let mut sel = Selection::of(&kind.api_version, &kind.kind, ns);
    if let Some(l) = param(q, "labelSelector") {
        sel.labels = LabelSelector::parse(l).map_err(ApiError::bad_request)?;
    }
    if let Some(f) = param(q, "fieldSelector") {
        sel.fields = FieldSelector::parse(f).map_err(ApiError::bad_request)?;
    }
    Ok(sel)
}

fn collection(
    shared: &Arc<Shared>,
    kind: &Kind,
    ns: Option<&str>,
    q: &[(String, String)],
) -> Result<Response<Body>, ApiError> {
    let sel = selection(kind, ns, q)?;
    if matches!(param(q, "watch"), Some("true" | "1")) {
        return watch(shared, kind, sel, q);
    }
    let limit = param(q, "limit")
        .map(|l| {
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("limit {l:?} is not a number")))
        })
        .transpose()?
        .filter(|l| *l > 0)
        // A list at resourceVersion 0 (a client's "any" semantic) is served from the API
        // server's watch cache, which answers it whole, whatever the limit (kubernetes#70735).
        .filter(|_| !(param(q, "resourceVersion") == Some("0") && param(q, "continue").is_none()));
    let page = shared.with(|c| c.list(&sel, limit, param(q, "continue")))?;
    let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
    if let Some(t) = &page.continue_token {
        metadata["continue"] = json!(t);
    }
    if let Some(n) = page.remaining {
        metadata["remainingItemCount"] = json!(n);
    }
    let items: Vec<&Value> = page.items.iter().map(|v| v.as_ref()).collect();
    Ok(object(
        StatusCode::OK,
        &json!({"apiVersion": kind.api_version, "kind": format!("{}List", kind.kind),
                "metadata": metadata, "items": items}),
    ))
}

fn line(type_: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": type_, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn watch(
    shared: &Arc<Shared>,
    kind: &Kind,
    sel: Selection,
    q: &[(String, String)],
) -> Result<Response<Body>, ApiError> {
    let from = match param(q, "resourceVersion") {
        None | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?,
        ),
    };
    let bookmarks = matches!(param(q, "allowWatchBookmarks"), Some("true" | "1"));
    let initial_events = matches!(param(q, "sendInitialEvents"), Some("true" | "1"));
    let timeout = param(q, "timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let shared = shared.clone();
    let api_version = kind.api_version.to_string();
    let kind_name = kind.kind.to_string();
    let mut cut = shared.cut.subscribe();
    cut.mark_unchanged();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changed = shared.revision.subscribe();
        let bookmark = |rv: u64| json!({"kind": kind_name, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}});
        let mut at = match from {
            Some(rv) if !initial_events => rv,
            _ => {
                // No version (or initial events asked for): the current objects as ADDED,
                // then what changes after them.
                let (items, rev) = shared.with(|c| c.snapshot(&sel));
                for o in items {
                    if tx.send(line("ADDED", &o)).await.is_err() {
                        return;
                    }
                }
                if initial_events {
                    let mut b = bookmark(rev);
                    b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                    if tx.send(line("BOOKMARK", &b)).await.is_err() {
                        return;
                    }
                }
                rev
            }
        };
        loop {
            changed.mark_unchanged();
            let (events, upto) =
                match shared.with(|c| c.changes_since(&sel, at).map(|e| (e, c.revision()))) {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = tx.send(line("ERROR", &e.status())).await;
                        return;
                    }
                };
            for e in events {
                if tx.send(line(e.type_.as_str(), &e.object)).await.is_err() {
                    return;
                }
            }
            at = upto;
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(shared.bookmark_interval), if bookmarks => {
                    if tx.send(line("BOOKMARK", &bookmark(at))).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = cut.changed() => return,
                _ = tx.closed() => return,
            }
        }
    });
    let mut rx = rx;
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

#[cfg(test)]
mod tests;
