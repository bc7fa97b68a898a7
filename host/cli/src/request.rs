//! `reconcile` once: the request a command line makes, and its run to a report.

use crate::error::CliError;
use crate::inputs::{Source, check_pools, load_config, parse_inputs};
use crate::reconcile::{Driver, DriverOptions, Report, Time};
use crate::wiring::{backends_for, checker_on, credentials_for, installation_of, load_providers};
use crate::{dry_run, state};
use egress_runtime::capabilities::clock::ClockBackend;
use egress_runtime::{PlanRecorder, RuntimeOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub struct ReconcileRequest {
    pub proxies: Source,
    pub providers: Source,
    pub world: Option<Source>,
    pub dry_run: bool,
    pub state: Option<PathBuf>,
    pub timeout: Duration,
    pub max_rounds: u32,
    pub gc_grace: Duration,
    /// Proxies reconciled at once (real mode).
    pub concurrency: usize,
    /// A dry-run goes on this long in simulated time (`--for`).
    pub run_for: Option<Duration>,
    /// The most replicas a ProxyPool may ask for (`--max-replicas`).
    pub max_replicas: u32,
    pub runtime: RuntimeOptions,
}

/// The default for `--max-rounds`: generous for backoff sequences, small enough that a
/// dry-run that cannot settle ends quickly.
pub const DEFAULT_MAX_ROUNDS: u32 = 200;

impl ReconcileRequest {
    /// How the driver runs this request, going on `run_for` once steady (a dry-run).
    pub(crate) fn driver_options(
        &self,
        installation: String,
        run_for: Option<Duration>,
    ) -> DriverOptions {
        DriverOptions {
            installation,
            max_rounds: self.max_rounds,
            timeout: self.timeout,
            gc_grace: self.gc_grace,
            // A dry-run changes nothing, the state file included.
            state_path: if self.dry_run {
                None
            } else {
                self.state.clone()
            },
            concurrency: self.concurrency,
            run_for,
            leases: None,
            crawl: None,
        }
    }
}

/// Runs `reconcile`: returns the report; the caller renders it and picks the exit code.
pub async fn run_reconcile(req: ReconcileRequest) -> Result<Report, CliError> {
    let (proxies_text, proxies_what) = req.proxies.read()?;
    let inputs = parse_inputs(&proxies_text, &proxies_what)?;
    if req.run_for.is_some() && !req.dry_run {
        return Err(CliError::Input {
            what: "--for".into(),
            message: "runs simulated time forward: it needs --dry-run".into(),
        });
    }
    let (cfg, cfg_what) = load_config(&req.providers)?;
    check_pools(&inputs, &cfg, &proxies_what, req.max_replicas)?;
    let installation = installation_of(&cfg, &cfg_what, req.dry_run)?;
    let mut reach = backends_for(req.dry_run, req.world.as_ref(), &cfg, &inputs)?;
    // A dry-run only reads the state; a real run owns it until it ends.
    let _lock = match &req.state {
        Some(p) if !req.dry_run => Some(state::StateLock::acquire(p)?),
        _ => None,
    };
    let prior = match &req.state {
        Some(p) => state::StateFile::read(p)?,
        None => state::StateFile::default(),
    };
    let options = req.driver_options(installation, req.run_for);
    if let Some(world) = reach.world.take() {
        let providers = load_providers(
            &cfg,
            &cfg_what,
            &req.providers.dir(),
            reach.backends.clone(),
            None,
            req.runtime.clone(),
        )
        .await?;
        let out = dry_run::run_lanes(
            &world,
            &providers,
            Arc::new(cfg),
            &cfg_what,
            inputs,
            prior,
            options,
        )
        .await;
        std::thread::spawn(move || drop((providers, reach)));
        return out;
    }
    // A dry-run has a world and went through the lanes: this is a real run.
    let egress = checker_on(&cfg, &cfg_what, reach.sim_egress.as_ref(), &reach.backends)?;
    let backends = reach.backends;
    let recorder = Arc::new(PlanRecorder::new());
    let providers = load_providers(
        &cfg,
        &cfg_what,
        &req.providers.dir(),
        backends.clone(),
        Some(recorder.clone()),
        req.runtime.clone(),
    )
    .await?;
    let credentials = credentials_for(options.state_path.as_deref())?;
    let driver = Driver {
        providers: &providers,
        config: &cfg,
        recorder,
        time: Time::Real(backends.clock.clone() as Arc<dyn ClockBackend>),
        egress,
        credentials,
        options,
    };
    let out = driver
        .run_all(inputs.proxies, inputs.pools, prior)
        .await
        .map(|(r, _)| r);
    drop(driver);
    // Freeing a large run's sandboxes takes a good part of a second that the report does
    // not wait for: it happens on a thread of its own while the caller renders the report.
    std::thread::spawn(move || drop((providers, backends, cfg)));
    out
}
