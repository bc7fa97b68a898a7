#![doc = include_str!("../README.md")]

pub mod cli;
pub mod commands;
pub mod examples;
pub mod html;
pub mod leases;
pub mod output;
pub mod progress;
pub mod reconcile;
pub mod signals;
pub mod state;
pub mod telemetry;

pub use commands::{echo, gateway, provider};

use egress_control::world::World;
use egress_core::Proxy;
use egress_core::config::{ConfigError, ProvidersConfig};
use egress_runtime::capabilities::clock::ClockBackend;
use egress_runtime::{Backends, LoadOptions, PlanRecorder, Providers, Runtime, RuntimeOptions};
use reconcile::{Driver, DriverOptions, Report, Time};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{what}: {message}")]
    Input { what: String, message: String },
    #[error("{what}: {source}")]
    Config {
        what: String,
        #[source]
        source: ConfigError,
    },
    #[error("writing {what}: {message}")]
    Output { what: String, message: String },
    #[error("{0}")]
    Runtime(String),
}

/// Where the inputs of a run come from: files, or the examples embedded in the binary.
#[derive(Debug, Clone)]
pub enum Source {
    File(PathBuf),
    Embedded(&'static str, &'static str),
}

impl Source {
    fn read(&self) -> Result<(String, String), CliError> {
        match self {
            Source::File(p) => std::fs::read_to_string(p)
                .map(|t| (t, p.display().to_string()))
                .map_err(|e| CliError::Input {
                    what: p.display().to_string(),
                    message: e.to_string(),
                }),
            Source::Embedded(name, text) => Ok((text.to_string(), format!("embedded {name}"))),
        }
    }

    fn dir(&self) -> PathBuf {
        match self {
            Source::File(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
            Source::Embedded(..) => PathBuf::from("."),
        }
    }
}

/// What a proxies file holds: Proxies and ProxyPools.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub proxies: Vec<Proxy>,
    pub pools: Vec<egress_core::pool::ProxyPool>,
}

/// Parses a proxies file of Proxies only (see [`parse_inputs`]).
pub fn parse_proxies(text: &str, what: &str) -> Result<Vec<Proxy>, CliError> {
    let inputs = parse_inputs(text, what)?;
    if let Some(p) = inputs.pools.first() {
        return Err(CliError::Input {
            what: what.to_string(),
            message: format!(
                "ProxyPool {}/{} is not expected here",
                p.metadata.namespace, p.metadata.name
            ),
        });
    }
    Ok(inputs.proxies)
}

/// Parses a proxies file: one or more YAML documents, each a Proxy or a ProxyPool. Errors
/// name the document and the field.
pub fn parse_inputs(text: &str, what: &str) -> Result<Inputs, CliError> {
    let mut out: Vec<Proxy> = Vec::new();
    let mut pools: Vec<egress_core::pool::ProxyPool> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).map_err(|e| {
            CliError::Input {
                what: format!("{what} document {}", i + 1),
                message: e.to_string(),
            }
        })?;
        if value.is_null() {
            continue;
        }
        if value.get("kind").and_then(|k| k.as_str()) == Some(egress_core::pool::KIND) {
            let pool: egress_core::pool::ProxyPool = serde_path_to_error::deserialize(value)
                .map_err(|e| CliError::Input {
                    what: format!("{what} document {}", i + 1),
                    message: format!("{}: {}", e.path(), e.inner()),
                })?;
            let key = format!("{}/{}", pool.metadata.namespace, pool.metadata.name);
            if let Some(p) = egress_core::pool::validate(&pool).first() {
                return Err(CliError::Input {
                    what: format!("{what} document {} (ProxyPool {key})", i + 1),
                    message: p.clone(),
                });
            }
            if pools.iter().any(|o| {
                o.metadata.namespace == pool.metadata.namespace
                    && o.metadata.name == pool.metadata.name
            }) {
                return Err(CliError::Input {
                    what: format!("{what} document {}", i + 1),
                    message: format!("ProxyPool {key} appears twice"),
                });
            }
            pools.push(pool);
            continue;
        }
        let proxy: Proxy =
            serde_path_to_error::deserialize(value).map_err(|e| CliError::Input {
                what: format!("{what} document {}", i + 1),
                message: match egress_core::config::error_path(e.path()).as_str() {
                    "" => e.inner().to_string(),
                    path => format!("{path}: {}", e.inner()),
                },
            })?;
        let problems = egress_core::proxy::validate(&proxy);
        if let Some(p) = problems.first() {
            return Err(CliError::Input {
                what: format!("{what} document {} ({})", i + 1, proxy.key()),
                message: p.clone(),
            });
        }
        // The derived UID is a digest: worked out once here, not at every use.
        let mut proxy = proxy;
        if proxy.metadata.uid.is_none() {
            proxy.metadata.uid = Some(proxy.uid());
        }
        let key = proxy.key();
        if !seen.insert(key.clone()) {
            return Err(CliError::Input {
                what: format!("{what} document {}", i + 1),
                message: format!("Proxy {key} appears twice"),
            });
        }
        out.push(proxy);
    }
    Ok(Inputs {
        proxies: out,
        pools,
    })
}

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

