//! The controller, the sweeper, the health monitor and the Lease against the API double: the
//! real kube client over a socket to a model with the API server's semantics (resourceVersion
//! preconditions, generation, the status subresource, finalizers), with the real kubernetes
//! provider module creating its Pods in the same cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_control::metrics::Metrics;
use egress_core::reconcile::{FIRST_POLL, RESYNC_INTERVAL};
use egress_k8s_api::crd::Proxy;
use egress_operator::context::{Context, Loaded};
use egress_operator::controller::{FINALIZER, reconcile};
use http::Method;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube_double::model::{ApiError, Key, Kubelet, Options, Patch, Subresource};
use kube_double::{Config, Double, Fault, Recorded, Route};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const POD: &str = "proxy-";
const SECRET_TEXT: &str = "#cloud-config\npassword: SENTINEL-in-a-secret";
const PROXIES: &str = "/apis/crawl.example.com/v1alpha1/namespaces/crawlers/proxies";

struct Env {
    d: Double,
    ctx: Arc<Context>,
}

fn double_config() -> Config {
    Config {
        options: Options {
            kubelet: Some(Kubelet {
                start_ms: 3000,
                termination_ms: 0,
            }),
            require_namespaces: true,
            ..Options::default()
        },
        namespaces: vec!["default".into(), "kube-system".into(), "crawlers".into()],
        // The API server's clock is the operator's, as in a cluster: a Pod's creation time
        // is its age to the operator's polls.
        start_ms: egress_time::now::unix_now_millis(),
        ..Config::default()
    }
}

async fn env(providers_yaml: &str) -> Env {
    env_with(providers_yaml, double_config()).await
}

async fn env_with(providers_yaml: &str, config: Config) -> Env {
    let d = Double::start_with(config).await.unwrap();
    let ctx = context(d.client(), &d, providers_yaml).await;
    Env { d, ctx }
}

/// A Context whose providers reach the double for their Pods, as in a cluster.
async fn context(client: kube::Client, d: &Double, providers_yaml: &str) -> Arc<Context> {
    let (config, providers) = support::providers_on(d, providers_yaml).await;
    Arc::new(Context::new(
        client,
        "test".into(),
        Loaded {
            config: Arc::new(config),
            providers: Arc::new(providers),
            egress: None,
        },
        Arc::new(Metrics::new()),
        Reporter {
            controller: "egress-proxies".into(),
            instance: Some("test".into()),
        },
    ))
}

const PROVIDERS: &str = "installation: test\nproviders:\n- {name: cluster, type: kubernetes}\n";

impl Env {
    fn proxies(&self) -> Api<Proxy> {
        Api::namespaced(self.d.client(), "crawlers")
    }

