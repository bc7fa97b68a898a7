//! The controller, the sweeper and the health monitor against a fake API server (tower-test,
//! answering by route and recording every request), with the real kubernetes provider module
//! running against the simulated cluster for its Pods.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_core::config::ProvidersConfig;
use egress_core::reconcile::{POLL_INTERVAL, RESYNC_INTERVAL};
use egress_operator::context::{Context, Loaded};
use egress_operator::controller::{FINALIZER, reconcile};
use egress_operator::crd::Proxy;
use egress_operator::metrics::Metrics;
use egress_runtime::capabilities::kube::KubeRef;
use egress_runtime::world::{SimWorld, World};
use egress_runtime::{LoadOptions, Providers, Runtime, RuntimeOptions};
use http::{Request, Response};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const UID: &str = "3f2b9c1e-7a44-4d0e-9a51-0c2e8f6b1d23";
const POD: &str = "proxy-3f2b9c1e7a44";
const SECRET_TEXT: &str = "#cloud-config\npassword: SENTINEL-in-a-secret";

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    body: Value,
}

/// A fake API server: answers by route, records every request.
#[derive(Clone, Default)]
struct FakeApi {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Proxies returned by a cluster-wide list.
    proxies: Arc<Mutex<Vec<Value>>>,
    /// ProviderHealth objects by name.
    health: Arc<Mutex<std::collections::BTreeMap<String, Value>>>,
}

impl FakeApi {
    fn client(&self) -> kube::Client {
        let me = self.clone();
        mock_client(move |method, path, body| {
            me.seen.lock().unwrap().push(Seen {
                method: method.to_string(),
                path: path.to_string(),
                body: body.clone(),
            });
            me.answer(method, path, body)
        })
    }

    fn answer(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let not_found = |what: &str| {
            (
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": format!("{what} not found")}),
            )
        };
        match (method, path) {
            ("PATCH", p) if p.starts_with("/apis/crawl.example.com/v1alpha1/namespaces/") => {
                (200, proxy_json(1, &[FINALIZER], None).tap_merge(&body))
            }
            ("POST", p) if p.ends_with("/events") => (201, body),
            ("GET", "/api/v1/namespaces/crawlers/secrets/ci") => (
                200,
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ci", "namespace": "crawlers"},
                       "data": {"user-data": b64(SECRET_TEXT)}}),
            ),
            ("GET", p) if p.starts_with("/api/v1/namespaces/crawlers/secrets/") => {
                not_found("secret")
            }
            ("GET", "/apis/crawl.example.com/v1alpha1/proxies") => (
                200,
                json!({"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyList", "metadata": {}, "items": *self.proxies.lock().unwrap()}),
            ),
            ("GET", p) if p.starts_with("/apis/crawl.example.com/v1alpha1/providerhealths/") => {
                let name = p.rsplit('/').next().unwrap_or("");
                match self.health.lock().unwrap().get(name) {
                    Some(v) => (200, v.clone()),
                    None => not_found("providerhealth"),
                }
            }
            ("POST", "/apis/crawl.example.com/v1alpha1/providerhealths") => {
                let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
                self.health.lock().unwrap().insert(name, body.clone());
                (201, body)
            }
            ("PATCH", p) if p.starts_with("/apis/crawl.example.com/v1alpha1/providerhealths/") => {
                let name = p
                    .trim_end_matches("/status")
                    .rsplit('/')
                    .next()
                    .unwrap_or("")
                    .to_string();
                let mut health = self.health.lock().unwrap();
                let obj = health.entry(name).or_insert(Value::Null);
                obj["status"] = body["status"].clone();
                (200, obj.clone())
            }
            _ => not_found(path),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }

    fn status_patches(&self) -> Vec<Value> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "PATCH" && s.path.ends_with("/status"))
            .map(|s| s.body["status"].clone())
            .collect()
    }

    fn event_reasons(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "POST" && s.path.ends_with("/events"))
            .map(|s| s.body["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }
}

/// A client whose every request is answered by `answer(method, path, body)` as JSON.
fn mock_client(
    answer: impl Fn(&str, &str, Value) -> (u16, Value) + Send + 'static,
) -> kube::Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (status, reply) = answer(&method, &path, body);
            send.send_response(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            );
        }
    });
    kube::Client::new(service, "default")
}

