//! The real http capability and the real Google credential flow against a local double on
//! 127.0.0.1: an OAuth token endpoint that checks the JWT-bearer assertion (claims and RS256
//! signature against the test key), and the Compute API answered by the simulated GCE behind a
//! real HTTP server, which insists on the issued bearer token. The gcp module runs through the
//! runtime as in production; only the addresses are loopback.
//!
//! The key under fixtures/ is a throwaway RSA key made for these tests; it grants nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use egress_core::config::{HttpGrant, ProvidersConfig};
use egress_core::{CreateRequest, ErrorClass, InstanceState, Placement};
use egress_runtime::capabilities::clock::{ClockBackend, VirtualClock};
use egress_runtime::capabilities::http::google_auth::GoogleAuth;
use egress_runtime::capabilities::http::real::RealHttp;
use egress_runtime::capabilities::http::sim::{SimGce, SimGceSpec, SimInsertFailure};
use egress_runtime::capabilities::http::{HttpBackend, HttpError, HttpRequest};
use egress_runtime::capabilities::kube::sim::{SimKube, SimKubeSpec};
use egress_runtime::capabilities::libvirt::UnavailableLibvirt;
use egress_runtime::{Backends, LoadOptions, PlanRecorder, Providers, Runtime, RuntimeOptions};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::net::TcpListener;

const KEY_PEM: &str = include_str!("fixtures/gcp-test-key.pem");
const KEY_PUB_B64: &str = include_str!("fixtures/gcp-test-key.pub.b64");
const SA_EMAIL: &str = "egress-test@acme-proxies.iam.gserviceaccount.com";
const SECRET: &str = "#cloud-config\nchpasswd: {list: 'root:SENTINEL-SECRET'}";

/// What the double saw and how it answers tokens.
#[derive(Default)]
struct Seen {
    token_requests: AtomicU64,
    grants: Mutex<Vec<String>>,
    issued: Mutex<Vec<String>>,
    compute: Mutex<Vec<String>>,
    authorizations: Mutex<Vec<Option<String>>>,
}

struct Double {
    addr: String,
    seen: Arc<Seen>,
    _task: tokio::task::JoinHandle<()>,
}

struct DoubleConfig {
    sim: SimGce,
    expires_in: u64,
}

