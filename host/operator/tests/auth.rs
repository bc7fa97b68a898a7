//! Who may call the operator's HTTP API, over real HTTP on loopback: callers' ServiceAccount
//! tokens reviewed by the API double as the API server reviews them (TokenReview, then
//! SubjectAccessReview against the RBAC stored in it, with the deploy's ClusterRoles), and
//! named tokens from a file; the answers (401, 403, 503, never a silent allow), the cache in
//! front of the reviews, and a log that never holds a token.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_control::api::{self, Api, ProxySource, Readiness};
use egress_control::metrics::Metrics;
use egress_core::discovery::{Discovered, Filter};
use egress_serve::auth::kube::KubeReviewer;
use egress_serve::auth::tokens::{TokenFile, sha256_hex};
use egress_serve::auth::{CachePolicy, Guard, Now, Reviewer};
use http::Method;
use kube_double::model::ApiError;
use kube_double::{Config, Double, Fault, Route};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{bind, deploy_cluster_role, get, request};

/// Three proxies: two pools of `crawlers`, one of `other`.
struct Fixed;

fn proxy(namespace: &str, name: &str, pool: &str) -> Discovered {
    Discovered {
        namespace: namespace.into(),
        name: name.into(),
        provider: "cluster".into(),
        url: format!("http://10.0.0.{}:3128", name.len()),
        username: None,
        password: None,
        egress_ip: None,
        egress_shared: false,
        zone: None,
        pool: Some(pool.into()),
        verified_at: None,
        latency_ms: None,
    }
}

impl ProxySource for Fixed {
    fn discover(&self, filter: &Filter) -> Vec<Discovered> {
        [
            proxy("crawlers", "p1", "web"),
            proxy("crawlers", "p2", "api"),
            proxy("other", "p3", "web"),
        ]
        .into_iter()
        .filter(|d| filter.namespace.as_ref().is_none_or(|n| *n == d.namespace))
        .filter(|d| {
            filter
                .pool
                .as_ref()
                .is_none_or(|p| Some(p) == d.pool.as_ref())
        })
        .collect()
    }
}

/// A clock the test moves.
#[derive(Clone)]
struct Clock(Arc<Mutex<Instant>>);

impl Clock {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }
    fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }
    fn now(&self) -> Now {
        let c = self.0.clone();
        Arc::new(move || *c.lock().unwrap())
    }
}

async fn serve(reviewer: Arc<dyn Reviewer>, clock: &Clock) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Arc::new(Readiness::default());
    ready.set(true);
    let metrics = Metrics::new();
    metrics.reconciled("ok");
    tokio::spawn(api::serve(
        listener,
        Arc::new(Api {
            audit: None,
            demand: None,
            metrics: Arc::new(metrics),
            ready,
            source: Arc::new(Fixed),
            guard: Arc::new(Guard::with(reviewer, CachePolicy::default(), clock.now())),
            leases: None,
        }),
    ));
    addr
}

