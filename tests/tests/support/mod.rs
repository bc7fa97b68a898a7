//! A simulated world with its providers loaded, as the dry-run builds it: what the tests that
//! drive the CLI's reconcile loop in-process share.

// Each test binary uses only part of it.
#![allow(dead_code, clippy::unwrap_used)]

use egress_control::world::{SimWorld, World};
use egress_core::config::ProvidersConfig;
use egress_runtime::{Backends, LoadOptions, PlanRecorder, Providers, Runtime, RuntimeOptions};
use std::path::Path;
use std::sync::Arc;

pub struct Sim {
    pub world: SimWorld,
    pub providers: Providers,
    pub recorder: Arc<PlanRecorder>,
    pub cfg: ProvidersConfig,
}

/// The world of `world_yaml` and the providers of `providers_yaml` on it, recording a plan;
/// modules compile into the test module cache.
pub async fn load(providers_yaml: &str, world_yaml: &str) -> Sim {
    let cfg = ProvidersConfig::from_yaml(providers_yaml).unwrap();
    let world = World::from_yaml(world_yaml).unwrap().build().unwrap();
    let (providers, recorder) = providers_on(&cfg, world.backends.clone()).await;
    Sim {
        world,
        providers,
        recorder,
        cfg,
    }
}

/// The providers of `cfg` on `backends`, recording a plan; modules compile into the test
/// module cache.
pub async fn providers_on(
    cfg: &ProvidersConfig,
    backends: Backends,
) -> (Providers, Arc<PlanRecorder>) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-module-cache");
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache),
        ..Default::default()
    })
    .unwrap();
    let recorder = Arc::new(PlanRecorder::new());
    let providers = Providers::load(
        &runtime,
        cfg,
        LoadOptions {
            base_dir: Path::new("."),
            builtin: &egress_builtins::module_for_type,
            backends,
            recorder: Some(recorder.clone()),
        },
    )
    .await
    .unwrap();
    (providers, recorder)
}

/// The dry-run of the files given, as `egress-proxies reconcile --dry-run [--for RUN_FOR]`
/// runs it, compiling into the test module cache.
pub async fn dry_run(
    proxies: &Path,
    providers: &Path,
    world: Option<&Path>,
    run_for: Option<std::time::Duration>,
) -> egress_proxies::reconcile::Report {
    use egress_proxies::Source;
    egress_proxies::run_reconcile(egress_proxies::ReconcileRequest {
        proxies: Source::File(proxies.into()),
        providers: Source::File(providers.into()),
        world: world.map(|w| Source::File(w.into())),
        dry_run: true,
        state: None,
        timeout: std::time::Duration::from_secs(600),
        max_rounds: egress_proxies::DEFAULT_MAX_ROUNDS,
        gc_grace: std::time::Duration::ZERO,
        concurrency: 1,
        run_for,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        runtime: RuntimeOptions {
            cache_dir: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-module-cache"),
            ),
            ..Default::default()
        },
    })
    .await
    .unwrap()
}