async fn start(cfg: DoubleConfig) -> Double {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    let seen = Arc::new(Seen::default());
    let shared = Arc::new((cfg, seen.clone(), addr.clone()));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move {
                        Ok::<_, Infallible>(handle(&shared.0, &shared.1, &shared.2, req).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Double {
        addr,
        seen,
        _task: task,
    }
}

/// A double over an empty project, issuing hour-long tokens.
async fn plain_double() -> Double {
    start(DoubleConfig {
        sim: SimGce::new(SimGceSpec::default(), clock()),
        expires_in: 3600,
    })
    .await
}

fn json_response(status: u16, v: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json; charset=UTF-8")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

fn form(body: &[u8]) -> std::collections::BTreeMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

/// Checks a JWT-bearer assertion as Google's token endpoint does: RS256 over header.claims
/// with the service account's key, issued to the token endpoint, for the compute scope.
fn verify_assertion(assertion: &str, token_uri: &str) -> Result<(), String> {
    let parts: Vec<&str> = assertion.split('.').collect();
    if parts.len() != 3 {
        return Err("not three parts".into());
    }
    let dec = |s: &str| {
        URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .map_err(|e| e.to_string())
    };
    let header: Value = serde_json::from_slice(&dec(parts[0])?).map_err(|e| e.to_string())?;
    let claims: Value = serde_json::from_slice(&dec(parts[1])?).map_err(|e| e.to_string())?;
    if header["alg"] != "RS256" {
        return Err(format!("alg {}", header["alg"]));
    }
    if claims["iss"] != SA_EMAIL || claims["aud"] != token_uri {
        return Err(format!("claims {claims}"));
    }
    if !claims["scope"]
        .as_str()
        .unwrap_or("")
        .contains("https://www.googleapis.com/auth/compute")
    {
        return Err("scope".into());
    }
    let (iat, exp) = (
        claims["iat"].as_i64().unwrap_or(0),
        claims["exp"].as_i64().unwrap_or(0),
    );
    if exp <= iat || exp - iat > 3600 {
        return Err("lifetime".into());
    }
    let public = base64::engine::general_purpose::STANDARD
        .decode(KEY_PUB_B64.trim())
        .unwrap();
    let key = ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        public,
    );
    let signed = format!("{}.{}", parts[0], parts[1]);
    key.verify(signed.as_bytes(), &dec(parts[2])?)
        .map_err(|_| "signature does not verify".to_string())
}

async fn handle(
    cfg: &DoubleConfig,
    seen: &Seen,
    addr: &str,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path_q = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let token_uri = format!("http://{addr}/token");
    match (method.as_str(), path_q.split('?').next().unwrap_or("")) {
        ("POST", "/token") => {
            let n = seen.token_requests.fetch_add(1, Ordering::SeqCst) + 1;
            let f = form(&body);
            let ok = match f.get("grant_type").map(String::as_str) {
                Some("urn:ietf:params:oauth:grant-type:jwt-bearer") => {
                    verify_assertion(f.get("assertion").map_or("", String::as_str), &token_uri)
                }
                Some("refresh_token") => {
                    if f.get("refresh_token").map(String::as_str) == Some("test-refresh-token")
                        && f.get("client_id").map(String::as_str) == Some("test-client")
                    {
                        Ok(())
                    } else {
                        Err("bad refresh grant".into())
                    }
                }
                other => Err(format!("grant_type {other:?}")),
            };
            seen.grants
                .lock()
                .unwrap()
                .push(f.get("grant_type").cloned().unwrap_or_default());
            if let Err(e) = ok {
                return json_response(
                    400,
                    &json!({"error": "invalid_grant", "error_description": e}),
                );
            }
            let token = format!("ya29.test-token-{n}");
            seen.issued.lock().unwrap().push(token.clone());
            json_response(
                200,
                &json!({"access_token": token, "expires_in": cfg.expires_in, "token_type": "Bearer"}),
            )
        }
        ("GET", "/redirect-out") => Response::builder()
            .status(302)
            // Another loopback address: not in the grant.
            .header(
                "location",
                format!(
                    "http://127.0.0.2:{}/compute/v1/projects/acme-proxies/zones/x/instances",
                    addr.rsplit(':').next().unwrap()
                ),
            )
            .body(Full::new(Bytes::new()))
            .unwrap(),
        ("GET", "/redirect-in") => Response::builder()
            .status(307)
            .header("location", "/big?n=10")
            .body(Full::new(Bytes::new()))
            .unwrap(),
        ("GET", "/big") => json_response(200, &json!({"pad": "x".repeat(4096)})),
        ("GET", "/slow") => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            json_response(200, &json!({}))
        }
        (_, p) if p.starts_with("/compute/v1/") => {
            seen.compute.lock().unwrap().push(format!(
                "{method} {}",
                p.trim_start_matches("/compute/v1/projects/acme-proxies/")
            ));
            seen.authorizations.lock().unwrap().push(auth.clone());
            let issued = seen.issued.lock().unwrap().clone();
            let authorized = auth
                .as_deref()
                .and_then(|a| a.strip_prefix("Bearer "))
                .is_some_and(|t| issued.iter().any(|i| i == t));
            if !authorized {
                return json_response(
                    401,
                    &json!({"error": {"code": 401,
                    "message": "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
                    "errors": [{"message": "Invalid Credentials", "domain": "global", "reason": "authError", "location": "Authorization", "locationType": "header"}],
                    "status": "UNAUTHENTICATED"}}),
                );
            }
            let resp = cfg
                .sim
                .send(
                    HttpRequest {
                        method,
                        url: format!("https://compute.googleapis.com{path_q}"),
                        headers: vec![],
                        body: (!body.is_empty()).then(|| body.to_vec()),
                        credential: None,
                    },
                    &HttpGrant::default(),
                )
                .await
                .unwrap();
            json_response(resp.status, &serde_json::from_slice(&resp.body).unwrap())
        }
        _ => json_response(
            404,
            &json!({"error": {"code": 404, "message": "no route", "errors": [{"reason": "notFound", "domain": "global", "message": "no route"}], "status": "NOT_FOUND"}}),
        ),
    }
}

fn key_file(dir: &Path, addr: &str) -> PathBuf {
    let path = dir.join("sa.json");
    let key = json!({
        "type": "service_account",
        "project_id": "acme-proxies",
        "private_key_id": "0123456789abcdef",
        "private_key": KEY_PEM,
        "client_email": SA_EMAIL,
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": format!("http://{addr}/token"),
    });
    std::fs::write(&path, key.to_string()).unwrap();
    path
}

fn grant(addr: &str) -> HttpGrant {
    HttpGrant {
        hosts: vec![addr.to_string()],
        credentials: vec!["google".into()],
        google_credentials_file: None,
    }
}

/// What `gcloud auth application-default login` writes, its token endpoint on the double.
fn authorized_user_file(path: &Path, addr: &str) {
    std::fs::write(
        path,
        json!({"type": "authorized_user", "client_id": "test-client", "client_secret": "s3cret",
            "refresh_token": "test-refresh-token", "token_uri": format!("http://{addr}/token")})
        .to_string(),
    )
    .unwrap();
}

fn get(addr: &str, path: &str) -> HttpRequest {
    HttpRequest {
        method: "GET".into(),
        url: format!("http://{addr}{path}"),
        headers: vec![],
        body: None,
        credential: Some("google".into()),
    }
}

fn clock() -> Arc<VirtualClock> {
    Arc::new(VirtualClock::new(1_767_225_600_000, 1))
}

fn runtime() -> Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        Runtime::new(RuntimeOptions {
            cache_dir: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache"),
            ),
            ..Default::default()
        })
        .unwrap()
    })
    .clone()
}

