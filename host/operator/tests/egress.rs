//! The egress check in operator mode, the whole loop against the API double: the real
//! kubernetes provider module creates the Pod, the controller checks the running proxy through
//! the checker, writes what it saw to the status, lists the verified proxy at `GET
//! /v1/proxies` (over HTTP on loopback, from a watch of the double), replaces a proxy that
//! stopped forwarding, spares every proxy while the echo itself is down, counts checks in the
//! metrics and writes the provider's counts to its ProviderHealth.
//!
//! The probe is a double standing for the network (the proxies' addresses are the simulated
//! cluster's, which no test may dial); the network probe itself is tested against a real
//! Squid in tests/tests/egress_real.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_control::api::{self, ProxySource, Readiness};
use egress_control::egress::{
    CheckWakes, Chosen, EchoLook, EgressChecker, EgressProbe, StatusFleet,
};
use egress_control::metrics::Metrics;
use egress_core::egress::{CheckReason, CheckResult, Settings};
use egress_k8s_api::crd::Proxy;
use egress_operator::context::{Context, Loaded};
use egress_operator::controller::{FINALIZER, reconcile};
use egress_operator::server::StoreSource;
use egress_runtime::capabilities::clock::{ClockBackend, VirtualClock};
use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_double::model::{Key, Kubelet, Options};
use kube_double::{Config, Double};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use support::get_as;

/// The providers config, with the egress check's `maxUnhealthy`.
fn providers(max_unhealthy: &str) -> String {
    format!(
        "installation: test\n\
         egressCheck: {{urls: ['http://127.0.0.1/anything', 'https://127.0.0.1/anything'], interval: 30s, timeout: 1s, failureThreshold: 2, readinessFailureThreshold: 1, startupTimeout: 10m, maxUnhealthy: {max_unhealthy}}}\n\
         providers:\n- {{name: cluster, type: kubernetes}}\n"
    )
}
const EGRESS_IP: &str = "203.0.113.7";

/// The network as the checker would meet it: every proxy forwards and the echo sees
/// [`EGRESS_IP`], until the test says otherwise.
struct Network {
    forwarding: AtomicBool,
    echo_up: AtomicBool,
    probes: AtomicUsize,
    /// The `Proxy-Authorization` the last probe presented.
    presented: std::sync::Mutex<Option<String>>,
    /// How long each probe takes, in ms (a proxy that answers slowly, or times out).
    delay_ms: std::sync::atomic::AtomicU64,
}

#[async_trait::async_trait]
impl EgressProbe for Network {
    async fn probe(&self, _ip: &str, _port: u16, _s: &Settings, e: &Chosen) -> CheckResult {
        self.probes.fetch_add(1, Ordering::SeqCst);
        *self.presented.lock().unwrap() = e.proxy_authorization.clone();
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.forwarding.load(Ordering::SeqCst) && self.echo_up.load(Ordering::SeqCst) {
            CheckResult {
                reason: CheckReason::Verified,
                egress_ip: Some(EGRESS_IP.into()),
                latency_ms: Some(12),
                message: String::new(),
            }
        } else {
            CheckResult {
                reason: CheckReason::ProxyUnreachable,
                egress_ip: None,
                latency_ms: None,
                message: "connection refused".into(),
            }
        }
    }
    async fn look(&self, s: &Settings) -> EchoLook {
        let up = self.echo_up.load(Ordering::SeqCst);
        EchoLook {
            up: vec![up; s.urls.len()],
            ..EchoLook::default()
        }
    }
}

struct Env {
    d: Double,
    ctx: Arc<Context>,
    net: Arc<Network>,
    clock: Arc<VirtualClock>,
    /// Every Proxy's status as the checker's outage rule and egress peers count them, fed as
    /// the operator's watch feeds it.
    fleet: Arc<StatusFleet>,
}

async fn env(max_unhealthy: &str) -> Env {
    env_counting(max_unhealthy, false).await
}

/// With `fleet`, the checker counts the outage rule and egress peers over a fleet the test
/// feeds as the operator's watch does; without, over its own checks.
async fn env_counting(max_unhealthy: &str, fleet: bool) -> Env {
    env_with(max_unhealthy, fleet, None).await
}