/// The names listed, from a JSON answer.
fn names(body: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// The tokens of the cases, whichever side reviews them.
struct Callers {
    /// Bound to see the proxies of `crawlers`.
    spider: String,
    /// Bound to see the proxies of `other`.
    other_spider: String,
    /// Bound to see every namespace's proxies.
    lister: String,
    /// Bound to read /metrics.
    prometheus: String,
}

struct Kube {
    d: Double,
    addr: SocketAddr,
    clock: Clock,
    callers: Callers,
}

/// The API double with the deploy's crawler and metrics-reader ClusterRoles bound as a cluster
/// admin would bind them, and the server reviewing through it.
async fn kube() -> Kube {
    let d = Double::start_with(Config {
        namespaces: [
            "default",
            "kube-system",
            "crawlers",
            "other",
            "ops",
            "monitoring",
        ]
        .map(String::from)
        .to_vec(),
        ..Config::default()
    })
    .await
    .unwrap();
    deploy_cluster_role(&d, "egress-proxies-crawler").await;
    deploy_cluster_role(&d, "egress-proxies-metrics-reader").await;
    let crawler = "egress-proxies-crawler";
    bind(&d, crawler, "crawlers", "spider", Some("crawlers")).await;
    bind(&d, crawler, "other", "spider", Some("other")).await;
    bind(&d, crawler, "ops", "lister", None).await;
    bind(
        &d,
        "egress-proxies-metrics-reader",
        "monitoring",
        "prometheus",
        None,
    )
    .await;
    // Crawlers present projected tokens made for egress-proxies; the scraper its
    // ServiceAccount's token Secret, made for the API server. Those that also call the other
    // endpoint (to be refused by RBAC there) hold a token made for both.
    let ours = egress_serve::auth::AUDIENCE;
    let both = [ours, kube_double::DEFAULT_AUDIENCE];
    let callers = Callers {
        spider: d.projected_token("crawlers", "spider", &both),
        other_spider: d.projected_token("other", "spider", &[ours]),
        lister: d.projected_token("ops", "lister", &[ours]),
        prometheus: d.projected_token("monitoring", "prometheus", &both),
    };
    let clock = Clock::new();
    let addr = serve(Arc::new(KubeReviewer::new(d.client())), &clock).await;
    Kube {
        d,
        addr,
        clock,
        callers,
    }
}

const FILE_TOKENS: [&str; 4] = [
    "spider-secret",
    "other-secret",
    "lister-secret",
    "prom-secret",
];

/// The server admitting the named tokens of a file granting what the RBAC of [`kube`] grants.
async fn token_file() -> (SocketAddr, Callers) {
    let [spider, other, lister, prometheus] = FILE_TOKENS.map(sha256_hex);
    let file = TokenFile::parse(&format!(
        "tokens:
  - name: spider
    sha256: {spider}
    namespaces: [{{name: crawlers}}]
  - name: other-spider
    sha256: {other}
    namespaces: [{{name: other}}]
  - name: lister
    sha256: {lister}
    allNamespaces: true
  - name: prometheus
    sha256: {prometheus}
    metrics: true
"
    ))
    .unwrap();
    let addr = serve(Arc::new(file), &Clock::new()).await;
    let [spider, other_spider, lister, prometheus] = FILE_TOKENS.map(String::from);
    (
        addr,
        Callers {
            spider,
            other_spider,
            lister,
            prometheus,
        },
    )
}

async fn get_as(addr: SocketAddr, target: &str, token: &str) -> (u16, String) {
    support::get_as(addr, target, token).await
}

/// The cases both sides answer alike.
async fn the_cases(addr: SocketAddr, c: &Callers) {
    // No token, a malformed one, an unknown one: 401 with the Bearer challenge.
    for target in ["/v1/proxies?namespace=crawlers", "/metrics"] {
        for headers in [
            &[][..],
            &[("Authorization", "Basic c3BpZGVyOng=")],
            &[("Authorization", "Bearer not-a-token")],
        ] {
            let (code, head, body) = request(addr, target, headers).await;
            assert_eq!(code, 401, "{target} {headers:?}: {body}");
            let challenge = head
                .lines()
                .find_map(|l| l.strip_prefix("www-authenticate: "))
                .unwrap_or_else(|| panic!("no challenge: {head}"));
            assert!(challenge.starts_with("Bearer"), "{challenge}");
        }
    }

    // The right namespace: its proxies; a pool of it: that pool's.
    let (code, body) = get_as(addr, "/v1/proxies?namespace=crawlers", &c.spider).await;
    assert_eq!((code, names(&body)), (200, vec!["p1".into(), "p2".into()]));
    let (code, body) = get_as(addr, "/v1/proxies?namespace=crawlers&pool=web", &c.spider).await;
    assert_eq!((code, names(&body)), (200, vec!["p1".into()]));
    let (code, body) = get_as(addr, "/v1/proxies?namespace=other", &c.other_spider).await;
    assert_eq!((code, names(&body)), (200, vec!["p3".into()]));

    // Bound in another namespace: 403, saying what is missing.
    let (code, why) = get_as(addr, "/v1/proxies?namespace=crawlers", &c.other_spider).await;
    assert_eq!(code, 403, "{why}");
    assert!(
        why.contains("proxypools/proxies") && why.contains("crawlers"),
        "{why}"
    );
    let (code, _) = get_as(addr, "/v1/proxies?namespace=other&pool=web", &c.spider).await;
    assert_eq!(code, 403);

    // Every namespace: only a caller allowed across the cluster; the others are told to
    // name one.
    let (code, why) = get_as(addr, "/v1/proxies", &c.spider).await;
    assert_eq!(code, 403, "{why}");
    assert!(why.contains("pass namespace="), "{why}");
    let (code, body) = get_as(addr, "/v1/proxies?format=json", &c.lister).await;
    assert_eq!(
        (code, names(&body)),
        (200, vec!["p1".into(), "p2".into(), "p3".into()])
    );

    // /metrics: only to who may get the URL.
    let (code, why) = get_as(addr, "/metrics", &c.spider).await;
    assert_eq!(code, 403, "{why}");
    assert!(why.contains("/metrics"), "{why}");
    let (code, body) = get_as(addr, "/metrics", &c.prometheus).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("reconcile"), "{body}");
    // Reading metrics is not listing proxies.
    let (code, _) = get_as(addr, "/v1/proxies?namespace=crawlers", &c.prometheus).await;
    assert_eq!(code, 403);

    // A malformed query of an authenticated caller is still a 400.
    let (code, why) = get_as(addr, "/v1/proxies?zone=z1", &c.spider).await;
    assert_eq!(code, 400, "{why}");

    // The probes are open: the kubelet sends no token.
    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert_eq!(get(addr, "/readyz").await.0, 200);
}

