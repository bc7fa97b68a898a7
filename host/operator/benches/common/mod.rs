//! What the operator's benches share: the operator's Context on the real kubernetes module
//! against an API server at a URL, and the process's memory.

use egress_control::egress::EgressChecker;
use egress_control::metrics::Metrics;
use egress_core::config::ProvidersConfig;
use egress_operator::context::{Context, Loaded};
use egress_runtime::capabilities::clock::ClockBackend;
use egress_runtime::capabilities::kube::real::RealKube;
use egress_runtime::{Backends, LoadOptions, Providers, Runtime, RuntimeOptions};
use kube::runtime::events::Reporter;
use std::path::Path;
use std::sync::Arc;

/// (VmRSS, VmHWM) of this process, in KiB.
pub fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The providers of `config` loaded as the operator loads them, their kube capability on
/// `client` (at `url`), the modules from the tests' shared cache; and the clock they run on.
pub async fn providers(
    client: &kube::Client,
    url: &str,
    config: &ProvidersConfig,
) -> (Providers, Arc<dyn ClockBackend>) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-module-cache");
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache),
        ..Default::default()
    })
    .unwrap();
    let backends = Backends {
        kube: Arc::new(RealKube::with_client(
            client.clone(),
            url.trim().to_string(),
        )),
        ..Backends::real()
    };
    let clock = backends.clock.clone();
    let providers = Providers::load(
        &runtime,
        config,
        LoadOptions {
            base_dir: Path::new("."),
            builtin: &egress_builtins::module_for_type,
            backends,
            recorder: None,
        },
    )
    .await
    .unwrap();
    (providers, clock)
}

/// The operator's Context for a bench, as `run` builds it.
pub fn context(
    client: &kube::Client,
    config: ProvidersConfig,
    providers: Providers,
    egress: Option<Arc<EgressChecker>>,
    metrics: Arc<Metrics>,
) -> Arc<Context> {
    Arc::new(Context::new(
        client.clone(),
        "bench".into(),
        Loaded {
            config: Arc::new(config),
            providers: Arc::new(providers),
            egress,
        },
        metrics,
        Reporter {
            controller: "egress-proxies".into(),
            instance: Some("bench".into()),
        },
    ))
}