/// With `wakes`, checks run in the background as in `egress-proxies run`, each finished one
/// told to `wakes`.
async fn env_with(max_unhealthy: &str, fleet: bool, wakes: Option<Arc<CheckWakes>>) -> Env {
    let d = Double::start_with(Config {
        options: Options {
            kubelet: Some(Kubelet {
                start_ms: 3000,
                termination_ms: 0,
            }),
            require_namespaces: true,
            ..Options::default()
        },
        namespaces: vec!["default".into(), "kube-system".into(), "crawlers".into()],
        ..Config::default()
    })
    .await
    .unwrap();
    let (config, providers) = support::providers_on(&d, &providers(max_unhealthy)).await;
    let net = Arc::new(Network {
        forwarding: AtomicBool::new(true),
        echo_up: AtomicBool::new(true),
        probes: AtomicUsize::new(0),
        presented: std::sync::Mutex::new(None),
        delay_ms: 0.into(),
    });
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let clock = Arc::new(VirtualClock::new(now_ms, 7));
    let metrics = Arc::new(Metrics::new());
    let settings = Settings::from_config(config.egress_check.as_ref().unwrap());
    let checker = EgressChecker::new(
        settings,
        net.clone(),
        clock.clone() as Arc<dyn ClockBackend>,
    )
    .with_observer(metrics.clone());
    let fleet_of_statuses = Arc::new(StatusFleet::default());
    let checker = if fleet {
        checker.with_fleet(fleet_of_statuses.clone())
    } else {
        checker
    };
    let checker = match wakes {
        Some(w) => checker.in_background(w),
        None => checker,
    };
    let fleet = fleet_of_statuses;
    let ctx = Arc::new(Context::new(
        d.client(),
        "test".into(),
        Loaded {
            config: Arc::new(config),
            providers: Arc::new(providers),
            egress: Some(Arc::new(checker)),
        },
        metrics,
        Reporter {
            controller: "egress-proxies".into(),
            instance: Some("test".into()),
        },
    ));
    Env {
        d,
        ctx,
        net,
        clock,
        fleet,
    }
}

impl Env {
    fn proxies(&self) -> Api<Proxy> {
        Api::namespaced(self.d.client(), "crawlers")
    }

    /// Merge-patches the Proxy `name` as a user's `kubectl patch --type merge` does.
    async fn merge(&self, name: &str, patch: serde_json::Value) {
        self.proxies()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }

    async fn proxy(&self) -> Arc<Proxy> {
        Arc::new(self.proxies().get("p1").await.unwrap())
    }

    async fn reconcile(&self) -> Action {
        reconcile(self.proxy().await, self.ctx.clone())
            .await
            .unwrap()
    }

    fn status(&self) -> Value {
        self.d
            .object(&Key::new(
                "crawl.example.com/v1alpha1",
                "Proxy",
                Some("crawlers"),
                "p1",
            ))
            .unwrap()["status"]
            .clone()
    }

    fn condition(&self, type_: &str) -> Value {
        self.status()["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn pod_deletes(&self) -> usize {
        self.d
            .requests()
            .iter()
            .filter(|r| r.method == "DELETE" && r.path.contains("/pods/"))
            .count()
    }

    fn events(&self) -> Vec<(String, String)> {
        support::events(&self.d)
    }

    /// Moves the checker's clock past the next check: on the Proxy's phase of the 30 s
    /// interval, at most one and a half intervals after the last.
    fn next_interval(&self) {
        self.clock.advance(Duration::from_secs(45));
    }

    /// Creates p1 with the finalizer and reconciles it until its Pod runs and is checked.
    async fn running(&self) -> Action {
        let p: Proxy = serde_json::from_value(json!({
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p1", "namespace": "crawlers", "finalizers": [FINALIZER],
                "labels": {"crawl.example.com/pool": "web"}},
            "spec": {"provider": "cluster", "port": 3128, "placement": {"zone": "z1"}},
        }))
        .unwrap();
        self.proxies()
            .create(&PostParams::default(), &p)
            .await
            .unwrap();
        self.reconcile().await;
        self.d.advance(Duration::from_secs(3));
        self.reconcile().await
    }

