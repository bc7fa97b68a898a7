//! The ProxyPool admission webhook over real TLS on loopback: AdmissionReviews as the API
//! server sends them (create and update) are allowed for a valid pool and denied naming each
//! field at fault, against the providers config loaded at the time; a malformed review is
//! refused with 400; a renewed certificate serves without a restart; a silent client is cut
//! off.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_operator::webhook::{self, PoolEnvironment};
use egress_serve::Limits;
use egress_serve::tls::Certificates;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A serving certificate for 127.0.0.1 signed by `ca`, as PEM: (certificate, key, its DER).
fn leaf(ca: &CertifiedIssuer<'static, KeyPair>) -> (String, String, Vec<u8>) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, ca)
        .unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

/// The providers config as loaded: the deploy's three entries, a check starting within 5m;
/// the operator's default bound on replicas.
fn loaded() -> PoolEnvironment {
    PoolEnvironment {
        providers: vec!["cluster".into(), "gce".into(), "lab".into()],
        startup_timeout: Some(Duration::from_secs(300)),
        ..PoolEnvironment::default()
    }
}

struct Server {
    addr: SocketAddr,
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: tempfile::TempDir,
    env: Arc<Mutex<PoolEnvironment>>,
}

impl Server {
    async fn start(limits: Limits) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca("webhook test CA");
        let (cert, key, _) = leaf(&ca);
        std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        let certificates = Arc::new(
            Certificates::load(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).unwrap(),
        );
        let tls = certificates.server_config().unwrap();
        tokio::spawn(certificates.watch(Duration::from_millis(50)));
        let env = Arc::new(Mutex::new(loaded()));
        let source = env.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(webhook::serve(
            listener,
            tls,
            Arc::new(move || source.lock().unwrap().clone()),
            limits,
        ));
        Self { addr, ca, dir, env }
    }

    /// One request over TLS, trusting the test CA only: the status, the body and the
    /// certificate the server presented.
    async fn request(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>, Vec<u8>) {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .unwrap();
        let presented = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: egress-proxies.egress-proxies.svc\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(body).await.unwrap();
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw).await;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let status = std::str::from_utf8(&raw[9..12]).unwrap().parse().unwrap();
        (status, raw[split + 4..].to_vec(), presented)
    }

    /// Posts `review` to the webhook's path: the status and the answer's `response`.
    async fn review(&self, review: &Value) -> Value {
        let (code, body, _) = self
            .request("POST", webhook::PATH, review.to_string().as_bytes())
            .await;
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{answer}");
        assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
        assert_eq!(
            answer["response"]["uid"], review["request"]["uid"],
            "{answer}"
        );
        answer["response"].clone()
    }
}

/// The deploy's sample pool, over the three providers, as stored (uid, generation, managed
/// fields).
fn pool() -> Value {
    json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {
            "name": "crawl", "namespace": "crawlers",
            "uid": "3f1c2a9e-7d41-4f0b-9a53-2b8e6c1d0f47", "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update",
                "apiVersion": "crawl.example.com/v1alpha1", "time": "2026-01-01T00:00:00Z",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}, "f:replicas": {}}}}]
        },
        "spec": {
            "replicas": 10,
            "template": {"port": 3128},
            "placements": [
                {"provider": "gce", "weight": 2, "zones": ["europe-west1-b"]},
                {"provider": "lab", "weight": 1},
                {"provider": "cluster", "weight": 1, "maxReplicas": 4}
            ],
            "rotation": {"maxAge": "24h", "jitter": "2h"},
            "strategy": {"maxSurge": 1, "maxUnavailable": 0}
        }
    })
}