trait TapMerge {
    fn tap_merge(self, patch: &Value) -> Value;
}

impl TapMerge for Value {
    fn tap_merge(mut self, patch: &Value) -> Value {
        egress_runtime::capabilities::kube::merge(&mut self, patch);
        self
    }
}

fn b64(s: &str) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn proxy_json(generation: i64, finalizers: &[&str], status: Option<Value>) -> Value {
    let mut v = json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "p1", "namespace": "crawlers", "uid": UID, "generation": generation,
                     "resourceVersion": "7", "finalizers": finalizers},
        "spec": {"provider": "cluster", "port": 3128},
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    v
}

struct Env {
    api: FakeApi,
    ctx: Arc<Context>,
    world: SimWorld,
}

async fn env(providers_yaml: &str, world_yaml: &str) -> Env {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache),
        ..Default::default()
    })
    .unwrap();
    let config = ProvidersConfig::from_yaml(providers_yaml).unwrap();
    let world = World::from_yaml(world_yaml).unwrap().build().unwrap();
    let providers = Providers::load(
        &runtime,
        &config,
        LoadOptions {
            base_dir: Path::new("."),
            builtin: &egress_builtins::module_for_type,
            backends: world.backends.clone(),
            recorder: None,
        },
    )
    .await
    .unwrap();
    let api = FakeApi::default();
    let ctx = Arc::new(Context::new(
        api.client(),
        "test".into(),
        Loaded {
            config: Arc::new(config),
            providers: Arc::new(providers),
        },
        Arc::new(Metrics::new()),
        Reporter {
            controller: "egress-proxies".into(),
            instance: Some("test".into()),
        },
    ));
    Env { api, ctx, world }
}

const PROVIDERS: &str = "installation: test\nproviders:\n- {name: cluster, type: kubernetes}\n";

fn proxy(v: Value) -> Arc<Proxy> {
    Arc::new(serde_json::from_value(v).unwrap())
}

async fn pod(e: &Env) -> Result<Value, egress_runtime::capabilities::kube::KubeError> {
    e.world
        .backends
        .kube
        .get(&KubeRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: Some("crawlers".into()),
            name: POD.into(),
        })
        .await
}

/// The Ready condition of a written status.
fn ready_condition(status: &Value) -> Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone()
}

