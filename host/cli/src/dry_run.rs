//! A dry-run in lanes: the inputs dealt to lanes of providers that can never meet (see
//! [`crate::reconcile::lanes`]), each lane run on a thread and in a world of its own, and
//! their reports merged.

use crate::error::CliError;
use crate::inputs::Inputs;
use crate::reconcile::{self, Driver, DriverOptions, Report, Time};
use crate::state;
use crate::wiring::{build_world, checker_on};
use egress_control::world::World;
use egress_core::config::ProvidersConfig;
use egress_runtime::{PlanRecorder, Providers};
use std::sync::Arc;

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
pub(crate) async fn run_lanes(
    world: &World,
    providers: &Providers,
    cfg: Arc<ProvidersConfig>,
    cfg_what: &str,
    inputs: Inputs,
    prior: state::StateFile,
    options: DriverOptions,
) -> Result<Report, CliError> {
    let mut options = options;
    let started = egress_core::gc::parse_rfc3339(&world.start).unwrap_or(0);
    options.crawl = egress_control::crawl::Crawl::from_world(&world.targets, &world.crawl, started)
        .map_err(|message| CliError::Input {
            what: "world".into(),
            message,
        })?;
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