/// An AdmissionReview as the API server sends one for `operation` on a ProxyPool.
fn admission(operation: &str, object: Value, old: Option<Value>) -> Value {
    let gvk = json!({"group": "crawl.example.com", "version": "v1alpha1", "kind": "ProxyPool"});
    let gvr =
        json!({"group": "crawl.example.com", "version": "v1alpha1", "resource": "proxypools"});
    let options_kind = if operation == "CREATE" {
        "CreateOptions"
    } else {
        "UpdateOptions"
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("705ab4f5-6393-11e8-b7cc-42010a80000{}", operation.len()),
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": "crawl", "namespace": "crawlers",
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options_kind, "fieldManager": "kubectl-client-side-apply"}
        }
    })
}

fn edited(f: impl FnOnce(&mut Value)) -> Value {
    let mut p = pool();
    f(&mut p);
    p
}

fn causes(response: &Value) -> Vec<String> {
    response["status"]["details"]["causes"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| c["field"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_valid_pool_is_allowed_on_create_and_update() {
    let s = Server::start(Limits::default()).await;
    let r = s.review(&admission("CREATE", pool(), None)).await;
    assert_eq!(r["allowed"], true, "{r}");
    let grown = edited(|p| p["spec"]["replicas"] = json!(20));
    let r = s.review(&admission("UPDATE", grown, Some(pool()))).await;
    assert_eq!(r["allowed"], true, "{r}");
    // A delete is not the webhook's to judge.
    let mut delete = admission("DELETE", Value::Null, Some(pool()));
    delete["request"]["options"]["kind"] = json!("DeleteOptions");
    assert_eq!(s.review(&delete).await["allowed"], true);
}

/// Each check that needs the providers config refuses the pool naming its field, on create
/// and on an update that brings the problem.
#[tokio::test]
async fn a_pool_the_loaded_config_cannot_run_is_denied_naming_each_field() {
    let s = Server::start(Limits::default()).await;
    for (what, bad, field, says) in [
        (
            "a provider the config does not have",
            edited(|p| p["spec"]["placements"][1]["provider"] = json!("clustr")),
            "spec.placements[1].provider",
            "\"clustr\" is not in the providers config",
        ),
        (
            "jitter at maxAge",
            edited(|p| p["spec"]["rotation"] = json!({"maxAge": "1h", "jitter": "3h"})),
            "spec.rotation.jitter",
            "must be shorter than maxAge",
        ),
        (
            "a maxAge shorter than twice the startupTimeout",
            edited(|p| p["spec"]["rotation"] = json!({"maxAge": "12m", "jitter": "3m"})),
            "spec.rotation.maxAge",
            "twice the egress check's startupTimeout of 300s",
        ),
        (
            "more replicas than the operator allows",
            edited(|p| p["spec"]["replicas"] = json!(1001)),
            "spec.replicas",
            "1001 is more than the 1000 this installation allows",
        ),
        (
            "a billion replicas",
            edited(|p| p["spec"]["replicas"] = json!(1_000_000_000)),
            "spec.replicas",
            "1000000000 is more than 100000",
        ),
    ] {
        for review in [
            admission("CREATE", bad.clone(), None),
            admission("UPDATE", bad.clone(), Some(pool())),
        ] {
            let r = s.review(&review).await;
            assert_eq!(r["allowed"], false, "{what}: {r}");
            let message = r["status"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("{field}: ")) && message.contains(says),
                "{what}: {message}"
            );
            assert_eq!(r["status"]["code"], 422, "{r}");
            assert_eq!(r["status"]["reason"], "Invalid", "{r}");
            assert_eq!(causes(&r), vec![field.to_string()], "{what}: {r}");
        }
    }
    // Every problem of one pool, each a cause naming its field.
    let both = edited(|p| {
        p["spec"]["placements"][1]["provider"] = json!("clustr");
        p["spec"]["rotation"] = json!({"maxAge": "1h", "jitter": "3h"});
    });
    let r = s.review(&admission("CREATE", both, None)).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(
        causes(&r),
        vec!["spec.rotation.jitter", "spec.placements[1].provider"],
        "{r}"
    );
    // An object that does not read as a ProxyPool is denied naming the field.
    let unreadable = edited(|p| p["spec"]["replicas"] = json!("ten"));
    let r = s.review(&admission("CREATE", unreadable, None)).await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.replicas: "),
        "{r}"
    );
}

/// The webhook judges by the providers config loaded when the review arrives: a provider
/// added by a reload admits the pool that named it; an update that leaves a stored pool's
/// spec as it was is allowed with a warning, whatever the config says of it now.
#[tokio::test]
async fn the_config_loaded_now_decides_and_an_unchanged_spec_is_not_refused() {
    let s = Server::start(Limits::default()).await;
    let named = edited(|p| p["spec"]["placements"][1]["provider"] = json!("rack"));
    let r = s.review(&admission("CREATE", named.clone(), None)).await;
    assert_eq!(r["allowed"], false, "{r}");
    s.env.lock().unwrap().providers.push("rack".into());
    let r = s.review(&admission("CREATE", named.clone(), None)).await;
    assert_eq!(r["allowed"], true, "{r}");

    // The entry goes from the config: a label on the stored pool is still admitted, warned.
    s.env.lock().unwrap().providers.retain(|p| p != "rack");
    let labelled = {
        let mut p = named.clone();
        p["metadata"]["labels"] = json!({"team": "crawl"});
        p
    };
    let r = s
        .review(&admission("UPDATE", labelled.clone(), Some(named.clone())))
        .await;
    assert_eq!(r["allowed"], true, "{r}");
    let warnings = r["warnings"].as_array().unwrap();
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("spec.placements[1].provider: "),
        "{r}"
    );
    // A spec edit of it is judged whole.
    let scaled = {
        let mut p = labelled;
        p["spec"]["replicas"] = json!(12);
        p
    };
    let r = s.review(&admission("UPDATE", scaled, Some(named))).await;
    assert_eq!(r["allowed"], false, "{r}");
}