fn request(uid: &str, zone: &str) -> CreateRequest {
    CreateRequest {
        name: egress_core::name::instance_name(uid),
        namespace: "crawlers".into(),
        uid: uid.into(),
        port: 3128,
        placement: Placement {
            zone: Some(zone.into()),
            region: None,
            machine_type: Some("e2-small".into()),
            image: Some(
                "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64".into(),
            ),
        },
        cloud_init: Some(SECRET.into()),
        installation: "test".into(),
        owner: None,
        htpasswd: None,
    }
}

#[tokio::test]
async fn the_gcp_module_runs_through_the_real_http_backend() {
    let vclock = clock();
    let dyn_clock: Arc<dyn ClockBackend> = vclock.clone();
    let sim = SimGce::new(
        SimGceSpec {
            unreachable_zones: vec!["asia-east1-a".into()],
            insert_failures: vec![SimInsertFailure {
                zone: "europe-west1-c".into(),
                code: "ZONE_RESOURCE_POOL_EXHAUSTED".into(),
                message: String::new(),
                until: None,
            }],
            ..Default::default()
        },
        dyn_clock.clone(),
    );
    let double = start(DoubleConfig {
        sim,
        expires_in: 3600,
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &double.addr);
    let backends = Backends {
        clock: dyn_clock.clone(),
        kube: Arc::new(SimKube::new(SimKubeSpec::default(), dyn_clock.clone())),
        http: Arc::new(RealHttp::new(GoogleAuth::from_file(&key))),
        libvirt: Arc::new(UnavailableLibvirt),
    };
    let cfg = ProvidersConfig::from_yaml(&format!(
        "installation: test\nproviders:\n- name: gce\n  type: gcp\n  gcp:\n    project: acme-proxies\n    endpoint: http://{}\n",
        double.addr
    ))
    .unwrap();
    let recorder = Arc::new(PlanRecorder::new());
    let providers = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &|t| egress_builtins::module_for_type(t),
            backends,
            recorder: Some(recorder.clone()),
        },
    )
    .await
    .unwrap();
    let p = providers.get("gce").unwrap();

    // Create: the insert goes out with the bearer token the host obtained.
    let uid = "3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23";
    let inst = p
        .create("crawlers/p1", &request(uid, "europe-west1-b"))
        .await
        .unwrap();
    assert_eq!(
        inst.provider_id,
        "zones/europe-west1-b/instances/proxy-3f2b9c1e7a44"
    );
    assert_eq!(inst.state, InstanceState::Provisioning);
    assert_eq!(double.seen.token_requests.load(Ordering::SeqCst), 1);
    assert_eq!(
        double.seen.grants.lock().unwrap()[0],
        "urn:ietf:params:oauth:grant-type:jwt-bearer"
    );
    // The plan has the insert, with cloud-init redacted.
    let steps = recorder.snapshot();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].args["metadata"]["items"][0]["value"], "<redacted>");
    assert!(!serde_json::to_string(&steps).unwrap().contains("SENTINEL"));

    // Get: provisioning, then running with the NAT IP after the simulated boot.
    assert_eq!(
        p.get("crawlers/p1", &inst.provider_id).await.unwrap().state,
        InstanceState::Provisioning
    );
    vclock.advance(Duration::from_secs(20));
    let got = p.get("crawlers/p1", &inst.provider_id).await.unwrap();
    assert_eq!(got.state, InstanceState::Running);
    assert!(got.ip.as_deref().unwrap().starts_with("34."));
    assert_eq!(got.uid, uid);

    // An insert accepted and failed later reaches Get, classified, with the API's reason.
    let uid2 = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
    let inst2 = p
        .create("crawlers/p2", &request(uid2, "europe-west1-c"))
        .await
        .unwrap();
    vclock.advance(Duration::from_secs(5));
    let err = p.get("crawlers/p2", &inst2.provider_id).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::QuotaExceeded);
    assert_eq!(err.reason, "ZONE_RESOURCE_POOL_EXHAUSTED");
    assert!(
        err.message.contains("does not have enough resources"),
        "{}",
        err.message
    );

    // List: the reachable zones' instances; the unreachable zone is left out, not fatal.
    let listed = p.list_by_tag("gc", "test").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].uid, uid);
    let checked = p.check().await;
    assert_eq!(checked[0].reason, "Healthy", "{:?}", checked[0]);

    // Delete: submitted once; a second call while it runs submits nothing; then gone.
    p.delete("crawlers/p1", &inst.provider_id).await.unwrap();
    p.delete("crawlers/p1", &inst.provider_id).await.unwrap();
    let deletes = double
        .seen
        .compute
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.starts_with("DELETE"))
        .count();
    assert_eq!(deletes, 1);
    vclock.advance(Duration::from_secs(10));
    let gone = p.get("crawlers/p1", &inst.provider_id).await.unwrap_err();
    assert_eq!(gone.class, ErrorClass::NotFound);
    p.delete("crawlers/p1", &inst.provider_id).await.unwrap();

    // One token served every call: cached, never re-requested while fresh.
    assert_eq!(double.seen.token_requests.load(Ordering::SeqCst), 1);
    assert!(
        double
            .seen
            .authorizations
            .lock()
            .unwrap()
            .iter()
            .all(|a| a.as_deref() == Some("Bearer ya29.test-token-1"))
    );
}