#[tokio::test]
async fn service_accounts_see_what_rbac_grants_them() {
    let k = kube().await;
    the_cases(k.addr, &k.callers).await;
}

#[tokio::test]
async fn named_tokens_see_what_their_file_grants_them() {
    let (addr, callers) = token_file().await;
    the_cases(addr, &callers).await;
}

/// The SubjectAccessReview is of the user the TokenReview found (name, uid, groups, extra),
/// on proxypools/proxies of the asked namespace and pool, or on the URL /metrics.
#[tokio::test]
async fn the_access_review_is_of_the_user_the_token_review_found() {
    let k = kube().await;
    k.d.clear_requests();
    let (code, _) = get_as(
        k.addr,
        "/v1/proxies?namespace=crawlers&pool=web",
        &k.callers.spider,
    )
    .await;
    assert_eq!(code, 200);
    get_as(k.addr, "/metrics", &k.callers.spider).await;
    let reviews: Vec<_> =
        k.d.requests()
            .into_iter()
            .filter(|r| r.method == "POST")
            .collect();
    let lines: Vec<String> = reviews.iter().map(|r| r.line()).collect();
    assert_eq!(
        lines,
        [
            "POST /apis/authentication.k8s.io/v1/tokenreviews",
            "POST /apis/authorization.k8s.io/v1/subjectaccessreviews",
            "POST /apis/authentication.k8s.io/v1/tokenreviews",
            "POST /apis/authorization.k8s.io/v1/subjectaccessreviews",
        ]
    );
    // A crawler's token is reviewed for egress-proxies; a scraper's for the API server's
    // own audience (none asked), which its ServiceAccount's token Secret carries.
    assert_eq!(
        reviews[0].body["spec"]["audiences"],
        serde_json::json!(["egress-proxies"])
    );
    assert!(reviews[2].body["spec"].get("audiences").is_none());
    let spec = &reviews[1].body["spec"];
    assert_eq!(spec["user"], "system:serviceaccount:crawlers:spider");
    assert_eq!(
        spec["groups"],
        serde_json::json!([
            "system:serviceaccounts",
            "system:serviceaccounts:crawlers",
            "system:authenticated"
        ])
    );
    assert!(spec["uid"].is_string(), "{spec}");
    assert!(
        spec["extra"]["authentication.kubernetes.io/credential-id"].is_array(),
        "{spec}"
    );
    assert_eq!(
        spec["resourceAttributes"],
        serde_json::json!({"group": "crawl.example.com", "resource": "proxypools",
            "subresource": "proxies", "verb": "get", "namespace": "crawlers", "name": "web"})
    );
    assert_eq!(
        reviews[3].body["spec"]["nonResourceAttributes"],
        serde_json::json!({"path": "/metrics", "verb": "get"})
    );
}