/// What is not an AdmissionReview v1 is refused with 400 naming what is wrong, and the server
/// answers the next review as before; other paths and methods are refused too, and a body past
/// the bound is not read.
#[tokio::test]
async fn a_malformed_review_is_refused_cleanly() {
    let s = Server::start(Limits::default()).await;
    let good = admission("CREATE", pool(), None);
    let mut beta = good.clone();
    beta["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_request = good.clone();
    no_request.as_object_mut().unwrap().remove("request");
    let mut no_uid = good.clone();
    no_uid["request"]["uid"] = json!("");
    let mut bad_operation = good.clone();
    bad_operation["request"]["operation"] = json!("PATCH");
    for (what, body, names) in [
        ("not JSON", b"<AdmissionReview/>".to_vec(), "."),
        ("cut short", b"{\"apiVersion\": ".to_vec(), "apiVersion"),
        ("v1beta1", beta.to_string().into_bytes(), "apiVersion"),
        ("no request", no_request.to_string().into_bytes(), "request"),
        ("no uid", no_uid.to_string().into_bytes(), "request.uid"),
        (
            "an unknown operation",
            bad_operation.to_string().into_bytes(),
            "request.operation",
        ),
    ] {
        let (code, answer, _) = s.request("POST", webhook::PATH, &body).await;
        let answer = String::from_utf8(answer).unwrap();
        assert_eq!(code, 400, "{what}: {answer}");
        assert!(
            answer.starts_with(&format!("not an AdmissionReview v1: {names}: ")),
            "{what}: {answer}"
        );
    }
    let (code, _, _) = s.request("GET", webhook::PATH, b"").await;
    assert_eq!(code, 405);
    let (code, _, _) = s
        .request("POST", "/mutate", good.to_string().as_bytes())
        .await;
    assert_eq!(code, 404);
    let (code, _, _) = s
        .request("POST", webhook::PATH, &vec![b' '; webhook::MAX_BODY + 1])
        .await;
    assert_eq!(code, 413);
    assert_eq!(s.review(&good).await["allowed"], true);
}

/// cert-manager renews the certificate into the mounted files: the next handshake presents
/// the new one, with no restart; a pair whose key does not match (the files caught between
/// two updates) is refused and the last good pair serves on.
#[tokio::test]
async fn a_renewed_certificate_serves_without_a_restart() {
    let s = Server::start(Limits::default()).await;
    let (_, _, first) = s.request("GET", webhook::PATH, b"").await;
    let (cert, key, second) = leaf(&s.ca);
    assert_ne!(first, second);
    let (_, other_key, _) = leaf(&s.ca);
    let crt = s.dir.path().join("tls.crt");
    let key_path = s.dir.path().join("tls.key");
    // The certificate first, its key not yet: the old pair serves on.
    std::fs::write(&crt, &cert).unwrap();
    std::fs::write(&key_path, &other_key).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, _, presented) = s.request("GET", webhook::PATH, b"").await;
    assert_eq!(presented, first, "a mismatched pair was served");
    std::fs::write(&key_path, &key).unwrap();
    let presented = presented_within(&s, &second, Duration::from_secs(5)).await;
    assert_eq!(presented, second, "the renewed certificate was not served");
    assert_eq!(
        s.review(&admission("CREATE", pool(), None)).await["allowed"],
        true
    );
}