#[tokio::test]
async fn a_token_is_cached_until_near_expiry_then_refreshed() {
    // 21 s of life with gcp_auth's 20 s margin: fresh for one second.
    let double = start(DoubleConfig {
        sim: SimGce::new(SimGceSpec::default(), clock()),
        expires_in: 21,
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let http = RealHttp::new(GoogleAuth::from_file(key_file(dir.path(), &double.addr)));
    let g = grant(&double.addr);
    let list = "/compute/v1/projects/acme-proxies/aggregated/instances?maxResults=1";
    assert_eq!(
        http.send(get(&double.addr, list), &g).await.unwrap().status,
        200
    );
    assert_eq!(
        http.send(get(&double.addr, list), &g).await.unwrap().status,
        200
    );
    assert_eq!(double.seen.token_requests.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        http.send(get(&double.addr, list), &g).await.unwrap().status,
        200
    );
    assert_eq!(double.seen.token_requests.load(Ordering::SeqCst), 2);
    let auths = double.seen.authorizations.lock().unwrap().clone();
    assert_eq!(auths[2].as_deref(), Some("Bearer ya29.test-token-2"));
}

#[tokio::test]
async fn an_authorized_user_file_uses_the_refresh_grant() {
    let double = plain_double().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adc.json");
    authorized_user_file(&path, &double.addr);
    let http = RealHttp::new(GoogleAuth::from_file(&path));
    let r = http
        .send(
            get(
                &double.addr,
                "/compute/v1/projects/acme-proxies/aggregated/instances",
            ),
            &grant(&double.addr),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        double.seen.grants.lock().unwrap().as_slice(),
        ["refresh_token"]
    );
}

#[tokio::test]
async fn credential_failures_are_credential_errors_without_secrets() {
    let double = plain_double().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adc.json");
    std::fs::write(
        &path,
        json!({"type": "authorized_user", "client_id": "test-client", "client_secret": "s3cret-SENTINEL",
            "refresh_token": "wrong-SENTINEL", "token_uri": format!("http://{}/token", double.addr)})
        .to_string(),
    )
    .unwrap();
    let http = RealHttp::new(GoogleAuth::from_file(&path));
    let err = http
        .send(
            get(
                &double.addr,
                "/compute/v1/projects/acme-proxies/aggregated/instances",
            ),
            &grant(&double.addr),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, HttpError::Credential(m) if !m.contains("SENTINEL")),
        "{err:?}"
    );
    let missing = RealHttp::new(GoogleAuth::from_file(dir.path().join("nope.json")));
    assert!(matches!(
        missing
            .send(get(&double.addr, "/x"), &grant(&double.addr))
            .await,
        Err(HttpError::Credential(_))
    ));
    assert!(double.seen.compute.lock().unwrap().is_empty());
}

/// A plain server on 127.0.0.2 at the double's port, where `/redirect-out` points: it records
/// each request's head and answers `{}`.
async fn beside(double: &Double) -> (String, Arc<Mutex<Vec<String>>>) {
    let port = double.addr.rsplit(':').next().unwrap();
    let listener = TcpListener::bind(format!("127.0.0.2:{port}"))
        .await
        .unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).to_lowercase());
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                .await;
        }
    });
    (format!("127.0.0.2:{port}"), heads)
}

