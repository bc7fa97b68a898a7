//! A pool that follows demand, in a cluster, from zero and back, twenty times, with real parts
//! where they meet: the operator as `egress-proxies run` starts it (`egress_operator::run`)
//! against the API double, which runs each Pod the kubernetes provider module makes as a real
//! Squid on a loopback address of its own (its htpasswd the Pod's Secret, admitting the
//! Proxy's credential and the gateway's); the egress check verifies each through that Squid to
//! the echo; the gateway in a cluster (its members from the Proxies, its crawlers'
//! ServiceAccount tokens reviewed by the API server) says its demand to the operator's API;
//! curl is the crawler.
//!
//! Each round: the pool has no member; curl asks for the echo through the gateway; the gateway
//! holds the request and says its demand; the operator makes a member, the Pod runs, Squid
//! listens, the check verifies it, the gateway sends the request on. Then the crawl stops and
//! the pool goes back to zero after `idleAfter`. Skips without Squid or port 80 (root), unless
//! EGRESS_REQUIRE_REAL_BACKENDS=1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../host/egress-check/tests/support/mod.rs"]
mod support;

use base64::Engine;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, PostParams};
use kube_double::model::{Kubelet, Options};
use kube_double::{Config, Double};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const NS: &str = "crawlers";
const OPERATOR_NS: &str = "egress-proxies";
const ROUNDS: usize = 20;
const IDLE_AFTER: Duration = Duration::from_secs(2);