    /// Creates Proxy p1 (with `finalizers`) and answers it as stored.
    async fn create_proxy(&self, finalizers: &[&str], spec: Value) -> Arc<Proxy> {
        let mut v = json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p1", "namespace": "crawlers", "finalizers": finalizers},
            "spec": {"provider": "cluster", "port": 3128},
        });
        if let Some(s) = spec.as_object() {
            for (k, val) in s {
                v["spec"][k] = val.clone();
            }
        }
        let p: Proxy = serde_json::from_value(v).unwrap();
        self.proxies()
            .create(&PostParams::default(), &p)
            .await
            .unwrap();
        self.proxy().await
    }

    /// Proxy p1 as the API has it now.
    async fn proxy(&self) -> Arc<Proxy> {
        Arc::new(self.proxies().get("p1").await.unwrap())
    }

    async fn reconcile(&self) -> Action {
        reconcile(self.proxy().await, self.ctx.clone())
            .await
            .unwrap()
    }

    fn writes(&self) -> Vec<Recorded> {
        self.d
            .requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    fn status_patches(&self) -> Vec<Value> {
        self.d
            .requests()
            .into_iter()
            .filter(|s| s.method == "PATCH" && s.path.ends_with("/status"))
            .map(|s| s.body["status"].clone())
            .collect()
    }

    /// Reasons of the Events written (new ones and repeats counted into a series).
    fn event_reasons(&self) -> Vec<String> {
        self.d
            .requests()
            .into_iter()
            .filter(|s| s.path.contains("/events"))
            .filter(|s| s.method == "POST" || s.method == "PATCH")
            .map(|s| s.body["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn pod_name(&self) -> String {
        let uid = self.d.with(|c| {
            c.peek(&Key::new(
                "crawl.example.com/v1alpha1",
                "Proxy",
                Some("crawlers"),
                "p1",
            ))
            .map(|p| p["metadata"]["uid"].as_str().unwrap_or("").to_string())
        });
        let uid = uid.unwrap_or_default().replace('-', "");
        format!("{POD}{}", &uid[..12])
    }

    fn pod_key(&self) -> Key {
        Key::new("v1", "Pod", Some("crawlers"), &self.pod_name())
    }

    fn pod(&self) -> Option<Value> {
        self.d.object(&self.pod_key())
    }

    /// Creates p1 with the finalizer and reconciles it until it runs.
    async fn running(&self) {
        self.create_proxy(&[FINALIZER], json!({})).await;
        self.reconcile().await;
        self.d.advance(Duration::from_secs(3));
        self.reconcile().await;
        self.d.clear_requests();
    }
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
    let e = env(PROVIDERS).await;
    let p = e.create_proxy(&[], json!({})).await;
    e.d.clear_requests();
    let action = reconcile(p.clone(), e.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let writes = e.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].method, "PATCH");
    assert_eq!(writes[0].path, format!("{PROXIES}/p1"));
    assert_eq!(
        e.proxy().await.metadata.finalizers,
        Some(vec![FINALIZER.to_string()])
    );
    assert!(e.pod().is_none(), "no instance before the finalizer is on");
}

#[tokio::test]
async fn create_then_poll_until_running() {
    let e = env(PROVIDERS).await;
    e.create_proxy(&[FINALIZER], json!({})).await;
    let action = e.reconcile().await;
    assert_eq!(action, Action::requeue(FIRST_POLL));
    let pod = e.pod().unwrap();
    let p = e.proxy().await;
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["uid"].as_str(),
        p.metadata.uid.as_deref()
    );
    let status = e.status_patches().pop().unwrap();
    assert_eq!(status["providerID"], format!("crawlers/{}", e.pod_name()));
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
    assert_eq!(e.event_reasons(), vec!["Created"]);

    // The Pod starts; the next reconcile reports Ready with the IP.
    e.d.advance(Duration::from_secs(3));
    e.d.clear_requests();
    let action = e.reconcile().await;
    assert_eq!(action, Action::requeue(RESYNC_INTERVAL));
    let status = e.status_patches().pop().unwrap();
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
    assert_eq!(e.event_reasons(), vec!["Running"]);

    // Nothing changed: no status write, no event.
    e.d.clear_requests();
    e.reconcile().await;
    assert!(e.writes().is_empty(), "{:?}", e.writes());
}

#[tokio::test]
async fn a_terminated_instance_is_replaced() {
    let e = env(PROVIDERS).await;
    e.running().await;
    let old_uid = e.pod().unwrap()["metadata"]["uid"].clone();
    let pod = e.pod_key();
    e.d.with(|c| {
        c.patch(
            &pod,
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
            Subresource::Status,
        )
    })
    .unwrap();
    let action = e.reconcile().await;
    assert_eq!(action, Action::requeue(FIRST_POLL));
    assert_eq!(
        e.event_reasons(),
        vec!["InstanceStopped", "Replaced", "Created"]
    );
    let pod = e.pod().unwrap();
    assert_eq!(pod["status"]["phase"], "Pending", "a new Pod was created");
    assert_ne!(pod["metadata"]["uid"], old_uid);
    assert_eq!(e.status_patches().pop().unwrap()["state"], "Provisioning");
}