async fn presented_within(s: &Server, want: &[u8], limit: Duration) -> Vec<u8> {
    let start = std::time::Instant::now();
    loop {
        let (_, _, presented) = s.request("GET", webhook::PATH, b"").await;
        if presented == want || start.elapsed() > limit {
            return presented;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Certificates that cannot serve are refused at load, naming the file and never its content.
#[test]
fn a_bad_certificate_or_key_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("webhook test CA");
    let (cert, key, _) = leaf(&ca);
    let (_, other_key, _) = leaf(&ca);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let crt = write("tls.crt", &cert);
    let good_key = write("tls.key", &key);
    let mismatched = write("other.key", &other_key);
    let empty = write("empty.crt", "");
    let missing = dir.path().join("missing.key");
    assert!(Certificates::load(&crt, &good_key).is_ok());
    for (c, k, names, says) in [
        (
            &crt,
            &mismatched,
            &mismatched,
            "does not serve with the certificate",
        ),
        (&empty, &good_key, &empty, "holds no certificate"),
        (&crt, &missing, &missing, "No such file"),
    ] {
        let e = Certificates::load(c, k).unwrap_err().to_string();
        assert!(e.contains(&names.display().to_string()), "{e}");
        assert!(e.contains(says), "{e}");
        assert!(
            !e.contains("PRIVATE KEY") && !e.contains(&other_key[40..80]),
            "{e}"
        );
    }
}

/// A client that opens a connection and says nothing is cut off at the head timeout, and the
/// server goes on answering others.
#[tokio::test]
async fn a_silent_client_is_cut_off() {
    let s = Server::start(Limits {
        header_read_timeout: Duration::from_millis(200),
        max_connections: 4,
        ..Limits::default()
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("the silent connection was not closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert_eq!(
        s.review(&admission("CREATE", pool(), None)).await["allowed"],
        true
    );
}

/// The API double on a runtime of its own thread, as a cluster's API server is apart from the
/// operator's process; it serves until the test process ends.
fn api_server_apart() -> kube_double::Double {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let d = kube_double::Double::start_with(kube_double::Config {
                namespaces: vec!["egress".into()],
                ..kube_double::Config::default()
            })
            .await
            .unwrap();
            tx.send(d).unwrap();
            std::future::pending::<()>().await
        });
    });
    rx.recv().unwrap()
}

/// A review of the largest size the webhook reads, of what costs most to read per byte: the
/// sample pool with as many short annotations as fill the body up to [`webhook::MAX_BODY`].
fn largest_review() -> Vec<u8> {
    let base = admission("CREATE", pool(), None).to_string().len();
    let mut annotations = serde_json::Map::new();
    // `"a12345":"",` is 12 bytes.
    let mut room = webhook::MAX_BODY - base - 64;
    while room > 16 {
        let key = format!("a{}", annotations.len());
        room -= key.len() + 6;
        annotations.insert(key, json!(""));
    }
    let review = admission(
        "CREATE",
        edited(|p| p["metadata"]["annotations"] = Value::Object(annotations)),
        None,
    )
    .to_string()
    .into_bytes();
    assert!(
        review.len() <= webhook::MAX_BODY && review.len() > webhook::MAX_BODY * 9 / 10,
        "{} bytes",
        review.len()
    );
    review
}