#[tokio::test]
async fn the_finalizer_comes_first() {
    let e = env(PROVIDERS, "{}").await;
    let action = reconcile(proxy(proxy_json(1, &[], None)), e.ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    let seen = e.api.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, "PATCH");
    assert_eq!(
        seen[0].path,
        "/apis/crawl.example.com/v1alpha1/namespaces/crawlers/proxies/p1"
    );
    assert_eq!(seen[0].body["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(seen[0].body["metadata"]["resourceVersion"], "7");
    assert!(
        pod(&e).await.is_err(),
        "no instance before the finalizer is on"
    );
}

#[tokio::test]
async fn create_then_poll_until_running() {
    let e = env(PROVIDERS, "{}").await;
    let action = reconcile(proxy(proxy_json(1, &[FINALIZER], None)), e.ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(POLL_INTERVAL));
    let pod = pod(&e).await.unwrap();
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], UID);
    let status = e.api.status_patches().pop().unwrap();
    assert_eq!(status["providerID"], format!("crawlers/{POD}"));
    assert_eq!(status["state"], "Provisioning");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["ip"], Value::Null, "cleared fields are sent as null");
    let provisioned = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Provisioned")
        .unwrap();
    assert_eq!(provisioned["status"], "True");
    assert_eq!(e.api.event_reasons(), vec!["Created"]);

    // The Pod starts; the next reconcile reports Ready with the IP.
    e.world.clock.advance(Duration::from_secs(3));
    e.api.clear();
    let prior: egress_core::ProxyStatus = serde_json::from_value(status).unwrap();
    let action = reconcile(
        proxy(proxy_json(
            1,
            &[FINALIZER],
            Some(serde_json::to_value(&prior).unwrap()),
        )),
        e.ctx.clone(),
    )
    .await
    .unwrap();
    assert_eq!(action, Action::requeue(RESYNC_INTERVAL));
    let status = e.api.status_patches().pop().unwrap();
    assert_eq!(status["state"], "Running");
    assert_eq!(status["ip"], "10.244.0.3");
    let ready = ready_condition(&status);
    assert_eq!(
        (
            ready["status"].as_str(),
            ready["observedGeneration"].as_i64()
        ),
        (Some("True"), Some(1))
    );
    assert_eq!(e.api.event_reasons(), vec!["Running"]);

    // Nothing changed: no status write, no event.
    e.api.clear();
    let steady: egress_core::ProxyStatus = serde_json::from_value(status).unwrap();
    reconcile(
        proxy(proxy_json(
            1,
            &[FINALIZER],
            Some(serde_json::to_value(&steady).unwrap()),
        )),
        e.ctx.clone(),
    )
    .await
    .unwrap();
    assert!(e.api.seen().is_empty(), "{:?}", e.api.seen());
}

async fn running(e: &Env) -> Value {
    reconcile(proxy(proxy_json(1, &[FINALIZER], None)), e.ctx.clone())
        .await
        .unwrap();
    e.world.clock.advance(Duration::from_secs(3));
    let s = e.api.status_patches().pop().unwrap();
    reconcile(proxy(proxy_json(1, &[FINALIZER], Some(s))), e.ctx.clone())
        .await
        .unwrap();
    let s = e.api.status_patches().pop().unwrap();
    e.api.clear();
    s
}

#[tokio::test]
async fn a_terminated_instance_is_replaced() {
    let e = env(PROVIDERS, "{}").await;
    let status = running(&e).await;
    let r = KubeRef {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: Some("crawlers".into()),
        name: POD.into(),
    };
    e.world
        .backends
        .kube
        .patch(&r, &json!({"status": {"phase": "Failed"}}))
        .await
        .unwrap();
    let action = reconcile(
        proxy(proxy_json(1, &[FINALIZER], Some(status))),
        e.ctx.clone(),
    )
    .await
    .unwrap();
    assert_eq!(action, Action::requeue(POLL_INTERVAL));
    assert_eq!(
        e.api.event_reasons(),
        vec!["InstanceStopped", "Replaced", "Created"]
    );
    let pod = pod(&e).await.unwrap();
    assert_eq!(pod["status"]["phase"], "Pending", "a new Pod was created");
    assert_eq!(
        e.api.status_patches().pop().unwrap()["state"],
        "Provisioning"
    );
}

#[tokio::test]
async fn a_lost_instance_is_created_again() {
    let e = env(PROVIDERS, "{}").await;
    let status = running(&e).await;
    e.world
        .backends
        .kube
        .delete(&KubeRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: Some("crawlers".into()),
            name: POD.into(),
        })
        .await
        .unwrap();
    reconcile(
        proxy(proxy_json(1, &[FINALIZER], Some(status))),
        e.ctx.clone(),
    )
    .await
    .unwrap();
    assert_eq!(e.api.event_reasons(), vec!["InstanceLost", "Created"]);
    assert!(pod(&e).await.is_ok());
}