#[tokio::test]
async fn a_lost_instance_is_created_again() {
    let e = env(PROVIDERS).await;
    e.running().await;
    let pod = e.pod_key();
    e.d.with(|c| c.delete(&pod, &Default::default())).unwrap();
    e.reconcile().await;
    assert_eq!(e.event_reasons(), vec!["InstanceLost", "Created"]);
    assert!(e.pod().is_some());
}

#[tokio::test]
async fn deletion_deletes_the_instance_then_drops_the_finalizer() {
    let e = env(PROVIDERS).await;
    e.running().await;
    e.proxies()
        .patch(
            "p1",
            &Default::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"finalizers": [FINALIZER, "other.example.com/keep"]}}),
            ),
        )
        .await
        .unwrap();
    e.proxies()
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    e.d.clear_requests();
    let action = reconcile(e.proxy().await, e.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(e.pod().is_none(), "the Pod is gone");
    let left = e.proxy().await;
    assert_eq!(
        left.metadata.finalizers,
        Some(vec!["other.example.com/keep".to_string()]),
        "only our finalizer went"
    );
    assert!(e.event_reasons().contains(&"Deleted".to_string()));
    let release =
        e.d.requests()
            .into_iter()
            .find(|r| r.method == "PATCH" && r.path == format!("{PROXIES}/p1"))
            .unwrap();
    assert_eq!(release.content_type, "application/json-patch+json");
    assert_eq!(
        release.body,
        json!([{"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
               {"op": "remove", "path": "/metadata/finalizers/0"}]),
        "the finalizer is tested at its index, with no resourceVersion precondition"
    );
}

#[tokio::test]
async fn a_permanent_failure_holds_until_the_spec_changes() {
    // The grant allows another namespace only: the create is refused, Permanent.
    let e = env(
        "installation: test\nproviders:\n- name: cluster\n  type: kubernetes\n  grants: {kube: {namespaces: [elsewhere]}}\n",
    )
    .await;
    e.create_proxy(&[FINALIZER], json!({})).await;
    let action = e.reconcile().await;
    assert_eq!(action, Action::await_change());
    let status = e.status_patches().pop().unwrap();
    let ready = ready_condition(&status);
    assert_eq!(ready["reason"], "PermanentFailure");
    assert!(ready["message"].as_str().unwrap().contains("not granted"));
    assert_eq!(e.event_reasons(), vec!["CreateFailed"]);

    // Same generation: held, nothing is called or written.
    e.d.clear_requests();
    let action = e.reconcile().await;
    assert_eq!(action, Action::await_change());
    assert!(e.writes().is_empty(), "{:?}", e.writes());

    // A spec change (generation 2) releases it: the create is tried again.
    e.proxies()
        .patch(
            "p1",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"port": 3129}})),
        )
        .await
        .unwrap();
    assert_eq!(e.proxy().await.metadata.generation, Some(2));
    e.reconcile().await;
    assert_eq!(e.event_reasons(), vec!["CreateFailed"]);
}

fn quota(message: &str) -> Fault {
    Fault::Error(ApiError::new(403, "Forbidden", message))
}

#[tokio::test]
async fn a_quota_refusal_requeues_with_backoff() {
    let e = env(PROVIDERS).await;
    e.d.fault(
        Route::new(Method::POST, "/api/v1/namespaces/crawlers/pods"),
        quota("pods \"p\" is forbidden: exceeded quota: pods"),
        Some(2),
    );
    e.create_proxy(&[FINALIZER], json!({})).await;
    let a1 = e.reconcile().await;
    assert_eq!(a1, Action::requeue(Duration::from_secs(60)));
    let status = e.status_patches().pop().unwrap();
    let ready = ready_condition(&status);
    assert_eq!(ready["reason"], "QuotaExceeded");
    let a2 = e.reconcile().await;
    assert_eq!(
        a2,
        Action::requeue(Duration::from_secs(120)),
        "the backoff grows"
    );
}