/// A token is admitted only for the audience it was made for: the token every Pod mounts
/// (made for the API server) is refused by discovery and leases, whatever RBAC grants its
/// ServiceAccount; a projected token made for egress-proxies is admitted there and refused at
/// /metrics, whose scrapers present their token Secret; a reviewer told other audiences
/// (a migration) admits them.
#[tokio::test]
async fn a_token_serves_only_the_audience_it_was_made_for() {
    let k = kube().await;
    let mounted = k.d.service_account_token("crawlers", "spider");
    let projected =
        k.d.projected_token("crawlers", "spider", &[egress_serve::auth::AUDIENCE]);
    let (code, why) = get_as(k.addr, "/v1/proxies?namespace=crawlers", &mounted).await;
    assert_eq!(code, 401, "{why}");
    let (code, body) = get_as(k.addr, "/v1/proxies?namespace=crawlers", &projected).await;
    assert_eq!((code, names(&body)), (200, vec!["p1".into(), "p2".into()]));
    let scraper = k.d.service_account_token("monitoring", "prometheus");
    assert_eq!(get_as(k.addr, "/metrics", &scraper).await.0, 200);
    let projected_scraper =
        k.d.projected_token("monitoring", "prometheus", &[egress_serve::auth::AUDIENCE]);
    assert_eq!(get_as(k.addr, "/metrics", &projected_scraper).await.0, 401);
    assert_eq!(
        get_as(k.addr, "/v1/proxies?namespace=crawlers", &projected_scraper)
            .await
            .0,
        403
    );

    // Told to admit the API server's own audience too, the mounted token serves.
    let migrating = serve(
        Arc::new(KubeReviewer::new(k.d.client()).with_audiences(vec![
            egress_serve::auth::AUDIENCE.into(),
            kube_double::DEFAULT_AUDIENCE.into(),
        ])),
        &k.clock,
    )
    .await;
    let (code, body) = get_as(migrating, "/v1/proxies?namespace=crawlers", &mounted).await;
    assert_eq!((code, names(&body)), (200, vec!["p1".into(), "p2".into()]));
}

