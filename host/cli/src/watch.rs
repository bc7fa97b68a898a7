//! `reconcile --watch`: a run again on every change of its files, when a pool's decision
//! falls due and as often as the egress check looks, optionally serving the API.

use crate::error::CliError;
use crate::inputs::{Source, check_pools, load_config, parse_inputs};
use crate::reconcile::{self, Driver, Report, Time};
use crate::request::ReconcileRequest;
use crate::serve::{Serving, serve_api};
use crate::state;
use crate::wiring::{backends_for, checker_on, credentials_for, installation_of};
use egress_runtime::{PlanRecorder, Runtime};
use std::sync::Arc;
use std::time::Duration;

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

/// How long a watch waits before it looks at a steady fleet again when no egress check says.
pub const WATCH_RESYNC: Duration = Duration::from_secs(60);

/// `reconcile --watch`, serving the operator's HTTP API (`/v1/proxies`, `/v1/leases`,
/// `/metrics`, `/healthz`, `/readyz`) from its runs when `serving` says where, with leases
/// kept beside the state file ([`crate::leases`]). A run starts again when a pool's decision falls
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