#[tokio::test]
async fn cloud_init_is_read_from_the_secret_and_never_echoed() {
    let e = env(PROVIDERS).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(e.d.client(), "crawlers");
    // A Secret its namespace did not mark for cloud-init is refused, naming the label, and
    // nothing of it goes anywhere.
    let unmarked: k8s_openapi::api::core::v1::Secret = serde_json::from_value(
        json!({"metadata": {"name": "db"}, "data": {"user-data": b64(SECRET_TEXT)}}),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &unmarked)
        .await
        .unwrap();
    e.create_proxy(
        &[FINALIZER],
        json!({"cloudInitSecretRef": {"name": "db", "key": "user-data"}}),
    )
    .await;
    e.reconcile().await;
    assert!(
        e.pod().is_none(),
        "an unmarked Secret's content reached a create"
    );
    let status = e.status_patches().pop().unwrap();
    let ready = ready_condition(&status);
    let message = ready["message"].as_str().unwrap();
    assert!(
        message.contains("Secret crawlers/db is not marked for cloud-init")
            && message.contains("egress-proxies.crawl.example.com/cloud-init=true"),
        "{ready}"
    );
    assert!(!status.to_string().contains("SENTINEL"));

    let e = env(PROVIDERS).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(e.d.client(), "crawlers");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "ci", "labels": {"egress-proxies.crawl.example.com/cloud-init": "true"}},
        "stringData": {}, "data": {"user-data": b64(SECRET_TEXT)}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    e.create_proxy(
        &[FINALIZER],
        json!({"cloudInitSecretRef": {"name": "ci", "key": "user-data"}}),
    )
    .await;
    e.d.clear_requests();
    e.reconcile().await;
    let seen = e.d.requests();
    assert!(
        seen.iter()
            .any(|s| s.method == "GET" && s.path == "/api/v1/namespaces/crawlers/secrets/ci")
    );
    assert!(e.pod().is_some());
    let all = serde_json::to_string(&seen.iter().map(|s| &s.body).collect::<Vec<_>>()).unwrap();
    assert!(
        !all.contains("SENTINEL"),
        "the secret leaked into a request"
    );

    // A missing Secret: a transient condition naming it, no content, retried.
    let e = env(PROVIDERS).await;
    e.create_proxy(
        &[FINALIZER],
        json!({"cloudInitSecretRef": {"name": "absent", "key": "user-data"}}),
    )
    .await;
    let action = e.reconcile().await;
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    let status = e.status_patches().pop().unwrap();
    let ready = ready_condition(&status);
    assert_eq!(ready["reason"], "TransientFailure");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("Secret crawlers/absent"),
        "{ready}"
    );
    assert!(e.pod().is_none());
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

#[tokio::test]
async fn the_sweeper_deletes_only_old_orphans_of_this_installation() {
    let e = env(PROVIDERS).await;
    let live = e.create_proxy(&[FINALIZER], json!({})).await;
    let live_uid = live.metadata.uid.clone().unwrap();
    let now = egress_core::gc::format_rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
    );
    let pod = |name: &str, uid: &str, inst: &str, created: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "crawlers",
            "creationTimestamp": created, "labels": {
                "egress-proxies.crawl.example.com/managed": "true",
                "egress-proxies.crawl.example.com/uid": uid,
                "egress-proxies.crawl.example.com/installation": inst}}})
    };
    e.d.with(|c| {
        for p in [
            pod("live", &live_uid, "test", "2020-01-01T00:00:00Z"),
            pod(
                "orphan",
                "00000000-0000-0000-0000-000000000001",
                "test",
                "2020-01-01T00:00:00Z",
            ),
            pod(
                "young",
                "00000000-0000-0000-0000-000000000002",
                "test",
                &now,
            ),
            pod(
                "theirs",
                "00000000-0000-0000-0000-000000000003",
                "other",
                "2020-01-01T00:00:00Z",
            ),
        ] {
            c.insert(p).unwrap();
        }
    });
    let swept = egress_operator::sweeper::sweep_once(&e.ctx, Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(swept.complete, ["cluster"]);
    assert!(swept.incomplete.is_empty(), "{:?}", swept.incomplete);
    let mut verdicts: Vec<(String, String, bool)> = swept
        .judged
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
    let pods = e.d.with(|c| {
        c.objects()
            .filter(|(k, _)| k.kind == "Pod")
            .map(|(k, _)| k.name.clone())
            .collect::<Vec<_>>()
    });
    assert_eq!(pods, ["live", "theirs", "young"]);
    assert!(
        e.ctx
            .metrics
            .encode()
            .contains("egress_proxies_gc_deletions_total{provider=\"cluster\"} 1")
    );
}

