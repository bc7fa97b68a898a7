//! What a run is wired to: its backends (real, or a simulated world), the egress check, the
//! provider modules loaded over them, the installation it sweeps by and where its credentials
//! are kept.

use crate::error::CliError;
use crate::inputs::{Inputs, Source, image_urls};
use egress_control::world::World;
use egress_core::config::ProvidersConfig;
use egress_runtime::{Backends, LoadOptions, PlanRecorder, Providers, Runtime, RuntimeOptions};
use std::path::Path;
use std::sync::Arc;

/// The backends a run reaches: the real ones, or a simulated world with its virtual clock
/// and the egress check's simulated proxies.
pub(crate) struct RunBackends {
    pub(crate) backends: Backends,
    pub(crate) virtual_clock: Option<Arc<egress_runtime::capabilities::clock::VirtualClock>>,
    pub(crate) sim_egress: Option<Arc<egress_control::egress::SimEgress>>,
    /// A dry-run's world, which each lane builds again for itself.
    pub(crate) world: Option<World>,
}

/// A dry-run without a world file plans against the world the providers config describes.
pub(crate) fn backends_for(
    dry_run: bool,
    world: Option<&Source>,
    cfg: &ProvidersConfig,
    inputs: &Inputs,
) -> Result<RunBackends, CliError> {
    if !dry_run {
        return Ok(RunBackends {
            backends: Backends::real(),
            virtual_clock: None,
            sim_egress: None,
            world: None,
        });
    }
    let world = match world {
        Some(src) => {
            let (text, what) = src.read()?;
            let mut world =
                World::from_yaml(&text).map_err(|source| CliError::Config { what, source })?;
            world.add_config(cfg, &image_urls(inputs));
            world
        }
        None => World::for_config(cfg, &image_urls(inputs)),
    };
    let sim = build_world(&world)?;
    Ok(RunBackends {
        backends: sim.backends,
        virtual_clock: Some(sim.clock),
        sim_egress: Some(sim.egress),
        world: Some(world),
    })
}

/// A dry-run's simulated backends: the world's, with the Example Cloud double answering at its
/// own host beside the Compute Engine one, so a module written against the provider template's
/// API (examples/provider-template, providers-polyglot/) plans like the built-in types.
pub(crate) fn build_world(world: &World) -> Result<egress_control::world::SimWorld, CliError> {
    let mut sim = world.build().map_err(|source| CliError::Config {
        what: "world".into(),
        source,
    })?;
    sim.backends.http = Arc::new(egress_conformance::sim::ExampleCloudBeside::new(
        sim.backends.http.clone(),
        sim.backends.clock.clone(),
    ));
    Ok(sim)
}

/// The egress check against `sim` (a dry-run's simulated proxies) or, without one, through
/// the network, on the clock of `backends`. Through the network, each finished check wakes
/// its Proxy's next step (see `Driver::run_concurrent`).
pub(crate) fn checker_on(
    cfg: &ProvidersConfig,
    what: &str,
    sim: Option<&Arc<egress_control::egress::SimEgress>>,
    backends: &Backends,
) -> Result<Option<Arc<egress_control::egress::EgressChecker>>, CliError> {
    let wiring = egress_control::egress::Wiring {
        fleet: Arc::default(),
        wakes: Arc::default(),
        observer: None,
    };
    egress_control::egress::checker_for(cfg, sim, backends.clock.clone(), wiring).map_err(
        |message| CliError::Input {
            what: what.to_string(),
            message,
        },
    )
}

pub(crate) async fn load_providers(
    cfg: &ProvidersConfig,
    what: &str,
    dir: &Path,
    backends: Backends,
    recorder: Option<Arc<PlanRecorder>>,
    opts: RuntimeOptions,
) -> Result<Providers, CliError> {
    let runtime = Runtime::new(opts).map_err(|e| CliError::Runtime(e.to_string()))?;
    Providers::load(
        &runtime,
        cfg,
        LoadOptions {
            base_dir: dir,
            builtin: &egress_builtins::module_for_type,
            backends,
            recorder,
        },
    )
    .await
    .map_err(|source| CliError::Config {
        what: what.to_string(),
        source,
    })
}

/// The installation identity a run writes on instances and sweeps by. A dry-run may go
/// without one (`local`); a real run must name it, or two users against one project or
/// hypervisor would collect each other's instances.
pub(crate) fn installation_of(
    cfg: &ProvidersConfig,
    what: &str,
    dry_run: bool,
) -> Result<String, CliError> {
    match (&cfg.installation, dry_run) {
        (Some(i), _) => Ok(i.clone()),
        (None, true) => Ok("local".to_string()),
        (None, false) => Err(CliError::Input {
            what: what.to_string(),
            message: "installation: required without --dry-run: name this installation (for example `installation: my-laptop`), which is written on every instance it creates and is the only one whose orphans it deletes".to_string(),
        }),
    }
}

/// Where a real run keeps its Proxies' credentials: the file beside its state file, or,
/// without one, memory (random, lost with the run). A dry-run derives them
/// ([`egress_control::credential_store::SimulatedCredentials`]).
pub(crate) fn credentials_for(
    state: Option<&Path>,
) -> Result<Arc<dyn egress_control::credential_store::CredentialSource>, CliError> {
    use egress_control::credential_store::{FileCredentials, MemoryCredentials};
    Ok(match state {
        Some(path) => Arc::new(
            FileCredentials::open(FileCredentials::path_for(path)).map_err(CliError::Runtime)?,
        ),
        None => Arc::new(MemoryCredentials::default()),
    })
}