fn load_config(src: &Source) -> Result<(ProvidersConfig, String), CliError> {
    let (text, what) = src.read()?;
    let mut cfg = ProvidersConfig::from_yaml(&text).map_err(|source| CliError::Config {
        what: what.clone(),
        source,
    })?;
    cfg.resolve_files(&src.dir());
    Ok((cfg, what))
}

/// The backends a run reaches: the real ones, or a simulated world with its virtual clock
/// and the egress check's simulated proxies.
struct RunBackends {
    backends: Backends,
    virtual_clock: Option<Arc<egress_runtime::capabilities::clock::VirtualClock>>,
    sim_egress: Option<Arc<egress_control::egress::SimEgress>>,
    /// A dry-run's world, which each lane builds again for itself.
    world: Option<World>,
}

/// The image URLs the Proxies and pools of a run name, for the world a config describes.
fn image_urls(inputs: &Inputs) -> Vec<String> {
    inputs
        .proxies
        .iter()
        .filter_map(|p| p.spec.placement.image.clone())
        .chain(inputs.pools.iter().flat_map(|p| {
            p.spec
                .placements
                .iter()
                .filter_map(|pl| pl.image.clone())
                .chain(p.spec.template.placement.image.clone())
        }))
        .collect()
}

/// A dry-run without a world file plans against the world the providers config describes.
fn backends_for(
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
fn build_world(world: &World) -> Result<egress_control::world::SimWorld, CliError> {
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
fn checker_on(
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

async fn load_providers(
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
fn installation_of(cfg: &ProvidersConfig, what: &str, dry_run: bool) -> Result<String, CliError> {
    match (&cfg.installation, dry_run) {
        (Some(i), _) => Ok(i.clone()),
        (None, true) => Ok("local".to_string()),
        (None, false) => Err(CliError::Input {
            what: what.to_string(),
            message: "installation: required without --dry-run: name this installation (for example `installation: my-laptop`), which is written on every instance it creates and is the only one whose orphans it deletes".to_string(),
        }),
    }
}

impl ReconcileRequest {
    /// How the driver runs this request, going on `run_for` once steady (a dry-run).
    fn driver_options(&self, installation: String, run_for: Option<Duration>) -> DriverOptions {
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
        }
    }
}

/// Checks each ProxyPool against the providers config it will run with and the run's bound
/// on replicas (`--max-replicas`): no more replicas than that, its placements name providers
/// the config has, and its rotation leaves a member time to serve. Errors name the pool and
/// the field.
pub fn check_pools(
    inputs: &Inputs,
    cfg: &ProvidersConfig,
    what: &str,
    max_replicas: u32,
) -> Result<(), CliError> {
    let providers: Vec<String> = cfg.providers.iter().map(|p| p.name.clone()).collect();
    let startup_timeout = cfg
        .egress_check
        .as_ref()
        .map(|c| egress_core::egress::Settings::from_config(c).startup_timeout);
    for pool in &inputs.pools {
        let problems = egress_core::pool::validate_in(
            pool,
            egress_core::pool::Environment {
                providers: &providers,
                startup_timeout,
                max_replicas,
            },
        );
        if let Some(p) = problems.first() {
            return Err(CliError::Input {
                what: format!(
                    "{what} (ProxyPool {}/{})",
                    pool.metadata.namespace, pool.metadata.name
                ),
                message: p.clone(),
            });
        }
    }
    Ok(())
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
        let out = run_lanes(
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

/// Where a real run keeps its Proxies' credentials: the file beside its state file, or,
/// without one, memory (random, lost with the run). A dry-run derives them
/// ([`egress_control::credential_store::SimulatedCredentials`]).
fn credentials_for(
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

/// What `reconcile --watch --listen` runs with: the board its runs publish to, the
/// credentials file it shares with them, and the server task.
struct Api {
    board: Arc<leases::Board>,
    credentials: Arc<dyn egress_control::credential_store::CredentialSource>,
    server: Server,
}

/// Starts serving the API of `reconcile --watch --listen` over `state`.
fn serve_api(
    req: &ReconcileRequest,
    serving: Serving,
    state: &state::StateFile,
) -> Result<Api, CliError> {
    use egress_control::credential_store::FileCredentials;
    let listen = |message: &str| CliError::Input {
        what: "--listen".into(),
        message: message.into(),
    };
    if req.dry_run {
        return Err(listen(
            "serves the proxies of real runs: it cannot go with --dry-run",
        ));
    }
    let Some(state_path) = req.state.as_deref() else {
        return Err(listen(
            "needs --state: leases are kept beside the state file",
        ));
    };
    let tokens =
        egress_serve::auth::tokens::TokensFile::load(&serving.api_tokens).map_err(|e| {
            CliError::Input {
                what: "--api-tokens".into(),
                message: e.to_string(),
            }
        })?;
    // The runs and the API read one store: a credential a run makes is handed out at once.
    let files = Arc::new(
        FileCredentials::open(FileCredentials::path_for(state_path)).map_err(CliError::Runtime)?,
    );
    let metrics = Arc::new(egress_control::metrics::Metrics::new());
    let board = Arc::new(leases::Board::open(
        state_path,
        state,
        files.clone(),
        egress_time::now::system_clock(),
    )?);
    let ready = Arc::new(egress_control::api::Readiness::default());
    ready.set(true);
    let tokens = Arc::new(tokens);
    let guard = Arc::new(egress_serve::auth::Guard::new(tokens.clone()));
    let api = Arc::new(egress_control::api::Api {
        metrics: metrics.clone(),
        ready,
        source: board.clone(),
        guard: guard.clone(),
        leases: Some(Arc::new(egress_control::leases::Leases::with_store(
            board.clone(),
            egress_time::now::system_clock(),
            metrics.clone(),
        ))),
    });
    let transport = serving
        .tls
        .start(TOKENS_RELOAD, "the API")
        .map_err(|e| CliError::Input {
            what: "--tls-cert".into(),
            message: e.to_string(),
        })?;
    // Served, and the tokens file read again every few seconds (a token added or revoked
    // takes effect without a restart), until the watch ends.
    let server = Server(tokio::spawn(async move {
        tokio::join!(
            egress_control::api::serve_over(
                serving.listener,
                api,
                egress_serve::Limits::default(),
                transport,
            ),
            tokens.watch(guard, TOKENS_RELOAD)
        );
    }));
    Ok(Api {
        board,
        credentials: files,
        server,
    })
}

/// A dry-run's inputs dealt to its lanes: each lane's provider names, Proxies and pools, and
/// stored statuses; and the pools' order in the input, which the merged report keeps.
struct LaneInputs {
    lanes: Vec<Vec<String>>,
    parts: Vec<Inputs>,
    priors: Vec<state::StateFile>,
    pool_order: Vec<String>,
}

/// Lanes of the providers (see [`reconcile::lanes::partition`]), and what each one plans.
fn deal_to_lanes(providers: &Providers, inputs: Inputs, prior: state::StateFile) -> LaneInputs {
    let pool_key =
        |p: &egress_core::pool::ProxyPool| format!("{}/{}", p.metadata.namespace, p.metadata.name);
    let placements = |p: &egress_core::pool::ProxyPool| -> Vec<String> {
        p.spec
            .placements
            .iter()
            .map(|pl| pl.provider.clone())
            .collect()
    };
    let pool_providers: std::collections::BTreeMap<String, Vec<String>> = inputs
        .pools
        .iter()
        .map(|p| (pool_key(p), placements(p)))
        .collect();
    let reaches: Vec<reconcile::lanes::ProviderBackends<'_>> = providers
        .iter()
        .map(|p| reconcile::lanes::ProviderBackends {
            provider: &p.name,
            keys: p.reaches(),
        })
        .collect();
    let links = inputs
        .proxies
        .iter()
        .map(|p| vec![p.spec.provider.as_str()])
        .chain(
            pool_providers
                .values()
                .map(|names| names.iter().map(String::as_str).collect()),
        )
        .chain(prior.proxies.values().map(|s| {
            // A stored Proxy of a pool still in the file is that pool's to decide over.
            let namespace = s.key.split_once('/').map_or("", |(n, _)| n);
            let pool = s
                .pool
                .as_ref()
                .and_then(|p| pool_providers.get(&format!("{namespace}/{p}")));
            std::iter::once(s.provider.as_str())
                .chain(pool.into_iter().flatten().map(String::as_str))
                .collect()
        }));
    let mut lanes = reconcile::lanes::partition(&reaches, links);
    if lanes.is_empty() {
        // Nothing configured and nothing to do: one empty lane still reports the run.
        lanes.push(Vec::new());
    }
    let lane_of: std::collections::BTreeMap<&str, usize> = lanes
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), i)))
        .collect();
    let lane = |provider: &str| lane_of.get(provider).copied().unwrap_or(0);

    let pool_order: Vec<String> = inputs.pools.iter().map(pool_key).collect();
    let mut parts: Vec<Inputs> = lanes.iter().map(|_| Inputs::default()).collect();
    let mut priors: Vec<state::StateFile> = lanes
        .iter()
        .map(|_| state::StateFile {
            installation: prior.installation.clone(),
            ..Default::default()
        })
        .collect();
    let mut pool_lane = std::collections::BTreeMap::new();
    for pool in inputs.pools {
        let i = pool
            .spec
            .placements
            .first()
            .map_or(0, |p| lane(&p.provider));
        pool_lane.insert(pool_key(&pool), i);
        parts[i].pools.push(pool);
    }
    for proxy in inputs.proxies {
        parts[lane(&proxy.spec.provider)].proxies.push(proxy);
    }
    for (key, stored) in prior.proxies {
        priors[lane(&stored.provider)].proxies.insert(key, stored);
    }
    for (key, stored) in prior.pools {
        let i = pool_lane.get(&key).copied().unwrap_or(0);
        priors[i].pools.insert(key, stored);
    }

    LaneInputs {
        lanes,
        parts,
        priors,
        pool_order,
    }
}

/// A dry-run in lanes ([`reconcile::lanes`]): each lane's providers bound to a world of their
/// own, built from the one world file, the lanes run at once and their reports merged. Each
/// lane's plan depends on nothing but its own inputs, so the merged plan is the same on every
/// run however the lanes are scheduled.
async fn run_lanes(
    world: &World,
    providers: &Providers,
    cfg: Arc<ProvidersConfig>,
    cfg_what: &str,
    inputs: Inputs,
    prior: state::StateFile,
    options: DriverOptions,
) -> Result<Report, CliError> {
    let LaneInputs {
        lanes,
        parts,
        priors,
        pool_order,
    } = deal_to_lanes(providers, inputs, prior);
    let mut running = Vec::new();
    for ((names, part), prior) in lanes.iter().zip(parts).zip(priors) {
        let sim = build_world(world)?;
        let recorder = Arc::new(PlanRecorder::new());
        let own = providers
            .rebound(
                names.iter().map(String::as_str),
                &sim.backends,
                Some(recorder.clone()),
            )
            .map_err(|message| CliError::Input {
                what: cfg_what.to_string(),
                message,
            })?;
        let egress = checker_on(&cfg, cfg_what, Some(&sim.egress), &sim.backends)?;
        let cfg = cfg.clone();
        let options = options.clone();
        // A thread and a runtime of its own per lane: its sandboxes, its world and what it
        // allocates stay on one thread, so two lanes never free each other's memory or wait on
        // each other's allocator arena (with the lanes as tasks of one runtime, moving between
        // its workers, 10,000 Proxies took 4.1-4.3 s).
        let (done, report) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("lane-{}", running.len()))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = done.send(Err(CliError::Runtime(format!(
                            "a dry-run lane's runtime: {e}"
                        ))));
                        return;
                    }
                };
                let out = rt.block_on(async {
                    let driver = Driver {
                        providers: &own,
                        config: &cfg,
                        recorder,
                        time: Time::Virtual(sim.clock.clone()),
                        egress,
                        credentials: Arc::new(
                            egress_control::credential_store::SimulatedCredentials::default(),
                        ),
                        options,
                    };
                    driver
                        .run_all(part.proxies, part.pools, prior)
                        .await
                        .map(|(r, _)| r)
                });
                let _ = done.send(out);
                // Freeing a large lane's world (every simulated object) and its sandboxes
                // takes a good part of a second, which the report does not wait for.
                drop((own, sim));
                drop(rt);
            })
            .map_err(|e| CliError::Runtime(format!("starting a dry-run lane: {e}")))?;
        running.push(report);
    }
    let mut reports = Vec::with_capacity(running.len());
    for lane in running {
        let report = lane
            .await
            .map_err(|_| CliError::Runtime("a dry-run lane stopped before it reported".into()))??;
        reports.push(report);
    }
    Ok(Report::merge(reports, &pool_order))
}