#[tokio::test]
async fn redirects_are_checked_and_bodies_and_time_bounded() {
    let double = plain_double().await;
    let (other, heads) = beside(&double).await;
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), &double.addr);
    let g = grant(&double.addr);
    let http = RealHttp::new(GoogleAuth::from_file(&key)).with_limits(Duration::from_secs(2), 1024);
    // A redirect to a host outside the grant is refused before anything is sent there.
    let err = http
        .send(get(&double.addr, "/redirect-out"), &g)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, HttpError::Denied(m) if m.contains("127.0.0.2")),
        "{err:?}"
    );
    assert!(
        heads.lock().unwrap().is_empty(),
        "{:?}",
        heads.lock().unwrap()
    );
    // Granted, the hop is followed, and the credential stays with the host it was asked for.
    let mut both = g.clone();
    both.hosts.push(other.clone());
    let r = http
        .send(get(&double.addr, "/redirect-out"), &both)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(
        r.final_url
            .starts_with(&format!("http://{other}/compute/v1/")),
        "{}",
        r.final_url
    );
    let seen = heads.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(!seen[0].contains("authorization"), "{}", seen[0]);
    assert_eq!(double.seen.token_requests.load(Ordering::SeqCst), 1);
    // A redirect within the grant is followed; the final URL is reported; the cap applies.
    let err = http
        .send(get(&double.addr, "/redirect-in"), &g)
        .await
        .unwrap_err();
    assert_eq!(err, HttpError::TooLarge(1024));
    let roomy = RealHttp::new(GoogleAuth::from_file(&key));
    let r = roomy
        .send(get(&double.addr, "/redirect-in"), &g)
        .await
        .unwrap();
    assert_eq!(r.final_url, format!("http://{}/big?n=10", double.addr));
    // The per-call bound.
    assert_eq!(
        http.send(get(&double.addr, "/slow"), &g).await.unwrap_err(),
        HttpError::Timeout
    );
    // The backend checks the grant itself too.
    let err = http
        .send(get(&double.addr, "/big"), &HttpGrant::default())
        .await
        .unwrap_err();
    assert!(matches!(err, HttpError::Denied(_)));
}