#[tokio::test]
async fn deletion_deletes_the_instance_then_drops_the_finalizer() {
    let e = env(PROVIDERS, "{}").await;
    let status = running(&e).await;
    let mut p = proxy_json(1, &[FINALIZER, "other.example.com/keep"], Some(status));
    p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:10:00Z");
    let action = reconcile(proxy(p), e.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(pod(&e).await.is_err(), "the Pod is gone");
    let finalizer_patch = e
        .api
        .seen()
        .into_iter()
        .find(|s| s.method == "PATCH" && !s.path.ends_with("/status"))
        .unwrap();
    assert_eq!(
        finalizer_patch.body["metadata"]["finalizers"],
        json!(["other.example.com/keep"])
    );
    assert!(e.api.event_reasons().contains(&"Deleted".to_string()));
}

#[tokio::test]
async fn a_permanent_failure_holds_until_the_spec_changes() {
    // The grant allows another namespace only: the create is refused, Permanent.
    let e = env(
        "installation: test\nproviders:\n- name: cluster\n  type: kubernetes\n  grants: {kube: {namespaces: [elsewhere]}}\n",
        "{}",
    )
    .await;
    let action = reconcile(proxy(proxy_json(1, &[FINALIZER], None)), e.ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    let status = e.api.status_patches().pop().unwrap();
    let ready = ready_condition(&status);
    assert_eq!(ready["reason"], "PermanentFailure");
    assert!(ready["message"].as_str().unwrap().contains("not granted"));
    assert_eq!(e.api.event_reasons(), vec!["CreateFailed"]);

    // Same generation: held, nothing is called or written.
    e.api.clear();
    let action = reconcile(
        proxy(proxy_json(1, &[FINALIZER], Some(status.clone()))),
        e.ctx.clone(),
    )
    .await
    .unwrap();
    assert_eq!(action, Action::await_change());
    assert!(e.api.seen().is_empty(), "{:?}", e.api.seen());

    // A spec change (generation 2) releases it: the create is tried again.
    reconcile(
        proxy(proxy_json(2, &[FINALIZER], Some(status))),
        e.ctx.clone(),
    )
    .await
    .unwrap();
    assert_eq!(e.api.event_reasons(), vec!["CreateFailed"]);
}

#[tokio::test]
async fn a_quota_refusal_requeues_with_backoff() {
    let e = env(
        PROVIDERS,
        "kube:\n  faults:\n  - {call: create, times: 2, status: 403, reason: Forbidden, message: 'pods \"p\" is forbidden: exceeded quota: pods'}\n",
    )
    .await;
    let a1 = reconcile(proxy(proxy_json(1, &[FINALIZER], None)), e.ctx.clone())
        .await
        .unwrap();
    assert_eq!(a1, Action::requeue(Duration::from_secs(60)));
    let status = e.api.status_patches().pop().unwrap();
    let ready = ready_condition(&status);
    assert_eq!(ready["reason"], "QuotaExceeded");
    let a2 = reconcile(
        proxy(proxy_json(1, &[FINALIZER], Some(status))),
        e.ctx.clone(),
    )
    .await
    .unwrap();
    assert_eq!(
        a2,
        Action::requeue(Duration::from_secs(120)),
        "the backoff grows"
    );
}

#[tokio::test]
async fn cloud_init_is_read_from_the_secret_and_never_echoed() {
    let e = env(PROVIDERS, "{}").await;
    let mut p = proxy_json(1, &[FINALIZER], None);
    p["spec"]["cloudInitSecretRef"] = json!({"name": "ci", "key": "user-data"});
    reconcile(proxy(p.clone()), e.ctx.clone()).await.unwrap();
    let seen = e.api.seen();
    assert!(
        seen.iter()
            .any(|s| s.method == "GET" && s.path == "/api/v1/namespaces/crawlers/secrets/ci")
    );
    assert!(pod(&e).await.is_ok());
    let all = serde_json::to_string(&seen.iter().map(|s| &s.body).collect::<Vec<_>>()).unwrap();
    assert!(
        !all.contains("SENTINEL"),
        "the secret leaked into a request"
    );

    // A missing Secret: a transient condition naming it, no content, retried.
    let e = env(PROVIDERS, "{}").await;
    p["spec"]["cloudInitSecretRef"] = json!({"name": "absent", "key": "user-data"});
    let action = reconcile(proxy(p), e.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    let status = e.api.status_patches().pop().unwrap();
    let ready = ready_condition(&status);
    assert_eq!(ready["reason"], "TransientFailure");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("Secret crawlers/absent"),
        "{ready}"
    );
    assert!(pod(&e).await.is_err());
}

#[tokio::test]
async fn the_sweeper_deletes_only_old_orphans_of_this_installation() {
    let pod = |name: &str, uid: &str, inst: &str, created: &str| {
        format!(
            "  - {{apiVersion: v1, kind: Pod, metadata: {{name: {name}, namespace: crawlers, creationTimestamp: '{created}', labels: {{egress-proxies.crawl.example.com/managed: 'true', egress-proxies.crawl.example.com/uid: {uid}, egress-proxies.crawl.example.com/installation: {inst}}}}}}}\n"
        )
    };
    let now = egress_core::gc::format_rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
    );
    let world = format!(
        "kube:\n  objects:\n{}{}{}{}",
        pod("live", UID, "test", "2020-01-01T00:00:00Z"),
        pod(
            "orphan",
            "00000000-0000-0000-0000-000000000001",
            "test",
            "2020-01-01T00:00:00Z"
        ),
        pod(
            "young",
            "00000000-0000-0000-0000-000000000002",
            "test",
            &now
        ),
        pod(
            "theirs",
            "00000000-0000-0000-0000-000000000003",
            "other",
            "2020-01-01T00:00:00Z"
        ),
    );
    let e = env(PROVIDERS, &world).await;
    e.api
        .proxies
        .lock()
        .unwrap()
        .push(proxy_json(1, &[FINALIZER], None));
    let judged = egress_operator::sweeper::sweep_once(&e.ctx, Duration::from_secs(300))
        .await
        .unwrap();
    let mut verdicts: Vec<(String, String, bool)> = judged
        .iter()
        .map(|j| (j.provider_id.clone(), format!("{:?}", j.verdict), j.deleted))
        .collect();
    verdicts.sort();
    assert_eq!(
        verdicts,
        vec![
            ("crawlers/live".to_string(), "Live".to_string(), false),
            ("crawlers/orphan".to_string(), "Orphan".to_string(), true),
            ("crawlers/young".to_string(), "Young".to_string(), false),
        ],
        "another installation's Pod is not even listed"
    );
    let remaining = e
        .world
        .backends
        .kube
        .list("v1", "Pod", None, "", None)
        .await
        .unwrap();
    assert_eq!(remaining.len(), 3);
    assert!(
        e.ctx
            .metrics
            .encode()
            .contains("egress_proxies_gc_deletions_total{provider=\"cluster\"} 1")
    );
}

#[tokio::test]
async fn the_monitor_writes_provider_health() {
    let e = env(PROVIDERS, "kube: {serverVersion: v1.33.9}\n").await;
    egress_operator::health::check_once(&e.ctx).await.unwrap();
    let obj = e
        .api
        .health
        .lock()
        .unwrap()
        .get("cluster")
        .cloned()
        .unwrap();
    assert_eq!(obj["status"]["type"], "kubernetes");
    assert_eq!(obj["status"]["healthy"], "True");
    assert_eq!(obj["status"]["targets"][0]["target"], "apiserver");
    assert_eq!(obj["status"]["targets"][0]["reason"], "Healthy");
    assert_eq!(
        obj["status"]["targets"][0]["details"]["serverVersion"],
        "v1.33.9"
    );
    assert_eq!(obj["status"]["module"].as_str().unwrap().len(), 64);
    let seen: Vec<String> = e
        .api
        .seen()
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(
        seen,
        vec![
            "GET /apis/crawl.example.com/v1alpha1/providerhealths/cluster",
            "POST /apis/crawl.example.com/v1alpha1/providerhealths",
            "PATCH /apis/crawl.example.com/v1alpha1/providerhealths/cluster/status",
        ]
    );
    assert!(e.ctx.metrics.encode().contains(
        "egress_proxies_provider_target_healthy{provider=\"cluster\",target=\"apiserver\"} 1"
    ));
}

#[test]
#[ignore = "needs cluster: KUBECONFIG pointing at a cluster with the CRDs from schemas/crds applied"]
fn against_a_real_cluster() {
    // Run with: cargo test -p egress-operator --test controller -- --ignored
    // It applies a Proxy on the kubernetes provider and waits for Ready.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = kube::Client::try_default().await.unwrap();
        let api: kube::Api<Proxy> = kube::Api::namespaced(client, "default");
        let p: Proxy = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "egress-e2e"}, "spec": {"provider": "cluster"}
        }))
        .unwrap();
        api.create(&Default::default(), &p).await.unwrap();
        for _ in 0..60 {
            let got = api.get("egress-e2e").await.unwrap();
            if got
                .status
                .as_ref()
                .is_some_and(egress_core::reconcile::ready_is_true)
            {
                api.delete("egress-e2e", &Default::default()).await.unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        panic!("the Proxy never became Ready");
    });
}