#[tokio::test]
async fn the_monitor_writes_provider_health() {
    let e = env_with(
        PROVIDERS,
        Config {
            server_version: "v1.33.9".into(),
            ..double_config()
        },
    )
    .await;
    egress_operator::health::check_once(&e.ctx).await.unwrap();
    let obj =
        e.d.object(&Key::new(
            "crawl.example.com/v1alpha1",
            "ProviderHealth",
            None,
            "cluster",
        ))
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
    let seen: Vec<String> =
        e.d.requests()
            .iter()
            .filter(|r| r.path.contains("providerhealths"))
            .map(Recorded::line)
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

fn lease_holder(d: &Double) -> String {
    d.object(&Key::new(
        "coordination.k8s.io/v1",
        "Lease",
        Some("egress"),
        "leader",
    ))
    .unwrap()["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn two_replicas_share_one_lease() {
    use egress_operator::leader::LeaseLock;
    let d = Double::start_with(Config {
        namespaces: vec!["egress".into()],
        ..Config::default()
    })
    .await
    .unwrap();
    let a = LeaseLock::new(
        d.client(),
        "egress",
        "leader",
        "replica-a",
        Duration::from_secs(15),
    );
    let b = LeaseLock::new(
        d.client(),
        "egress",
        "leader",
        "replica-b",
        Duration::from_secs(15),
    );
    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "a free lease is taken"
    );
    assert_eq!(lease_holder(&d), "replica-a");
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "a held, fresh lease is not taken"
    );
    assert!(a.try_acquire_or_renew().await.unwrap(), "the holder renews");
    assert_eq!(lease_holder(&d), "replica-a");

    // The holder stops renewing: once the lease has expired the other replica takes it.
    let key = Key::new("coordination.k8s.io/v1", "Lease", Some("egress"), "leader");
    d.with(|c| {
        c.patch(
            &key,
            &Patch::Merge(json!({"spec": {"renewTime": "2020-01-01T00:00:00.000000Z"}})),
            Subresource::Main,
        )
    })
    .unwrap();
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "an expired lease is taken over"
    );
    assert_eq!(lease_holder(&d), "replica-b");
    let transitions = d.object(&key).unwrap()["spec"]["leaseTransitions"].as_i64();
    assert_eq!(transitions, Some(1));
    assert!(
        !a.try_acquire_or_renew().await.unwrap(),
        "the old holder has lost it"
    );
}

