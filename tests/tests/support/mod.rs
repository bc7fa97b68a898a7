//! A simulated world with its providers loaded, as the dry-run builds it: what the tests that
//! drive the CLI's reconcile loop in-process share.

// Each test binary uses only part of it.
#![allow(dead_code, clippy::unwrap_used)]

use egress_core::config::ProvidersConfig;
use egress_runtime::world::{SimWorld, World};
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
