//! `reconcile` (also what the binary does with no command): one run, or `--watch` that runs
//! again on every change and may serve the API from its runs.

use super::{failed, source, world};
use crate::cli::{Format, ReconcileArgs};
use crate::progress::{Progress, ProgressMode};
use crate::{examples, output};
use egress_runtime::RuntimeOptions;
use std::io::IsTerminal;
use std::process::ExitCode;

/// What `egress-proxies` with no command runs: a dry-run of the embedded examples.
pub fn embedded_dry_run() -> ReconcileArgs {
    ReconcileArgs {
        file: None,
        providers: None,
        world: None,
        dry_run: true,
        output: Format::Text,
        state: None,
        timeout: std::time::Duration::from_secs(600),
        max_rounds: crate::request::DEFAULT_MAX_ROUNDS,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        gc_grace: std::time::Duration::from_secs(300),
        concurrency: crate::reconcile::DEFAULT_CONCURRENCY,
        run_for: None,
        watch: false,
        listen: None,
        api_tokens: None,
        quotas: None,
        tls: Default::default(),
        audit: crate::cli::AuditArgs {
            audit_log: None,
            audit_max_bytes: 100 * 1024 * 1024,
            audit_keep: 5,
        },
        progress: ProgressMode::Auto,
    }
}

/// Runs `reconcile` with `progress` on stderr (a real run's), until `stop` for a watch: exit
/// code 0 when steady, 2 when not, 1 on an error.
pub async fn command(
    a: ReconcileArgs,
    progress: &Progress,
    stop: impl std::future::Future<Output = ()>,
) -> ExitCode {
    let all_embedded = a.file.is_none() && a.providers.is_none();
    let world = world(a.world, all_embedded);
    let dry_run = a.dry_run;
    // A dry-run is over in moments and its stderr is part of what tests compare.
    if !dry_run {
        let term = std::env::var("TERM").ok();
        progress.start(crate::progress::resolve(
            a.progress,
            std::io::stderr().is_terminal(),
            term.as_deref(),
        ));
    }
    let req = crate::request::ReconcileRequest {
        proxies: source(a.file, examples::proxies),
        providers: source(a.providers, examples::providers),
        world,
        dry_run,
        state: a.state,
        timeout: a.timeout,
        max_rounds: a.max_rounds,
        gc_grace: a.gc_grace,
        concurrency: a.concurrency,
        run_for: a.run_for,
        max_replicas: a.max_replicas,
        runtime: RuntimeOptions::default(),
    };
    if a.watch {
        let format = a.output;
        let audit = a.audit.sink();
        let serving = match (a.listen, a.api_tokens) {
            (Some(addr), Some(api_tokens)) => {
                let tls = match a.tls.mode("--listen") {
                    Ok(m) => m,
                    Err(e) => return failed(e),
                };
                // The API's backlog (4,096), not bind's 128: a burst of crawlers
                // would otherwise wait out SYN retransmissions.
                match egress_serve::listen(addr) {
                    Ok(listener) => {
                        let at = listener.local_addr().unwrap_or(addr);
                        eprintln!("serving the API on {}://{at}", tls.scheme());
                        Some(crate::serve::Serving {
                            listener,
                            api_tokens,
                            tls,
                            audit: audit.clone(),
                            quotas: a.quotas.clone(),
                        })
                    }
                    Err(e) => return failed(format!("--listen {addr}: {e}")),
                }
            }
            _ => None,
        };
        let watched = crate::watch::run_reconcile_watch_serving(
            req,
            std::time::Duration::from_millis(500),
            serving,
            |report| progress.suspend(|| print!("{}", output::reconcile(report, format, dry_run))),
            |why| progress.suspend(|| eprintln!("{why}")),
            stop,
        )
        .await;
        progress.stop();
        return super::exit(watched);
    }
    let outcome = crate::request::run_reconcile(req).await;
    progress.stop();
    match outcome {
        Ok(report) => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let written = output::write_reconcile(&mut out, &report, a.output, dry_run)
                .and_then(|()| std::io::Write::flush(&mut out));
            drop(out);
            if let Err(e) = written {
                return failed(format!("writing the report: {e}"));
            }
            let steady = report.steady;
            if steady {
                // The process exits next: freeing every Proxy's report first would
                // only add to a large run's time.
                std::mem::forget(report);
                ExitCode::SUCCESS
            } else {
                eprintln!("{}", output::not_steady(&report));
                ExitCode::from(2)
            }
        }
        Err(e) => failed(e),
    }
}