/// A Proxy whose Pod create is refused for quota, with the live count in each refusal's
/// message, under the real controller for two minutes of (paused) time: the backoff schedule
/// (60 s, then 120 s) decides how often the backend is called, not the API's latency. Status
/// writes do not wake the controller, and a repeated refusal does not rewrite the status.
#[tokio::test(start_paused = true)]
async fn a_quota_failure_for_two_minutes_costs_what_the_backoff_says() {
    use futures::StreamExt;
    let d = Double::start_with(double_config()).await.unwrap();
    let runaway = Arc::new(tokio::sync::Notify::new());
    let alarm = runaway.clone();
    d.fault(
        Route::new(Method::POST, "/api/v1/namespaces/crawlers/pods"),
        Fault::With(Arc::new(move |n| {
            if n > 20 {
                alarm.notify_one();
            }
            Some(ApiError::new(
                403,
                "Forbidden",
                format!("pods \"proxy\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods={}, limited: pods=10", 10 + n),
            ))
        })),
        None,
    );
    let ctx = context(d.client_in_memory(), &d, PROVIDERS).await;
    let proxies: Api<Proxy> = Api::namespaced(d.client_in_memory(), "crawlers");
    let p: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "p1"}, "spec": {"provider": "cluster"}}))
    .unwrap();
    proxies.create(&PostParams::default(), &p).await.unwrap();
    let controller = tokio::spawn(
        egress_operator::proxy_controller(d.client_in_memory(), 4)
            .run(reconcile, egress_operator::controller::error_policy, ctx)
            .for_each(|_| async {}),
    );
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(120)) => {}
        _ = runaway.notified() => {}
    }
    controller.abort();
    let requests = d.requests();
    let count = |f: &dyn Fn(&Recorded) -> bool| requests.iter().filter(|r| f(r)).count();
    let creates = count(&|r| r.method == "POST" && r.path == "/api/v1/namespaces/crawlers/pods");
    let status_writes = count(&|r| r.method == "PATCH" && r.path.ends_with("/p1/status"));
    let events = count(&|r| r.path.contains("/events") && r.method != "GET");
    assert_eq!(
        (creates, status_writes, events),
        (2, 1, 2),
        "creates at 0 s and 60 s; one status; the second Event counted into the first's series"
    );
    let event_writes: Vec<String> = requests
        .iter()
        .filter(|r| r.path.contains("/events"))
        .map(|r| r.method.clone())
        .collect();
    assert_eq!(event_writes, ["POST", "PATCH"]);
    let stored = d
        .object(&Key::new(
            "crawl.example.com/v1alpha1",
            "Proxy",
            Some("crawlers"),
            "p1",
        ))
        .unwrap();
    let ready = ready_condition(&stored["status"]);
    assert_eq!(ready["reason"], "QuotaExceeded");
    assert!(
        ready["message"].as_str().unwrap().contains("used: pods=11"),
        "the first refusal's message is kept: {ready}"
    );
}

/// The leader's renewal hangs in the API: it steps down by its renew deadline, before the
/// lease it last renewed can expire for another replica.
#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewal_hangs_steps_down_before_the_lease_expires() {
    use egress_operator::leader::LeaseLock;
    let d = Double::start_with(Config {
        namespaces: vec!["egress".into()],
        ..Config::default()
    })
    .await
    .unwrap();
    let lease = Duration::from_secs(15);
    let a = LeaseLock::new(d.client_in_memory(), "egress", "leader", "replica-a", lease);
    let acquired = tokio::time::Instant::now();
    a.acquire().await.unwrap();
    d.fault(
        Route::new(
            Method::PATCH,
            "/apis/coordination.k8s.io/v1/namespaces/egress/leases/leader",
        ),
        Fault::Hold,
        None,
    );
    let held = tokio::time::timeout(Duration::from_secs(120), a.hold()).await;
    assert!(held.is_ok(), "a hung renewal kept the old leader leading");
    let stepped_down = acquired.elapsed();
    assert!(
        stepped_down <= a.renew_deadline() && a.renew_deadline() < lease,
        "stepped down after {stepped_down:?}; the lease lasts {lease:?}"
    );
    assert!(
        d.requests()
            .iter()
            .any(|r| r.method == "PATCH" && r.path.ends_with("/leases/leader")),
        "a renewal was tried"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_namespace_that_does_not_exist_is_an_error_naming_it() {
    use egress_operator::leader::LeaseLock;
    let d = Double::start().await.unwrap();
    let a = LeaseLock::new(
        d.client_in_memory(),
        "nowhere",
        "leader",
        "replica-a",
        Duration::from_secs(15),
    );
    let e = tokio::time::timeout(Duration::from_secs(120), a.acquire())
        .await
        .expect("acquire gives up on a missing namespace instead of waiting")
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("\"nowhere\"") && text.contains("--namespace"),
        "{text}"
    );
}