/// `clients` clients posting `body` to the webhook at `addr` from a runtime of their own,
/// each again as soon as it is answered, until `until`: how many answers of each status.
fn flood(
    addr: SocketAddr,
    ca: Vec<u8>,
    body: Vec<u8>,
    clients: usize,
    until: std::time::Instant,
) -> std::thread::JoinHandle<std::collections::BTreeMap<u16, usize>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.into()).unwrap();
            let config = Arc::new(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
            );
            let body = Arc::new(body);
            let tasks: Vec<_> = (0..clients)
                .map(|_| {
                    let (config, body) = (config.clone(), body.clone());
                    tokio::spawn(async move {
                        let mut seen = std::collections::BTreeMap::new();
                        while std::time::Instant::now() < until {
                            let status = post_once(addr, &config, &body).await;
                            *seen.entry(status).or_insert(0usize) += 1;
                        }
                        seen
                    })
                })
                .collect();
            let mut all = std::collections::BTreeMap::new();
            for t in tasks {
                for (status, n) in t.await.unwrap() {
                    *all.entry(status).or_insert(0) += n;
                }
            }
            all
        })
    })
}

/// One review posted over a connection of its own: the answer's status, 0 when there was none.
async fn post_once(addr: SocketAddr, config: &Arc<rustls::ClientConfig>, body: &[u8]) -> u16 {
    let go = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut tls = tokio_rustls::TlsConnector::from(config.clone())
            .connect(ServerName::try_from("127.0.0.1").ok()?, tcp)
            .await
            .ok()?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: egress-proxies.egress-proxies.svc\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            webhook::PATH,
            body.len()
        );
        tls.write_all(head.as_bytes()).await.ok()?;
        tls.write_all(body).await.ok()?;
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw).await;
        std::str::from_utf8(raw.get(9..12)?).ok()?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(30), go)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// 128 clients post reviews of the largest size, again and again, while the leader holds its
/// lease as the operator does (on a thread of its own) against an API server apart from this
/// process: the leader never misses its renew deadline, and the reviews are answered (a
/// judged review, or 503 when too many wait). A short lease (3 s: renewals every 0.4 s, a 2 s
/// deadline) makes a delay show; the deploy's is 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_reviews_never_delays_the_leaders_renewal() {
    let d = Arc::new(api_server_apart());
    let s = Server::start(Limits::default()).await;
    let api = d.clone();
    let mut election = egress_operator::leader::Election::start(
        move || Ok(api.client()),
        "egress",
        "leader",
        "replica-a",
        Duration::from_secs(3),
    )
    .unwrap();
    election.leading().await.unwrap();

    let until = std::time::Instant::now() + Duration::from_secs(8);
    let flooding = flood(s.addr, s.ca.der().to_vec(), largest_review(), 128, until);
    let stepped_down = tokio::time::timeout(Duration::from_secs(10), election.lost()).await;
    let answered = tokio::task::spawn_blocking(move || flooding.join().unwrap())
        .await
        .unwrap();
    assert!(
        stepped_down.is_err(),
        "the leader stepped down during the flood (answers: {answered:?})"
    );
    let judged = answered.get(&200).copied().unwrap_or(0);
    let busy = answered.get(&503).copied().unwrap_or(0);
    assert!(
        judged >= 128 && judged + busy == answered.values().sum::<usize>(),
        "every review judged or refused as busy: {answered:?}"
    );
    let renewals = d
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/leases/leader"))
        .count();
    assert!(renewals >= 20, "{renewals} renewals in 10 s");
    eprintln!("answers: {answered:?}; {renewals} renewals");
}