/// A fake Lease endpoint: one Lease object with resourceVersion checks like the API server's.
#[derive(Clone, Default)]
struct FakeLeases {
    lease: Arc<Mutex<Option<Value>>>,
}

impl FakeLeases {
    fn client(&self) -> kube::Client {
        let me = self.clone();
        mock_client(move |method, _path, body| {
            let mut lease = me.lease.lock().unwrap();
            match (method, lease.as_mut()) {
                ("GET", None) => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
                ),
                ("GET", Some(l)) => (200, l.clone()),
                ("POST", None) => {
                    let mut b = body.clone();
                    b["metadata"]["resourceVersion"] = json!("1");
                    *lease = Some(b.clone());
                    (201, b)
                }
                ("POST", Some(_)) => (
                    409,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409}),
                ),
                ("PATCH", Some(l)) => {
                    if body["metadata"]["resourceVersion"] != l["metadata"]["resourceVersion"] {
                        (
                            409,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409}),
                        )
                    } else {
                        let rv: u64 = l["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap()
                            .parse()
                            .unwrap();
                        egress_runtime::capabilities::kube::merge(
                            l,
                            &json!({"spec": body["spec"]}),
                        );
                        l["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
                        (200, l.clone())
                    }
                }
                _ => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}),
                ),
            }
        })
    }

    fn holder(&self) -> String {
        self.lease.lock().unwrap().as_ref().unwrap()["spec"]["holderIdentity"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

#[tokio::test]
async fn two_replicas_share_one_lease() {
    use egress_operator::leader::LeaseLock;
    let api = FakeLeases::default();
    let a = LeaseLock::new(
        api.client(),
        "egress",
        "leader",
        "replica-a",
        Duration::from_secs(15),
    );
    let b = LeaseLock::new(
        api.client(),
        "egress",
        "leader",
        "replica-b",
        Duration::from_secs(15),
    );
    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "a free lease is taken"
    );
    assert_eq!(api.holder(), "replica-a");
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "a held, fresh lease is not taken"
    );
    assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");
    assert_eq!(api.holder(), "replica-a");

    // The holder stops renewing: once the lease has expired the other replica takes it.
    api.lease.lock().unwrap().as_mut().unwrap()["spec"]["renewTime"] =
        json!("2020-01-01T00:00:00.000000Z");
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "an expired lease is taken over"
    );
    assert_eq!(api.holder(), "replica-b");
    let transitions =
        api.lease.lock().unwrap().as_ref().unwrap()["spec"]["leaseTransitions"].as_i64();
    assert_eq!(transitions, Some(1));
    assert!(
        !a.try_acquire_or_renew().await.unwrap(),
        "the old holder has lost it"
    );
}