/// A review the API server could not make is a 503, never an allow, and is asked again on
/// the next request rather than kept.
#[tokio::test]
async fn a_review_that_fails_is_503_and_not_kept() {
    let k = kube().await;
    let target = "/v1/proxies?namespace=crawlers";
    let failing = |path: &str| {
        k.d.fault(
            Route::new(Method::POST, path),
            Fault::Error(ApiError::new(500, "InternalError", "etcd is down")),
            Some(1),
        )
    };
    failing("/apis/authentication.k8s.io/v1/tokenreviews");
    let (code, head, body) = request(
        k.addr,
        target,
        &[("Authorization", &format!("Bearer {}", k.callers.spider))],
    )
    .await;
    assert_eq!(code, 503, "{body}");
    assert!(head.contains("retry-after: "), "{head}");
    assert!(
        !body.contains("etcd"),
        "the API server's message is its own: {body}"
    );
    assert_eq!(get_as(k.addr, target, &k.callers.spider).await.0, 200);

    failing("/apis/authorization.k8s.io/v1/subjectaccessreviews");
    let (code, body) = get_as(
        k.addr,
        "/v1/proxies?namespace=crawlers&pool=api",
        &k.callers.spider,
    )
    .await;
    assert_eq!(code, 503, "{body}");
    let (code, body) = get_as(
        k.addr,
        "/v1/proxies?namespace=crawlers&pool=api",
        &k.callers.spider,
    )
    .await;
    assert_eq!(code, 200, "{body}");

    // The operator without the right to review: also 503.
    k.d.fault(
        Route::new(Method::POST, "/apis/authentication.k8s.io/v1/tokenreviews"),
        Fault::Error(ApiError::new(
            403,
            "Forbidden",
            "cannot create tokenreviews",
        )),
        Some(1),
    );
    assert_eq!(get_as(k.addr, target, &k.callers.other_spider).await.0, 503);
}

fn count(d: &Double, path: &str) -> usize {
    d.requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with(path))
        .count()
}

/// Within the TTL a caller's second request makes no review; past it, it does. Denials are
/// kept for less time than allows, and a revoked token is refused once its entry expires.
#[tokio::test]
async fn answers_are_kept_for_their_ttl() {
    let k = kube().await;
    let policy = CachePolicy::default();
    let target = "/v1/proxies?namespace=crawlers";
    let tokens = || count(&k.d, "/tokenreviews");
    let accesses = || count(&k.d, "/subjectaccessreviews");
    k.d.clear_requests();

    assert_eq!(get_as(k.addr, target, &k.callers.spider).await.0, 200);
    assert_eq!((tokens(), accesses()), (1, 1));
    k.clock.advance(policy.allowed - Duration::from_millis(1));
    assert_eq!(get_as(k.addr, target, &k.callers.spider).await.0, 200);
    assert_eq!((tokens(), accesses()), (1, 1), "asked again within the TTL");
    // Another access of the same token: its identity is kept, the new access reviewed.
    assert_eq!(
        get_as(k.addr, "/v1/proxies?namespace=other", &k.callers.spider)
            .await
            .0,
        403
    );
    assert_eq!((tokens(), accesses()), (1, 2));
    k.clock.advance(Duration::from_millis(2));
    assert_eq!(get_as(k.addr, target, &k.callers.spider).await.0, 200);
    assert_eq!(
        (tokens(), accesses()),
        (2, 3),
        "not asked again after the TTL"
    );

    // An unknown token: kept for the shorter TTL of a denial.
    let unknown = forged_jwt(0);
    assert_eq!(get_as(k.addr, target, &unknown).await.0, 401);
    assert_eq!(get_as(k.addr, target, &unknown).await.0, 401);
    assert_eq!(tokens(), 3);
    k.clock.advance(policy.denied);
    assert_eq!(get_as(k.addr, target, &unknown).await.0, 401);
    assert_eq!(tokens(), 4);
    assert!(policy.denied < policy.allowed);

    // Revoked: still admitted from the cache until its entry expires, then refused.
    k.clock.advance(policy.allowed);
    assert_eq!(get_as(k.addr, target, &k.callers.spider).await.0, 200);
    k.d.revoke_token(&k.callers.spider);
    assert_eq!(get_as(k.addr, target, &k.callers.spider).await.0, 200);
    k.clock.advance(policy.allowed);
    assert_eq!(get_as(k.addr, target, &k.callers.spider).await.0, 401);
}

/// A token of a JWT's shape (a header, claims and a signature, each base64url) that no one
/// issued: what a guesser sends.
fn forged_jwt(i: usize) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    format!(
        "{}.{}.{}",
        b64(r#"{"alg":"RS256","kid":"guess"}"#),
        b64(&format!(
            r#"{{"sub":"system:serviceaccount:crawlers:guess-{i}"}}"#
        )),
        b64(&format!("not a signature {i}"))
    )
}