const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

#[tokio::test]
async fn each_entry_uses_its_own_credentials_file_and_a_rotated_file_is_read_again() {
    let double = plain_double().await;
    let dir = tempfile::tempdir().unwrap();
    // The process's credential: a service-account key. One entry names another file,
    // relative to the config, which the host finds beside it.
    let key = key_file(dir.path(), &double.addr);
    let user = dir.path().join("user.json");
    authorized_user_file(&user, &double.addr);
    let backends = Backends {
        clock: clock(),
        kube: Arc::new(SimKube::new(SimKubeSpec::default(), clock())),
        http: Arc::new(RealHttp::new(GoogleAuth::from_file(&key))),
        libvirt: Arc::new(UnavailableLibvirt),
    };
    let cfg = ProvidersConfig::from_yaml(&format!(
        "installation: test\nproviders:\n\
         - {{name: by-adc, type: gcp, gcp: {{project: acme-proxies, endpoint: 'http://{a}'}}}}\n\
         - {{name: by-file, type: gcp, gcp: {{project: acme-proxies, endpoint: 'http://{a}', credentialsFile: user.json}}}}\n",
        a = double.addr
    ))
    .unwrap();
    let providers = Providers::load(
        &runtime(),
        &cfg,
        LoadOptions {
            base_dir: dir.path(),
            builtin: &|t| egress_builtins::module_for_type(t),
            backends,
            recorder: None,
        },
    )
    .await
    .unwrap();
    let list = |name: &'static str| {
        let p = providers.get(name).unwrap().clone();
        async move { p.list_by_tag("gc", "test").await.unwrap() }
    };

    list("by-adc").await;
    list("by-file").await;
    list("by-file").await;
    assert_eq!(
        double.seen.grants.lock().unwrap().as_slice(),
        [JWT_BEARER, "refresh_token"],
        "one token per credential, each from its own file, then cached"
    );
    let auths = double.seen.authorizations.lock().unwrap().clone();
    assert_eq!(auths[0].as_deref(), Some("Bearer ya29.test-token-1"));
    assert_eq!(auths[1].as_deref(), Some("Bearer ya29.test-token-2"));
    assert_eq!(auths[2].as_deref(), Some("Bearer ya29.test-token-2"));

    // The entry's file is rotated in place (a service-account key now): the next call reads
    // it again, without a restart, and the other entry keeps its token.
    std::fs::copy(&key, &user).unwrap();
    list("by-file").await;
    list("by-adc").await;
    assert_eq!(
        double.seen.grants.lock().unwrap().as_slice(),
        [JWT_BEARER, "refresh_token", JWT_BEARER]
    );
    let auths = double.seen.authorizations.lock().unwrap().clone();
    assert_eq!(auths[3].as_deref(), Some("Bearer ya29.test-token-3"));
    assert_eq!(auths[4].as_deref(), Some("Bearer ya29.test-token-1"));
}