/// One provider's health, for `check`.
#[derive(Debug, serde::Serialize)]
pub struct CheckReport {
    pub provider: String,
    #[serde(rename = "type")]
    pub type_name: String,
    /// The sha256 of the module serving it.
    pub module: String,
    pub targets: Vec<egress_core::TargetStatus>,
}

pub async fn run_check(
    providers_src: Source,
    dry_run: bool,
    world: Option<Source>,
    runtime: RuntimeOptions,
) -> Result<Vec<CheckReport>, CliError> {
    let (cfg, what) = load_config(&providers_src)?;
    let backends = backends_for(dry_run, world.as_ref(), &cfg, &Inputs::default())?.backends;
    let providers =
        load_providers(&cfg, &what, &providers_src.dir(), backends, None, runtime).await?;
    let mut out = Vec::new();
    for p in providers.iter() {
        out.push(CheckReport {
            provider: p.name.clone(),
            type_name: p.type_name.clone(),
            module: p.module.digest.clone(),
            targets: p.check().await,
        });
    }
    Ok(out)
}

/// `reconcile --watch`: reconciles, then again whenever the proxies file, the providers config
/// or a module it names changes, until `stop` resolves. Each run's report goes to `report`; a
/// refused provider version goes to `refused` and the old one keeps serving.
pub async fn run_reconcile_watch(
    req: ReconcileRequest,
    interval: Duration,
    report: impl FnMut(&Report),
    refused: impl FnMut(&str),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    run_reconcile_watch_serving(req, interval, None, report, refused, stop).await
}