/// `GET target` with `token` from the loopback address `from`: the status.
async fn get_from(from: std::net::Ipv4Addr, addr: SocketAddr, target: &str, token: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    s.write_all(
        format!("GET {target} HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out[9..12].parse().unwrap()
}

/// Every review costs the API server a request, and a caller without a token can make one
/// with any string: a token that cannot be a ServiceAccount's (not a JWT's shape) is refused
/// without a review; 200 requests with new forged tokens from one address cost no more
/// TokenReviews than that address's burst, the rest answered 503 (ask again) unreviewed, and
/// an address regains reviews with time; another address is not held back by it.
#[tokio::test]
async fn token_reviews_are_limited_per_source_and_a_malformed_token_costs_none() {
    let k = kube().await;
    let target = "/v1/proxies?namespace=crawlers";
    let tokens = || count(&k.d, "/tokenreviews");
    let limit = CachePolicy::default().per_source;
    k.d.clear_requests();

    let guesser = std::net::Ipv4Addr::new(127, 0, 0, 2);
    for malformed in [
        "not-a-token",
        "a.b",
        "eyJ.b.c.d",
        "abc.def.ghi",
        "eyJhbGciOiJSUzI1NiJ9..c2ln",
        "eyJhbGciOiJSUzI1NiJ9.e30.c2ln+",
    ] {
        assert_eq!(
            get_from(guesser, k.addr, target, malformed).await,
            401,
            "{malformed}"
        );
    }
    assert_eq!(tokens(), 0, "a malformed token was reviewed");

    let mut answers = std::collections::BTreeMap::new();
    for i in 0..200 {
        let code = get_from(guesser, k.addr, target, &forged_jwt(i)).await;
        *answers.entry(code).or_insert(0) += 1;
    }
    let reviewed = tokens();
    assert_eq!(
        reviewed, limit.burst as usize,
        "200 forged tokens from one address: {reviewed} reviews ({answers:?})"
    );
    assert_eq!(
        answers.get(&401),
        Some(&(limit.burst as usize)),
        "{answers:?}"
    );
    assert_eq!(
        answers.get(&503),
        Some(&(200 - limit.burst as usize)),
        "{answers:?}"
    );

    // Another address is served as before.
    let crawler = std::net::Ipv4Addr::new(127, 0, 0, 3);
    assert_eq!(
        get_from(crawler, k.addr, target, &k.callers.spider).await,
        200
    );
    assert_eq!(tokens(), reviewed + 1);

    // With time the guesser's address regains reviews, one per refill.
    k.clock.advance(limit.refill * 2);
    for i in 200..210 {
        get_from(guesser, k.addr, target, &forged_jwt(i)).await;
    }
    assert_eq!(tokens(), reviewed + 3);
}

/// The cache holds no more than its capacity, however many tokens are tried.
#[tokio::test]
async fn the_cache_is_bounded_by_its_capacity() {
    let spider = sha256_hex(FILE_TOKENS[0]);
    let file = TokenFile::parse(&format!(
        "tokens: [{{name: spider, sha256: {spider}, namespaces: [{{name: crawlers}}]}}]"
    ))
    .unwrap();
    let guard = Guard::with(
        Arc::new(file),
        CachePolicy {
            capacity: 8,
            ..CachePolicy::default()
        },
        Clock::new().now(),
    );
    let here = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    for i in 0..100 {
        let token = egress_serve::auth::Token::new(format!("guess-{i}"));
        assert!(guard.authenticate(here, &token).await.is_err());
    }
    let token = egress_serve::auth::Token::new(FILE_TOKENS[0]);
    let caller = guard.authenticate(here, &token).await.unwrap();
    for i in 0..100 {
        let access = egress_serve::auth::Access::Proxies {
            namespace: Some(format!("ns-{i}")),
            pool: None,
        };
        assert!(guard.authorize(&token, &caller, &access).await.is_err());
    }
    let (callers, decisions) = guard.cached();
    assert!(callers <= 8 && decisions <= 8, "{callers} {decisions}");
}

/// A writer into a shared buffer, for a subscriber that records everything.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// At every level, through allowed, denied, unknown and failed reviews, no token reaches the
/// log. The subscriber is the process's (a thread's own would miss what the tests running
/// beside this one made the callsites decide), so the other tests' logs are in it too.
#[tokio::test]
async fn no_token_reaches_the_log() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let k = kube().await;
    let spider = &k.callers.spider;
    get_as(k.addr, "/v1/proxies?namespace=crawlers", spider).await;
    get_as(k.addr, "/v1/proxies?namespace=other", spider).await;
    get_as(k.addr, "/metrics", spider).await;
    get_as(k.addr, "/metrics", "an-unknown-token-value").await;
    k.d.fault(
        Route::new(Method::POST, "/apis/"),
        Fault::Error(ApiError::new(500, "InternalError", "boom")),
        None,
    );
    get_as(
        k.addr,
        "/v1/proxies?namespace=crawlers",
        &k.callers.other_spider,
    )
    .await;
    let (addr, file_callers) = token_file().await;
    get_as(addr, "/v1/proxies?namespace=other", &file_callers.spider).await;
    get_as(addr, "/metrics", &file_callers.prometheus).await;

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("refused"), "the log was not captured: {log}");
    assert!(log.contains("TokenReview failed"), "{log}");
    for token in [
        spider.as_str(),
        k.callers.other_spider.as_str(),
        "an-unknown-token-value",
        FILE_TOKENS[0],
        FILE_TOKENS[3],
    ] {
        assert!(!log.contains(token), "a token is in the log:\n{log}");
    }
}

