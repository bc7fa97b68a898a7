//! What the operator's tests share: providers loaded as in a cluster, their Pods in the
//! API double.

use egress_control::world::World;
use egress_core::config::ProvidersConfig;
use egress_runtime::capabilities::kube::real::RealKube;
use egress_runtime::{Backends, LoadOptions, Providers, Runtime, RuntimeOptions};
use kube_double::Double;
use std::path::Path;
use std::sync::Arc;

/// The providers of `yaml`, loaded from the shared module cache; kube calls reach `d`, every
/// other backend is the default world's. Also the world's backends, for their clock.
#[allow(dead_code)]
pub async fn providers_on(d: &Double, yaml: &str) -> (ProvidersConfig, Providers) {
    providers_in(d, yaml, Path::new(".")).await
}

/// As [`providers_on`], with `module:` paths found in `base_dir`.
#[allow(dead_code)]
pub async fn providers_in(d: &Double, yaml: &str, base_dir: &Path) -> (ProvidersConfig, Providers) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache),
        ..Default::default()
    })
    .unwrap();
    let config = ProvidersConfig::from_yaml(yaml).unwrap();
    let world = World::default().build().unwrap();
    let backends = Backends {
        kube: Arc::new(RealKube::with_client(d.client(), d.url())),
        ..world.backends
    };
    let providers = Providers::load(
        &runtime,
        &config,
        LoadOptions {
            base_dir,
            builtin: &egress_builtins::module_for_type,
            backends,
            recorder: None,
        },
    )
    .await
    .unwrap();
    (config, providers)
}

/// The Events written to `d`, as (reason, note), in order.
#[allow(dead_code)]
pub fn events(d: &Double) -> Vec<(String, String)> {
    d.requests()
        .into_iter()
        .filter(|s| s.path.contains("/events") && s.method == "POST")
        .map(|s| {
            (
                s.body["reason"].as_str().unwrap_or("").to_string(),
                s.body["note"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// One HTTP/1.0 GET on loopback: (status code, body).
#[allow(dead_code)]
pub async fn get(addr: std::net::SocketAddr, target: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {target} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
    (code, body)
}

/// Debian's promtool (the `prometheus` package), or None with the reason printed; with
/// EGRESS_REQUIRE_REAL_BACKENDS=1 (set by .ci/run) its absence is a failure.
#[allow(dead_code)]
pub fn promtool() -> Option<std::path::PathBuf> {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("promtool".into());
    }
    let why = "promtool is not installed (apt-get install -y prometheus; .ci/run does)";
    assert!(
        std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() != Ok("1"),
        "EGRESS_REQUIRE_REAL_BACKENDS=1 but {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// One HTTP/1.0 GET on loopback with `headers`: (status code, response head, body).
#[allow(dead_code)]
pub async fn request(
    addr: std::net::SocketAddr,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("GET {target} HTTP/1.0\r\nHost: x\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out[9..12].parse().unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (code, head.to_string(), body.to_string())
}

/// As [`get`], presenting `token` as `Authorization: Bearer <token>`.
#[allow(dead_code)]
pub async fn get_as(addr: std::net::SocketAddr, target: &str, token: &str) -> (u16, String) {
    let auth = format!("Bearer {token}");
    let (code, _, body) = request(addr, target, &[("Authorization", &auth)]).await;
    (code, body)
}

/// The deploy's ClusterRole `name` (examples/deploy/rbac.yaml), created in `d`.
#[allow(dead_code)]
pub async fn deploy_cluster_role(d: &Double, name: &str) {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let role: ClusterRole = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .find_map(|v: serde_yaml::Value| {
            (v["kind"] == "ClusterRole" && v["metadata"]["name"] == name)
                .then(|| serde_yaml::from_value(v).unwrap())
        })
        .unwrap_or_else(|| panic!("no ClusterRole {name} in examples/deploy/rbac.yaml"));
    kube::Api::<ClusterRole>::all(d.client())
        .create(&Default::default(), &role)
        .await
        .unwrap();
}

/// Binds the ClusterRole `role` to the ServiceAccount `sa_namespace/sa`: with a RoleBinding
/// in `namespace`, or with None a ClusterRoleBinding.
#[allow(dead_code)]
pub async fn bind(d: &Double, role: &str, sa_namespace: &str, sa: &str, namespace: Option<&str>) {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    let name = format!("{role}-{sa_namespace}-{sa}");
    let binding = serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_namespace}],
    });
    match namespace {
        Some(ns) => {
            kube::Api::<RoleBinding>::namespaced(d.client(), ns)
                .create(
                    &Default::default(),
                    &serde_json::from_value(binding).unwrap(),
                )
                .await
                .unwrap();
        }
        None => {
            kube::Api::<ClusterRoleBinding>::all(d.client())
                .create(
                    &Default::default(),
                    &serde_json::from_value(binding).unwrap(),
                )
                .await
                .unwrap();
        }
    }
}

/// A guard that asks `d`'s API server (TokenReview, SubjectAccessReview).
#[allow(dead_code)]
pub fn kube_guard(d: &Double) -> Arc<egress_serve::auth::Guard> {
    Arc::new(egress_serve::auth::Guard::new(Arc::new(
        egress_serve::auth::kube::KubeReviewer::new(d.client()),
    )))
}