/// How often `reconcile --watch --listen` reads its tokens file again.
pub const TOKENS_RELOAD: Duration = Duration::from_secs(2);

/// How long a watch waits before it looks at a steady fleet again when no egress check says.
pub const WATCH_RESYNC: Duration = Duration::from_secs(60);

/// `reconcile --watch --listen`: where the API is served, and who may call it.
pub struct Serving {
    pub listener: tokio::net::TcpListener,
    /// The named tokens of callers (`--api-tokens`), as the operator reads them out of a
    /// cluster.
    pub api_tokens: PathBuf,
    /// TLS, or plain text where asked for by name.
    pub tls: egress_serve::tls::Mode,
}

/// Stops the API server when the watch ends.
struct Server(tokio::task::JoinHandle<()>);

impl Drop for Server {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `reconcile --watch`, serving the operator's HTTP API (`/v1/proxies`, `/v1/leases`,
/// `/metrics`, `/healthz`, `/readyz`) from its runs when `serving` says where, with leases
/// kept beside the state file ([`leases`]). A run starts again when a pool's decision falls
/// due (a rotation, a drain's end) and when a release or a cordon lets a drain end sooner.
pub async fn run_reconcile_watch_serving(
    req: ReconcileRequest,
    interval: Duration,
    serving: Option<Serving>,
    mut report: impl FnMut(&Report),
    mut refused: impl FnMut(&str),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    let (Source::File(proxies_path), Source::File(providers_path)) = (&req.proxies, &req.providers)
    else {
        return Err(CliError::Input {
            what: "--watch".into(),
            message: "needs -f and --providers files to watch".into(),
        });
    };
    // The world of a watched dry-run is what the files describe when the watch starts.
    let (initial_cfg, _) = load_config(&req.providers)?;
    let initial_inputs = std::fs::read_to_string(proxies_path)
        .ok()
        .and_then(|t| parse_inputs(&t, "").ok())
        .unwrap_or_default();
    let reach = backends_for(
        req.dry_run,
        req.world.as_ref(),
        &initial_cfg,
        &initial_inputs,
    )?;
    let recorder = Arc::new(PlanRecorder::new());
    let runtime =
        Runtime::new(req.runtime.clone()).map_err(|e| CliError::Runtime(e.to_string()))?;
    let reloader = egress_runtime::Reloader::new(
        runtime,
        providers_path.clone(),
        reach.backends.clone(),
        Some(recorder.clone()),
        egress_builtins::module_for_type,
    )
    .await
    .map_err(|source| CliError::Config {
        what: providers_path.display().to_string(),
        source,
    })?;
    // Owned for as long as the watch runs (a dry-run only reads it).
    let _lock = match &req.state {
        Some(p) if !req.dry_run => Some(state::StateLock::acquire(p)?),
        _ => None,
    };
    let mut state = match &req.state {
        Some(p) => state::StateFile::read(p)?,
        None => state::StateFile::default(),
    };
    tokio::pin!(stop);
    // A changed proxies file is acted on once two polls in a row read the same text.
    let mut proxies_file = egress_core::settle::Settle::default();
    // One store for every pass, so a Proxy keeps its credential from pass to pass.
    let mut credentials: Arc<dyn egress_control::credential_store::CredentialSource> =
        if req.dry_run {
            Arc::new(egress_control::credential_store::SimulatedCredentials::default())
        } else {
            credentials_for(req.state.as_deref())?
        };
    let (board, _server) = match serving {
        Some(s) => {
            let api = serve_api(&req, s, &state)?;
            credentials = api.credentials;
            (Some(api.board), Some(api.server))
        }
        None => (None, None),
    };
    // A pass is due again without a change of the files: a pool's decision fell due, or the
    // API released a lease a drain waits for.
    let mut next_due_ms: Option<u64> = None;
    let mut again = false;
    loop {
        // An unreadable file (mid-rename, removed) is refused, never read as "no Proxies".
        let read = std::fs::read_to_string(proxies_path).map_err(|e| e.to_string());
        let changed_proxies = proxies_file.observe(read);
        let mut swapped = false;
        if let Some(out) = reloader.poll().await {
            if let Some(e) = &out.config_error {
                refused(&format!("providers config refused: {e}"));
            }
            for r in &out.rejected {
                refused(&format!("provider {} refused: {}", r.provider, r.error));
            }
            swapped = !out.swapped.is_empty() || !out.removed.is_empty();
        }
        if !req.dry_run && next_due_ms.is_some_and(|at| reach.backends.clock.now_millis() >= at) {
            next_due_ms = None;
            again = true;
        }
        let rerun = swapped || std::mem::take(&mut again);
        let text =
            match changed_proxies.or_else(|| rerun.then(|| proxies_file.current().cloned())?) {
                Some(Ok(text)) => text,
                Some(Err(why)) => {
                    refused(&format!(
                        "proxies refused: cannot read {}: {why}",
                        proxies_path.display()
                    ));
                    continue;
                }
                None => {
                    tokio::select! {
                        _ = &mut stop => return Ok(()),
                        _ = tokio::time::sleep(interval) => {}
                        () = reconcile::board_changed(board.as_deref()) => again = true,
                    }
                    continue;
                }
            };
        match parse_inputs(&text, &proxies_path.display().to_string()).and_then(|inputs| {
            check_pools(
                &inputs,
                &reloader.config(),
                &proxies_path.display().to_string(),
                req.max_replicas,
            )
            .map(|()| inputs)
        }) {
            Ok(inputs) => {
                let providers = reloader.current();
                let cfg = reloader.config();
                let installation =
                    match installation_of(&cfg, &providers_path.display().to_string(), req.dry_run)
                    {
                        Ok(i) => i,
                        Err(e) => {
                            refused(&format!("providers config refused: {e}"));
                            tokio::select! {
                                _ = &mut stop => return Ok(()),
                                _ = tokio::time::sleep(interval) => {}
                            }
                            continue;
                        }
                    };
                let time = match &reach.virtual_clock {
                    Some(c) => Time::Virtual(c.clone()),
                    None => Time::Real(reach.backends.clock.clone()),
                };
                let egress = match checker_on(
                    &cfg,
                    &providers_path.display().to_string(),
                    reach.sim_egress.as_ref(),
                    &reach.backends,
                ) {
                    Ok(c) => c,
                    Err(e) => {
                        refused(&format!("providers config refused: {e}"));
                        tokio::select! {
                            _ = &mut stop => return Ok(()),
                            _ = tokio::time::sleep(interval) => {}
                        }
                        continue;
                    }
                };
                // Between passes a steady fleet is looked at again as often as the egress
                // check would look at it (a proxy that died since is replaced and leaves
                // discovery), or every minute without one.
                let resync = egress
                    .as_ref()
                    .map_or(WATCH_RESYNC, |c| c.settings().interval);
                let driver = Driver {
                    providers: &providers,
                    config: &cfg,
                    recorder: recorder.clone(),
                    time,
                    egress,
                    credentials: credentials.clone(),
                    options: reconcile::DriverOptions {
                        leases: board.clone(),
                        ..req.driver_options(installation, None)
                    },
                };
                // A stop ends the watch at once, in the middle of a run too: each change the
                // run made is in the state's journal already, and the next run adopts what
                // was being created, as after a crash.
                let run = driver.run_all(inputs.proxies, inputs.pools, std::mem::take(&mut state));
                let (r, next) = tokio::select! {
                    out = run => out?,
                    () = &mut stop => return Ok(()),
                };
                state = next;
                let now = reach.backends.clock.now_millis();
                // A pass that ended at its deadline not steady goes on at once.
                next_due_ms = Some(if r.steady {
                    r.next_due_ms
                        .unwrap_or(u64::MAX)
                        .min(now.saturating_add(resync.as_millis() as u64))
                } else {
                    now
                });
                report(&r);
            }
            Err(e) => refused(&format!("proxies refused: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn message(text: &str) -> String {
        match parse_proxies(text, "p.yaml") {
            Err(CliError::Input { message, .. }) => message,
            other => panic!("{other:?}"),
        }
    }

    /// A relative `egressCheck.tls.caFile` is found beside the providers file, as its
    /// modules are, whatever directory the process runs in; an absolute one stays.
    #[test]
    fn a_relative_ca_file_is_found_beside_the_providers_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("providers.yaml");
        let block = |ca: &str| {
            format!(
                "egressCheck: {{urls: ['http://198.51.100.1/', 'https://198.51.100.1/'], tls: {{caFile: {ca}}}}}\nproviders: []\n"
            )
        };
        let ca_of = |cfg: &ProvidersConfig| {
            cfg.egress_check
                .as_ref()
                .unwrap()
                .tls
                .as_ref()
                .unwrap()
                .ca_file
                .clone()
                .unwrap()
        };
        std::fs::write(&path, block("certs/ca.pem")).unwrap();
        let (cfg, _) = load_config(&Source::File(path.clone())).unwrap();
        assert_eq!(
            ca_of(&cfg),
            dir.path().join("certs/ca.pem").display().to_string()
        );
        std::fs::write(&path, block("/etc/echo/ca.pem")).unwrap();
        let (cfg, _) = load_config(&Source::File(path)).unwrap();
        assert_eq!(ca_of(&cfg), "/etc/echo/ca.pem");
    }

    /// A document that is not a manifest at all is named without a path (not `.`), a field by
    /// its path, and a key spelt `.` as itself.
    #[test]
    fn parse_errors_name_the_field_or_nothing_for_the_document() {
        assert_eq!(
            message("- a\n"),
            "invalid type: sequence, expected struct Proxy"
        );
        let m = message(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: p}\nspec: {provider: p, port: -1}\n",
        );
        assert!(m.starts_with("spec.port: "), "{m}");
        let m = message("'.': x\n");
        assert!(m.starts_with(".: unknown field `.`"), "{m}");
    }
}