/// The n-th Pod's address: a loopback address of its own, where its Squid listens.
fn pod_ip(n: u32) -> String {
    format!("127.3.{}.{}", n / 250, n % 250 + 2)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The kubelet's other half: each running Pod of the double gets a real Squid at its address,
/// from the htpasswd the provider wrote into the Pod's Secret; a Pod gone takes its Squid.
async fn run_pods(d: Arc<Double>, binary: std::path::PathBuf, started: Arc<std::sync::Mutex<u32>>) {
    let mut squids: BTreeMap<String, support::Squid> = BTreeMap::new();
    // The gateway connects from 127.0.0.1, the egress check from its source address.
    let conf = support::generated_conf_for(&["127.0.0.1/32", "127.0.0.5/32"]);
    loop {
        let objects = d.objects();
        let pods: BTreeMap<String, String> = objects
            .iter()
            .filter(|o| o["kind"] == "Pod" && o["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|o| {
                Some((
                    o["metadata"]["name"].as_str()?.to_string(),
                    o["status"]["podIP"].as_str()?.to_string(),
                ))
            })
            .collect();
        let gone: Vec<String> = squids
            .keys()
            .filter(|k| !pods.contains_key(*k))
            .cloned()
            .collect();
        for name in gone {
            // As the kubelet stops a Pod: SIGTERM (Squid stops taking connections and
            // finishes those it has), then its grace.
            let squid = squids.remove(&name).unwrap();
            tokio::task::spawn_blocking(move || squid.terminate(Duration::from_secs(30)));
        }
        for (name, ip) in pods {
            if squids.contains_key(&name) {
                continue;
            }
            let secret = objects.iter().find(|o| {
                o["kind"] == "Secret" && o["metadata"]["name"] == format!("{name}-htpasswd")
            });
            let Some(htpasswd) = secret.and_then(|s| s["data"]["htpasswd"].as_str()) else {
                continue;
            };
            let htpasswd = String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(htpasswd)
                    .unwrap(),
            )
            .unwrap();
            let listen: SocketAddr = format!("{ip}:3128").parse().unwrap();
            let (binary, conf) = (binary.clone(), conf.clone());
            let squid = tokio::task::spawn_blocking(move || {
                support::Squid::start_listening(&binary, &conf, listen, &htpasswd)
            })
            .await
            .unwrap();
            *started.lock().unwrap() += 1;
            squids.insert(name, squid);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The deploy's ClusterRole `name`, bound to ServiceAccount `sa` in `namespace`.
async fn bind_deploy_role(client: &kube::Client, name: &str, namespace: &str, sa: &str) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let role: ClusterRole = text
        .split("\n---\n")
        .map(|doc| serde_yaml::from_str::<serde_yaml::Value>(doc).unwrap())
        .find_map(|v| {
            (v["kind"] == "ClusterRole" && v["metadata"]["name"] == name)
                .then(|| serde_yaml::from_value(v).unwrap())
        })
        .unwrap();
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{sa}"), "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// The pool's Proxies now, by name.
fn members(d: &Double) -> Vec<String> {
    d.objects()
        .into_iter()
        .filter(|o| {
            o["kind"] == "Proxy"
                && o["metadata"]["labels"][egress_core::discovery::POOL_LABEL] == "web"
        })
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

async fn until(what: &str, limit: Duration, f: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    t0.elapsed()
}

/// curl's GET of the echo through the gateway as `user` with `token`: its status, time to the
/// first byte, and the body.
fn curl(gateway: SocketAddr, user: &str, token: &str) -> (u16, f64, String) {
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "90",
            "-w",
            "\n%{http_code} %{time_starttransfer}",
        ])
        .arg("--proxy")
        .arg(format!("http://{gateway}"))
        .arg("--proxy-user")
        .arg(format!("{user}:{token}"))
        .arg(format!("http://{}/anything", support::ECHO_IP))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
    let mut tail = tail.split(' ');
    let code = tail.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let ttfb = tail.next().and_then(|t| t.parse().ok()).unwrap_or(f64::NAN);
    (
        code,
        ttfb,
        format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_at_zero_wakes_for_a_held_request_twenty_times_and_sleeps_when_idle() {
    let Some(binary) = support::squid_and_echo() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = Arc::new(
        Double::start_with(Config {
            options: Options {
                // A container's start: the Pod runs (with its address) this long after it
                // is made.
                kubelet: Some(Kubelet {
                    start_ms: 500,
                    termination_ms: 0,
                }),
                require_namespaces: true,
                history: 1_000_000,
                pod_ip,
                ..Options::default()
            },
            namespaces: vec![
                "default".into(),
                "kube-system".into(),
                NS.into(),
                OPERATOR_NS.into(),
            ],
            // The API server's clock is the operator's, as in a cluster.
            start_ms: egress_time::now::unix_now_millis(),
            ..Config::default()
        })
        .await
        .unwrap(),
    );
    let client = d.client();
    let started = Arc::new(std::sync::Mutex::new(0u32));
    let pods = tokio::spawn(run_pods(d.clone(), binary, started.clone()));

    // The operator, as `egress-proxies run` starts it, with the egress check of the echo.
    let (_, identity) = support::shared_tls_echo().unwrap();
    let pin = egress_check::tls::fingerprint_text(&identity.fingerprint);
    let echo = support::ECHO_IP;
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        format!(
            "installation: cold-starts\n\
             egressCheck: {{urls: ['http://{echo}/anything', 'https://{echo}/anything'], tls: {{certificateSHA256: '{pin}'}}, interval: 2s, timeout: 1s, failureThreshold: 2, readinessFailureThreshold: 1, startupTimeout: 1m, sourceAddress: {}}}\n\
             providers:\n- {{name: cluster, type: kubernetes}}\n",
            support::ALLOWED_CLIENT
        ),
    )
    .unwrap();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&d.kubeconfig(OPERATOR_NS)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let api_port = free_port();
    let operator = tokio::spawn(egress_operator::run_with(
        egress_operator::Options {
            providers: providers.clone(),
            namespace: Some(OPERATOR_NS.into()),
            lease_name: "egress-proxies-leader".into(),
            identity: "egress-proxies-0".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], api_port)),
            api_tls: egress_serve::tls::Mode::Plaintext,
            token_audiences: vec![egress_serve::auth::AUDIENCE.into()],
            metrics_token_audiences: vec![],
            probe_listen: SocketAddr::from(([127, 0, 0, 1], free_port())),
            gc_interval: Duration::from_secs(300),
            gc_grace: Duration::from_secs(300),
            health_interval: Duration::from_secs(60),
            reload_interval: Duration::from_secs(10),
            concurrency: 8,
            api_tokens: None,
            webhook: None,
            audit: None,
            max_replicas: 100,
            demand_peers: None,
            quotas: None,
        },
        config,
    ));

    // The crawler: a ServiceAccount of its namespace, bound to the deploy's crawler role.
    bind_deploy_role(&client, "egress-proxies-crawler", NS, "spider").await;
    let token = d.projected_token(NS, "spider", &[egress_serve::auth::AUDIENCE]);

    // The pool, at zero while no one crawls.
    let pool: egress_k8s_api::crd::ProxyPool = serde_json::from_value(json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 0,
            "template": {"port": 3128},
            "placements": [{"provider": "cluster"}],
            "autoscale": {"minReplicas": 0, "maxReplicas": 2, "idleAfter": "2s", "coldStartWait": "60s"},
        },
    }))
    .unwrap();
    Api::<egress_k8s_api::crd::ProxyPool>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();

    // The gateway in the cluster, saying its demand to the operator's API.
    let table = Arc::new(egress_gateway::MemberTable::new(vec![
        egress_gateway::PoolKey::parse("crawlers/web").unwrap(),
    ]));
    let operator_secret = (
        OPERATOR_NS.to_string(),
        egress_k8s_api::secrets::GATEWAY_SECRET.to_string(),
    );
    tokio::spawn(egress_gateway::cluster::run(
        client.clone(),
        table.clone(),
        operator_secret,
    ));
    let guard = Arc::new(egress_serve::auth::Guard::new(Arc::new(
        egress_serve::auth::kube::KubeReviewer::new(client.clone()),
    )));
    let metrics = Arc::new(egress_gateway::metrics::Metrics::new());
    let (demand, saying) = egress_gateway::demand::Demand::start(
        &format!("http://127.0.0.1:{api_port}"),
        None,
        "gateway-0",
        metrics.clone(),
    )
    .unwrap();
    tokio::spawn(saying);
    let gateway = Arc::new(
        egress_gateway::Gateway::new(
            table.clone(),
            guard,
            metrics.clone(),
            egress_gateway::Limits::default(),
        )
        .with_demand(demand),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = listener.local_addr().unwrap();
    tokio::spawn(egress_gateway::serve(listener, gateway));

    until(
        "the gateway's credential made",
        Duration::from_secs(60),
        || {
            !operator.is_finished()
                && d.objects().iter().any(|o| {
                    o["kind"] == "Secret"
                        && o["metadata"]["name"] == egress_k8s_api::secrets::GATEWAY_SECRET
                })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(members(&d).is_empty(), "asleep while no one crawls");

    let mut first_bytes = Vec::new();
    let mut asleep_after = Vec::new();
    for round in 0..ROUNDS {
        let t0 = Instant::now();
        let (gw, token) = (gw, token.clone());
        let (code, ttfb, body) =
            tokio::task::spawn_blocking(move || curl(gw, "crawlers.web", &token))
                .await
                .unwrap();
        assert_eq!(code, 200, "round {round}: {body}");
        assert!(body.contains("\"origin\""), "round {round}: {body}");
        first_bytes.push(ttfb);
        let served = Instant::now();
        // Within idleAfter and one refresh of the gateway's demand.
        let asleep = until(
            &format!("round {round}: the pool asleep again"),
            IDLE_AFTER + egress_control::demand::REFRESH,
            || members(&d).is_empty(),
        )
        .await;
        asleep_after.push(asleep.as_secs_f64());
        // And the gateway has seen it: the next round starts from a pool it knows is at zero.
        let web = egress_gateway::PoolKey::parse("crawlers/web").unwrap();
        until(
            &format!("round {round}: the gateway without members"),
            Duration::from_secs(10),
            || table.snapshot().pools.get(&web).is_none_or(Vec::is_empty),
        )
        .await;
        eprintln!(
            "round {round}: first byte after {ttfb:.2} s (round {:.2} s), asleep {:.2} s after it was served",
            served.duration_since(t0).as_secs_f64(),
            asleep.as_secs_f64()
        );
    }
    assert!(
        *started.lock().unwrap() >= ROUNDS as u32,
        "a Squid per cold start"
    );
    let text = metrics.encode();
    let served: u64 = text
        .lines()
        .filter(|l| {
            l.starts_with("egress_gateway_cold_starts_total{") && l.contains("result=\"served\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(served, ROUNDS as u64, "{text}");
    assert!(
        !text.contains("result=\"timeout\""),
        "no held request lost: {text}"
    );
    let stat = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2], v[v.len() - 1])
    };
    eprintln!(
        "first byte (min, median, max): {:?} s; asleep after served: {:?} s",
        stat(&first_bytes),
        stat(&asleep_after)
    );

    // A lease request finds the pool asleep: it waits while the pool wakes for it, and the
    // leased member is kept past idleAfter (the lease is demand) and serves its holder alone
    // through the gateway; released, the pool sleeps.
    let api = format!("http://127.0.0.1:{api_port}/v1/leases");
    let t0 = Instant::now();
    let granted = curl_json(
        "POST",
        &api,
        &token,
        &json!({"namespace": NS, "pool": "web", "count": 1, "mode": "Exclusive", "ttl": "10m"})
            .to_string(),
    );
    let waited = t0.elapsed();
    let id = granted["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{granted}"))
        .to_string();
    let leased = granted["proxies"][0]["name"].as_str().unwrap().to_string();
    until(
        "the gateway with the leased member",
        Duration::from_secs(10),
        || {
            table
                .snapshot()
                .pools
                .get(&egress_gateway::PoolKey::parse("crawlers/web").unwrap())
                .is_some_and(|v| !v.is_empty())
        },
    )
    .await;
    for _ in 0..3 {
        tokio::time::sleep(IDLE_AFTER).await;
        let (gw, token, user) = (gw, token.clone(), format!("crawlers.web-lease-{id}"));
        let (code, _, body) = tokio::task::spawn_blocking(move || curl(gw, &user, &token))
            .await
            .unwrap();
        assert_eq!(code, 200, "through the lease: {body}");
        assert_eq!(members(&d), vec![leased.clone()], "the leased member stays");
    }
    let released = curl_json("DELETE", &format!("{api}/{id}"), &token, "{}");
    assert!(released["released"] == id.as_str(), "{released}");
    let asleep = until(
        "the pool asleep once the lease is released",
        IDLE_AFTER + egress_control::demand::REFRESH,
        || members(&d).is_empty(),
    )
    .await;
    eprintln!(
        "lease from zero granted after {:.2} s; asleep {:.2} s after its release",
        waited.as_secs_f64(),
        asleep.as_secs_f64()
    );
    pods.abort();
    operator.abort();
}

/// curl's `method` of `url` with bearer `token` and JSON `body`: the JSON answer.
fn curl_json(method: &str, url: &str, token: &str, body: &str) -> serde_json::Value {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "90", "-X", method, "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .args(["-H", "Content-Type: application/json", "--data", body, url])
        .output()
        .expect("curl runs");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{method} {url}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