    /// Serves discovery over HTTP on loopback from a watch of the double, as every replica
    /// keeps one, once the watch lists p1 with its credential; a crawler's token allowed
    /// every namespace's proxies. Returns the address, the token and the watch's store.
    async fn serve_discovery(&self) -> (std::net::SocketAddr, String, reflector::Store<Proxy>) {
        let (store, writer) = reflector::store();
        tokio::spawn(
            watcher(
                Api::<Proxy>::all(self.d.client()),
                watcher::Config::default(),
            )
            .reflect(writer)
            .for_each(|_| async {}),
        );
        store.wait_until_ready().await.unwrap();
        let (secrets, credential_watch) = egress_k8s_api::watch::credential_watch(self.d.client());
        tokio::spawn(credential_watch);
        secrets.wait_until_ready().await.unwrap();
        let source = Arc::new(StoreSource::new(store.clone()).with_credentials(secrets));
        source.clone().track_sync().await;
        let _ = source.context.set(self.ctx.clone());
        for _ in 0..100 {
            if source
                .discover(&Default::default())
                .first()
                .is_some_and(|d| d.password.is_some())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        support::deploy_cluster_role(&self.d, "egress-proxies-crawler").await;
        support::bind(
            &self.d,
            "egress-proxies-crawler",
            "crawlers",
            "spider",
            None,
        )
        .await;
        let token = self
            .d
            .projected_token("crawlers", "spider", &[egress_serve::auth::AUDIENCE]);
        tokio::spawn(api::serve(
            listener,
            Arc::new(api::Api {
                audit: None,
                demand: None,
                metrics: self.ctx.metrics.clone(),
                ready: Arc::new(Readiness::default()),
                source,
                guard: support::kube_guard(&self.d),
                leases: None,
            }),
        ));
        (addr, token, store)
    }

    /// Waits until the watch's copy of p1 is the double's, so what discovery answers next
    /// reads the status the last reconcile wrote.
    async fn watched(&self, store: &reflector::Store<Proxy>) {
        let want = self
            .d
            .object(&Key::new(
                "crawl.example.com/v1alpha1",
                "Proxy",
                Some("crawlers"),
                "p1",
            ))
            .unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        for _ in 0..250 {
            let seen = store
                .get(&reflector::ObjectRef::new("p1").within("crawlers"))
                .and_then(|p| p.metadata.resource_version.clone());
            if seen.as_deref() == Some(want.as_str()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the watch never saw resourceVersion {want}");
    }
}

/// The proxies `/v1/proxies` lists, as JSON.
async fn listed(addr: std::net::SocketAddr, token: &str) -> Vec<Value> {
    let (code, body) = get_as(addr, "/v1/proxies", token).await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["proxies"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn a_running_proxy_is_checked_verified_and_listed_for_the_crawlers() {
    let e = env("40%").await;
    let action = e.running().await;
    assert_eq!(e.net.probes.load(Ordering::SeqCst), 1);
    let status = e.status();
    assert_eq!(status["state"], "Running");
    assert_eq!(status["egressIP"], EGRESS_IP);
    assert_eq!(status["egressLatencyMs"], 12);
    assert!(status["egressVerifiedAt"].is_string());
    assert_eq!(e.condition("EgressVerified")["status"], "True");
    assert_eq!(e.condition("Ready")["status"], "True");
    // The next check is due within the interval and its jitter, not at the resync.
    assert!(
        format!("{action:?}").contains("requeue_after: Some("),
        "{action:?}"
    );
    assert!(
        e.events()
            .iter()
            .any(|(r, note)| r == "EgressVerified" && note.contains(EGRESS_IP)),
        "{:?}",
        e.events()
    );

    // Discovery over HTTP, from a watch of the API as every replica keeps one.
    let (addr, token, _store) = e.serve_discovery().await;
    // The Proxy's credential: a Secret beside it, owned by it; the check presented it, and
    // the Pod's Squid got only its hash, in a Secret of the Pod's.
    let credential =
        e.d.object(&Key::new(
            "v1",
            "Secret",
            Some("crawlers"),
            "p1-proxy-credential",
        ))
        .expect("the credential Secret is made with the first instance");
    assert_eq!(
        credential["metadata"]["ownerReferences"][0]["kind"],
        "Proxy"
    );
    let field = |k: &str| {
        use base64::Engine;
        let b = credential["data"][k].as_str().unwrap();
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap()
    };
    let (username, password) = (field("username"), field("password"));
    assert_eq!(username, "p1");
    assert_eq!(password.len(), 32);
    let basic = {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
        )
    };
    assert_eq!(
        e.net.presented.lock().unwrap().as_deref(),
        Some(basic.as_str())
    );
    let pods_secret =
        e.d.objects()
            .into_iter()
            .find(|o| {
                o["kind"] == "Secret"
                    && o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("-htpasswd"))
            })
            .expect("the Pod's htpasswd Secret");
    let htpasswd = {
        use base64::Engine;
        let b = pods_secret["data"]["htpasswd"].as_str().unwrap();
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap()
    };
    assert!(
        egress_core::credential::htpasswd_accepts(&htpasswd, &username, &password),
        "{htpasswd}"
    );
    assert!(!htpasswd.contains(&password));
    // Nowhere else: not in the Proxy, its status or any Event.
    for o in e.d.objects() {
        if o["kind"] != "Secret" {
            let text = o.to_string();
            assert!(!text.contains(&password), "{text}");
            assert!(!text.contains("$6$"), "{text}");
        }
    }
    let get = |addr, target| {
        let token = token.clone();
        async move { get_as(addr, target, &token).await }
    };
    let ip = status["ip"].as_str().unwrap();
    let (code, body) = get(addr, "/v1/proxies").await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let list = v["proxies"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{body}");
    assert_eq!(list[0]["namespace"], "crawlers");
    assert_eq!(list[0]["name"], "p1");
    assert_eq!(list[0]["provider"], "cluster");
    assert_eq!(list[0]["url"], format!("http://p1:{password}@{ip}:3128"));
    assert_eq!(list[0]["username"], "p1");
    assert_eq!(list[0]["password"], password.as_str());
    assert_eq!(list[0]["egressIP"], EGRESS_IP);
    assert_eq!(list[0]["zone"], "z1");
    assert_eq!(list[0]["pool"], "web");
    assert_eq!(list[0]["latencyMs"], 12);
    assert!(list[0]["verifiedAt"].is_string());
    let line = format!("http://p1:{password}@{ip}:3128\n");
    assert_eq!(
        get(addr, "/v1/proxies?format=text").await,
        (200, line.clone())
    );
    assert_eq!(
        get(
            addr,
            "/v1/proxies?provider=cluster&namespace=crawlers&format=text"
        )
        .await,
        (200, line.clone())
    );
    let (_, none) = get(addr, "/v1/proxies?provider=other").await;
    assert_eq!(
        serde_json::from_str::<Value>(&none).unwrap()["proxies"],
        json!([])
    );
    assert_eq!(
        get(addr, "/v1/proxies?pool=web&format=text").await,
        (200, line.clone())
    );
    let (_, none) = get(addr, "/v1/proxies?pool=other&format=text").await;
    assert_eq!(none, "");
    let (code, why) = get(addr, "/v1/proxies?zone=z1").await;
    assert_eq!(code, 400);
    assert!(why.contains("\"zone\""), "{why}");
    let (code, why) = get(addr, "/v1/proxies?format=yaml").await;
    assert_eq!(code, 400);
    assert!(why.contains("format"), "{why}");

    // A cordoned Proxy leaves discovery at once.
    e.merge(
        "p1",
        json!({"metadata": {"annotations": {"crawl.example.com/cordon": "true"}}}),
    )
    .await;
    let mut listed = String::from("?");
    for _ in 0..100 {
        listed = get(addr, "/v1/proxies?format=text").await.1;
        if listed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(listed, "", "a cordoned Proxy is still listed");

    let metrics = e.ctx.metrics.encode();
    assert!(
        metrics.contains(
            "egress_proxies_egress_checks_total{provider=\"cluster\",result=\"Verified\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("egress_proxies_egress_check_latency_seconds_count{provider=\"cluster\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_proxy_that_stops_forwarding_is_replaced_after_the_threshold() {
    // 40% of one checked proxy rounds up to one: a lone proxy is replaced.
    let e = env("40%").await;
    e.running().await;
    assert_eq!(e.condition("Ready")["status"], "True");

    e.net.forwarding.store(false, Ordering::SeqCst);
    e.next_interval();
    e.reconcile().await;
    let status = e.status();
    assert_eq!(status["egressFailures"], 1);
    assert_eq!(e.condition("EgressVerified")["reason"], "ProxyUnreachable");
    assert_eq!(e.condition("Ready")["status"], "False");
    assert_eq!(e.pod_deletes(), 0, "replaced before the threshold");

    e.next_interval();
    e.reconcile().await;
    assert_eq!(e.pod_deletes(), 1, "not replaced at the threshold");
    let replacing: Vec<_> = e
        .events()
        .into_iter()
        .filter(|(r, _)| r == "ReplacingUnhealthy")
        .collect();
    assert_eq!(replacing.len(), 1, "{:?}", e.events());
    assert!(
        replacing[0].1.contains("failed 2 egress checks in a row")
            && replacing[0].1.contains("ProxyUnreachable"),
        "{replacing:?}"
    );
    // What the checks learned of the old instance is gone from the status with it.
    let status = e.status();
    assert!(status.get("egressIP").is_none(), "{status}");
    assert!(status.get("egressFailures").is_none(), "{status}");

    // The new instance runs and is checked as new: verified again once it forwards.
    e.net.forwarding.store(true, Ordering::SeqCst);
    e.d.advance(Duration::from_secs(3));
    for _ in 0..4 {
        e.reconcile().await;
        if e.condition("Ready")["status"] == "True" {
            break;
        }
        e.d.advance(Duration::from_secs(3));
    }
    assert_eq!(e.condition("Ready")["status"], "True", "{}", e.status());
    assert_eq!(e.status()["egressIP"], EGRESS_IP);
    assert_ne!(e.status()["providerID"], Value::Null);

    let metrics = e.ctx.metrics.encode();
    assert!(
        metrics.contains(
            "egress_proxies_egress_checks_total{provider=\"cluster\",result=\"ProxyUnreachable\"} 2"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn while_the_echo_is_down_no_proxy_is_blamed_and_provider_health_says_so() {
    // No failing proxy tolerated: the one failing proxy is an outage of the provider.
    let e = env("0").await;
    e.running().await;
    let (addr, token, store) = e.serve_discovery().await;
    assert_eq!(listed(addr, &token).await.len(), 1);
    egress_operator::health::check_once(&e.ctx).await.unwrap();
    let health = |d: &Double| {
        d.object(&Key::new(
            "crawl.example.com/v1alpha1",
            "ProviderHealth",
            None,
            "cluster",
        ))
        .unwrap()["status"]["egress"]
            .clone()
    };
    let h = health(&e.d);
    assert_eq!(
        (
            h["checked"].clone(),
            h["verified"].clone(),
            h["failing"].clone()
        ),
        (json!(1), json!(1), json!(0))
    );
    assert_eq!(h["replacing"], "True");

    // The echo goes down: every probe fails, and so does the direct look at the echo.
    e.net.echo_up.store(false, Ordering::SeqCst);
    for _ in 0..4 {
        e.next_interval();
        e.reconcile().await;
    }
    assert_eq!(
        e.pod_deletes(),
        0,
        "a proxy was replaced for the echo's outage"
    );
    let c = e.condition("EgressVerified");
    assert_eq!(c["reason"], "CheckerUnavailable");
    assert_eq!(c["status"], "Unknown");
    assert!(e.status().get("egressFailures").is_none(), "{}", e.status());
    // The checker's failure is not the proxy's: it stays Ready and listed for the crawlers
    // through the outage, on what discovery's own watch holds.
    assert_eq!(e.condition("Ready")["status"], "True", "{}", e.status());
    e.watched(&store).await;
    let list = listed(addr, &token).await;
    assert_eq!(
        list.iter().map(|p| p["name"].clone()).collect::<Vec<_>>(),
        vec![json!("p1")],
        "{list:?}"
    );
    assert!(
        e.ctx
            .metrics
            .encode()
            .contains("result=\"CheckerUnavailable\"} 4"),
        "{}",
        e.ctx.metrics.encode()
    );

    // The echo is back, the proxy forwards: verified again, the same Pod.
    e.net.echo_up.store(true, Ordering::SeqCst);
    e.next_interval();
    e.reconcile().await;
    assert_eq!(e.condition("EgressVerified")["status"], "True");
    assert_eq!(e.pod_deletes(), 0);

    // Every proxy of the provider failing at once (more than maxUnhealthy): an outage, which
    // ProviderHealth reports, and no replacement.
    e.net.forwarding.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        e.next_interval();
        e.reconcile().await;
    }
    assert_eq!(
        e.pod_deletes(),
        0,
        "replaced during a provider-wide failure"
    );
    egress_operator::health::check_once(&e.ctx).await.unwrap();
    let h = health(&e.d);
    assert_eq!(h["replacing"], "False", "{h}");
    assert_eq!(h["failing"], 1);
    assert!(
        h["message"].as_str().unwrap().contains("maxUnhealthy 0"),
        "{h}"
    );
    let metrics = e.ctx.metrics.encode();
    assert!(
        metrics.contains("egress_proxies_egress_proxies{provider=\"cluster\",state=\"failing\"} 1"),
        "{metrics}"
    );
}

/// A port edit of a running pool member (3128 -> 3130): its instance keeps serving 3128 until
/// its pool replaces it, so discovery advertises 3128, what the instance serves
/// (`status.instanceSpec`), never the spec's new port nothing listens on.
#[tokio::test]
async fn after_a_port_edit_discovery_advertises_the_port_the_instance_serves() {
    let e = env("40%").await;
    e.running().await;
    assert_eq!(e.condition("Ready")["status"], "True");
    assert_eq!(e.status()["instanceSpec"]["port"], 3128, "{}", e.status());
    let (addr, token, store) = e.serve_discovery().await;
    let ip = e.status()["ip"].as_str().unwrap().to_string();
    let before = listed(addr, &token).await;
    assert!(
        before[0]["url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("@{ip}:3128")),
        "{before:?}"
    );

    e.merge("p1", json!({"spec": {"port": 3130}})).await;
    e.next_interval();
    e.reconcile().await;
    // A pool's member is replaced by its pool, not by itself: the same Pod serves on.
    assert_eq!(e.pod_deletes(), 0, "{:?}", e.events());
    assert_eq!(e.status()["instanceSpec"]["port"], 3128, "{}", e.status());
    let ready = e.condition("Ready");
    assert!(
        ready["message"].as_str().unwrap().contains("port 3128"),
        "{ready}"
    );
    e.watched(&store).await;
    let after = listed(addr, &token).await;
    assert_eq!(after.len(), 1, "{after:?}");
    let url = after[0]["url"].as_str().unwrap();
    assert!(url.ends_with(&format!("@{ip}:3128")), "{url}");
    assert!(!url.contains(":3130"), "{url}");
}

/// Two proxies behind one egress address: the one verified second names the first in its
/// status; the watch telling the fleet of it makes the operator reconcile the first (the
/// stream the Proxy controller reconciles on), whose status then names the second.
#[tokio::test]
async fn proxies_behind_one_egress_address_name_each_other() {
    let e = env_counting("40%", true).await;
    // p0 is verified on the same address already, as the watch tells the fleet.
    let p0: Proxy = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
        "metadata": {"name": "p0", "namespace": "crawlers"},
        "spec": {"provider": "cluster", "port": 3128},
        "status": {"egressIP": EGRESS_IP, "conditions": [{"type": "Ready", "status": "True",
            "reason": "Verified", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }))
    .unwrap();
    egress_operator::feed_fleet(&e.fleet, &watcher::Event::Apply(p0));
    let mut peers = Box::pin(egress_operator::peers_changed(e.fleet.clone()));
    e.running().await;
    let status = e.status();
    assert_eq!(status["egressIP"], EGRESS_IP, "{status}");
    assert_eq!(
        status["egressSharedWith"],
        json!(["crawlers/p0"]),
        "{status}"
    );
    // The watch brings p1's new status: p0's peers changed, and p0 is to be reconciled.
    egress_operator::feed_fleet(
        &e.fleet,
        &watcher::Event::Apply(e.proxy().await.as_ref().clone()),
    );
    let next = tokio::time::timeout(Duration::from_secs(5), peers.next())
        .await
        .expect("a Proxy to reconcile")
        .unwrap();
    assert_eq!(
        (next.name.as_str(), next.namespace.as_deref()),
        ("p0", Some("crawlers"))
    );
    assert_eq!(
        e.ctx
            .loaded()
            .egress
            .as_ref()
            .unwrap()
            .egress_peers("crawlers/p0", EGRESS_IP),
        vec!["crawlers/p1"]
    );
    // p1 stops forwarding and is no longer Ready: p0 is told again, and p1 names no one.
    e.net.forwarding.store(false, Ordering::SeqCst);
    e.next_interval();
    e.reconcile().await;
    assert!(
        e.status().get("egressSharedWith").is_none(),
        "{}",
        e.status()
    );
    egress_operator::feed_fleet(
        &e.fleet,
        &watcher::Event::Apply(e.proxy().await.as_ref().clone()),
    );
    let next = tokio::time::timeout(Duration::from_secs(5), peers.next())
        .await
        .expect("p0 again")
        .unwrap();
    assert_eq!(next.name, "p0");
}

/// Checks run beside the reconciles, never in their slots: with one reconcile at a time and
/// every proxy taking 5 s to answer its check, four new Proxies still get their Pods at once
/// while the first four are being checked (provider calls do not queue behind checks), and
/// each is Ready once its check finished and woke it, through the stream the Proxy
/// controller reconciles on.
#[tokio::test]
async fn checks_run_beside_the_reconciles_never_in_their_slots() {
    let wakes = Arc::new(CheckWakes::default());
    let e = env_with("40%", false, Some(wakes.clone())).await;
    e.net.delay_ms.store(5_000, Ordering::SeqCst);
    let controller = egress_operator::proxy_controller(e.d.client(), 1)
        .reconcile_on(egress_operator::checks_finished(wakes))
        .run(
            reconcile,
            egress_operator::controller::error_policy,
            e.ctx.clone(),
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);
    let started = std::time::Instant::now();
    let e = &e;
    let create = |from: usize| async move {
        for i in from..from + 4 {
            let p: Proxy = serde_json::from_value(json!({
                "apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
                "metadata": {"name": format!("q{i}"), "namespace": "crawlers"},
                "spec": {"provider": "cluster", "port": 3128},
            }))
            .unwrap();
            e.proxies()
                .create(&PostParams::default(), &p)
                .await
                .unwrap();
        }
    };
    let pods = || {
        e.d.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/pods"))
            .count()
    };
    create(0).await;
    while pods() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} Pods",
            pods()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The kubelet starts a Pod 3 s after it is made (the double's clock): the four run, and
    // their checks begin.
    e.d.advance(Duration::from_secs(3));
    while e.net.probes.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no check began"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = std::time::Instant::now();
    create(4).await;
    while pods() < 8 {
        assert!(
            second.elapsed() < Duration::from_secs(20),
            "{} of 8 Pods made",
            pods()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let made_after = second.elapsed();
    e.d.advance(Duration::from_secs(3));
    let ready = || async {
        let list = e.proxies().list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(egress_core::reconcile::ready_is_true)
            })
            .count()
    };
    while ready().await < 8 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} of 8 Ready",
            ready().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready_after = second.elapsed();
    controller.abort();
    assert_eq!(e.net.probes.load(Ordering::SeqCst), 8, "one check each");
    // A check of 5 s holding the one reconcile slot would hold these creates behind it.
    assert!(
        made_after < Duration::from_secs(3),
        "the Pods were made {made_after:?} after their Proxies, behind the checks"
    );
    // Eight checks of 5 s one after another would take 40 s; beside the reconciles, they
    // overlap.
    assert!(
        ready_after < Duration::from_secs(20),
        "Ready after {ready_after:?}"
    );
}

/// A writer into a shared buffer, for a subscriber that records everything.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// At every level, through a proxy's first create (its credential made), its checks (which
/// present the credential), discovery and a lease (which hand it out), no password, hash or
/// `Proxy-Authorization` value reaches the log. The subscriber is the process's, so the other
/// tests of this file log into it too.
#[tokio::test]
async fn no_proxy_password_reaches_the_log() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let e = env("40%").await;
    e.running().await;
    e.next_interval();
    e.reconcile().await;
    let (store, writer) = reflector::store();
    tokio::spawn(
        watcher(Api::<Proxy>::all(e.d.client()), watcher::Config::default())
            .reflect(writer)
            .for_each(|_| async {}),
    );
    store.wait_until_ready().await.unwrap();
    let (secrets, credential_watch) = egress_k8s_api::watch::credential_watch(e.d.client());
    tokio::spawn(credential_watch);
    secrets.wait_until_ready().await.unwrap();
    let source = Arc::new(StoreSource::new(store).with_credentials(secrets));
    source.clone().track_sync().await;
    let _ = source.context.set(e.ctx.clone());
    support::deploy_cluster_role(&e.d, "egress-proxies-crawler").await;
    support::bind(&e.d, "egress-proxies-crawler", "crawlers", "spider", None).await;
    let token =
        e.d.projected_token("crawlers", "spider", &[egress_serve::auth::AUDIENCE]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(api::serve(
        listener,
        Arc::new(api::Api {
            audit: None,
            demand: None,
            metrics: e.ctx.metrics.clone(),
            ready: Arc::new(Readiness::default()),
            source: source.clone(),
            guard: support::kube_guard(&e.d),
            leases: Some(Arc::new(egress_control::leases::kube::KubeLeases::new(
                e.d.client(),
                source.clone(),
                egress_time::now::system_clock(),
                e.ctx.metrics.clone(),
            ))),
        }),
    ));
    let mut listed = String::new();
    for _ in 0..100 {
        listed = get_as(addr, "/v1/proxies?namespace=crawlers", &token)
            .await
            .1;
        if listed.contains("\"password\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(listed.contains("\"password\""), "{listed}");
    // p1 as a member of pool web: a lease is taken of a pool's own Proxies.
    let pool: egress_k8s_api::crd::ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
        "metadata": {"name": "web", "namespace": "crawlers"},
        "spec": {"replicas": 1, "template": {"port": 3128},
                 "placements": [{"provider": "cluster", "weight": 1}]},
    }))
    .unwrap();
    let pool = Api::<egress_k8s_api::crd::ProxyPool>::namespaced(e.d.client(), "crawlers")
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    e.merge(
        "p1",
        json!({"metadata": {"ownerReferences": [{
            "apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyPool",
            "name": "web", "uid": pool.metadata.uid, "controller": true,
        }]}}),
    )
    .await;
    let body = r#"{"namespace":"crawlers","pool":"web","count":1,"mode":"Shared","ttl":"5m"}"#;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!(
            "POST /v1/leases HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut leased = String::new();
    s.read_to_string(&mut leased).await.unwrap();
    assert!(leased.starts_with("HTTP/1.1 201"), "{leased}");

    let credential =
        e.d.object(&Key::new(
            "v1",
            "Secret",
            Some("crawlers"),
            "p1-proxy-credential",
        ))
        .unwrap();
    let password = {
        use base64::Engine;
        let b = credential["data"]["password"].as_str().unwrap();
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap()
    };
    assert!(
        leased.contains(&password),
        "the lease hands out the credential"
    );
    let basic = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("p1:{password}"))
    };
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("EgressVerified") || log.contains("egress"),
        "the log was not captured: {log}"
    );
    for secret in [password.as_str(), basic.as_str(), "$6$"] {
        assert!(!log.contains(secret), "{secret:?} is in the log:\n{log}");
    }
}
