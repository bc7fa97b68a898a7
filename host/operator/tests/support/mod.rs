//! What the operator's tests share: providers loaded as in a cluster, their Pods in the
//! API double.

use egress_core::config::ProvidersConfig;
use egress_runtime::capabilities::kube::RealKube;
use egress_runtime::world::World;
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