/// The tokens file the operator's README shows is one the operator reads.
#[test]
fn the_readmes_tokens_file_parses() {
    let readme =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let (_, rest) = readme
        .split_once("```yaml\ntokens:\n")
        .expect("the operator's README shows a tokens file");
    let (body, _) = rest.split_once("```").unwrap();
    let file = TokenFile::parse(&format!("tokens:\n{body}")).unwrap();
    assert_eq!(file.names().collect::<Vec<_>>(), ["spider", "ops"]);
}

/// The deploy's crawler role lets its holder take, renew and release (`create`) and read
/// (`get`) leases of its namespace's pools, and no other namespace's; the review asks about
/// proxypools/leases of the pool.
#[tokio::test]
async fn the_crawler_role_grants_the_leases_of_its_namespace() {
    let k = kube().await;
    let reviewer = KubeReviewer::new(k.d.client());
    let caller = reviewer
        .authenticate(&egress_serve::auth::Token::new(k.callers.spider.clone()))
        .await
        .unwrap();
    let lease = |namespace: &str, write: bool| egress_serve::auth::Access::Leases {
        namespace: namespace.into(),
        pool: "web".into(),
        write,
    };
    k.d.clear_requests();
    for write in [true, false] {
        reviewer
            .authorize(&caller, &lease("crawlers", write))
            .await
            .unwrap();
        let refused = reviewer
            .authorize(&caller, &lease("ops", write))
            .await
            .unwrap_err();
        assert_eq!(refused.status(), http::StatusCode::FORBIDDEN);
        assert!(
            refused.to_string().contains("proxypools/leases"),
            "{refused}"
        );
    }
    let review =
        k.d.requests()
            .into_iter()
            .find(|r| r.path.ends_with("subjectaccessreviews"))
            .unwrap();
    assert_eq!(
        review.body["spec"]["resourceAttributes"],
        serde_json::json!({"group": "crawl.example.com", "resource": "proxypools",
            "subresource": "leases", "verb": "create", "namespace": "crawlers", "name": "web"})
    );
}
