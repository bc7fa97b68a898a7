//! The `egress-proxies` binary: argument parsing and wiring only.

use clap::Parser;
use egress_proxies::cli::{Cli, Command, Doctor, Format, ProviderCmd, ReconcileArgs};
use egress_proxies::progress::{Progress, ProgressMode};
use egress_proxies::{Source, examples, output, telemetry};
use egress_runtime::RuntimeOptions;
use std::io::IsTerminal;
use std::process::ExitCode;

/// Completes on SIGINT (Ctrl-C). The handler is installed here, at once: `ctrl_c()` installs
/// its own only when first polled, and a SIGINT that came before that (just after a server
/// said it listens) would kill the process instead of stopping it cleanly.
fn interrupted() -> impl std::future::Future<Output = ()> {
    let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    async move {
        match signal {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Completes on SIGINT or SIGTERM (what Kubernetes sends a Pod it stops), both handlers
/// installed at once.
fn terminated() -> impl std::future::Future<Output = ()> {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    let interrupt = interrupted();
    async move {
        match term {
            Ok(mut t) => {
                tokio::select! {
                    _ = t.recv() => {}
                    () = interrupt => {}
                }
            }
            Err(_) => interrupt.await,
        }
    }
}

fn source(path: Option<std::path::PathBuf>, embedded: fn() -> Source) -> Source {
    path.map(Source::File).unwrap_or_else(embedded)
}

/// jemalloc, with a background thread that gives freed memory back to the system (configured
/// in .cargo/config.toml), the same in the glibc build and the static musl image: glibc's
/// allocator kept what a burst of connections had used once they closed.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let telemetry = telemetry::init();
    let code = run(Cli::parse(), telemetry.progress()).await;
    // Every command ends here, so the spans of a run reach the collector before it exits.
    telemetry.shutdown().await;
    code
}

async fn run(cli: Cli, progress: &Progress) -> ExitCode {
    let command = cli.command.unwrap_or(Command::Reconcile(ReconcileArgs {
        file: None,
        providers: None,
        world: None,
        dry_run: true,
        output: Format::Text,
        state: None,
        timeout: std::time::Duration::from_secs(600),
        max_rounds: egress_proxies::DEFAULT_MAX_ROUNDS,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        gc_grace: std::time::Duration::from_secs(300),
        concurrency: egress_proxies::reconcile::DEFAULT_CONCURRENCY,
        run_for: None,
        watch: false,
        listen: None,
        api_tokens: None,
        tls: Default::default(),
        progress: ProgressMode::Auto,
    }));
    match command {
        Command::Reconcile(a) => {
            let all_embedded = a.file.is_none() && a.providers.is_none();
            let world = match a.world {
                Some(p) => Some(Source::File(p)),
                None if all_embedded => Some(examples::world()),
                None => None,
            };
            let dry_run = a.dry_run;
            // A dry-run is over in moments and its stderr is part of what tests compare.
            if !dry_run {
                let term = std::env::var("TERM").ok();
                progress.start(egress_proxies::progress::resolve(
                    a.progress,
                    std::io::stderr().is_terminal(),
                    term.as_deref(),
                ));
            }
            let req = egress_proxies::ReconcileRequest {
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
                let serving = match (a.listen, a.api_tokens) {
                    (Some(addr), Some(api_tokens)) => {
                        let tls = match a.tls.mode("--listen") {
                            Ok(m) => m,
                            Err(e) => {
                                eprintln!("error: {e}");
                                return ExitCode::FAILURE;
                            }
                        };
                        // The API's backlog (4,096), not bind's 128: a burst of crawlers
                        // would otherwise wait out SYN retransmissions.
                        match egress_serve::listen(addr) {
                            Ok(listener) => {
                                let at = listener.local_addr().unwrap_or(addr);
                                eprintln!("serving the API on {}://{at}", tls.scheme());
                                Some(egress_proxies::Serving {
                                    listener,
                                    api_tokens,
                                    tls,
                                })
                            }
                            Err(e) => {
                                eprintln!("error: --listen {addr}: {e}");
                                return ExitCode::FAILURE;
                            }
                        }
                    }
                    _ => None,
                };
                let watched = egress_proxies::run_reconcile_watch_serving(
                    req,
                    std::time::Duration::from_millis(500),
                    serving,
                    |report| {
                        progress
                            .suspend(|| print!("{}", output::reconcile(report, format, dry_run)))
                    },
                    |why| progress.suspend(|| eprintln!("{why}")),
                    interrupted(),
                )
                .await;
                progress.stop();
                return match watched {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                };
            }
            let outcome = egress_proxies::run_reconcile(req).await;
            progress.stop();
            match outcome {
                Ok(report) => {
                    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                    let written = output::write_reconcile(&mut out, &report, a.output, dry_run)
                        .and_then(|()| std::io::Write::flush(&mut out));
                    drop(out);
                    if let Err(e) = written {
                        eprintln!("error: writing the report: {e}");
                        return ExitCode::FAILURE;
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
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(a) => {
            let api_tls = match a.tls.mode("--listen") {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let opts = egress_operator::Options {
                api_tls,
                token_audiences: a.audiences.token.clone(),
                metrics_token_audiences: a.audiences.metrics.clone(),
                providers: a.providers,
                namespace: a.namespace,
                lease_name: a.lease,
                identity: a.identity,
                listen: a.listen,
                probe_listen: a.probe_listen,
                gc_interval: a.gc_interval,
                gc_grace: a.gc_grace,
                health_interval: a.health_interval,
                reload_interval: a.reload_interval,
                concurrency: a.concurrency,
                api_tokens: a.api_tokens,
                webhook: match (a.webhook_listen, a.webhook_cert, a.webhook_key) {
                    (Some(listen), Some(cert), Some(key)) => {
                        Some(egress_operator::WebhookOptions { listen, cert, key })
                    }
                    // clap requires all three together.
                    _ => None,
                },
                max_replicas: a.max_replicas,
            };
            match egress_operator::run(opts).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Provider(ProviderCmd::Test(a)) => match egress_proxies::provider::test(a).await {
            Ok((text, failed)) => {
                print!("{text}");
                if failed {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Provider(ProviderCmd::New(a)) => match egress_proxies::provider::new(a) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Doctor(Doctor::Libvirt(a)) => {
            if a.insecure_ignore_host_key {
                eprintln!(
                    "warning: host key checking is off; anyone on the path can impersonate the host"
                );
            }
            let report = libvirt_rpc::doctor(libvirt_rpc::DoctorOptions {
                address: a.address,
                user: a.user,
                key_file: a.key,
                known_hosts: a.known_hosts,
                socket_path: a.socket,
                pool: a.pool,
                timeout: None,
            })
            .await;
            let text = report.to_string();
            println!("{}", text.trim_end());
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Proxies(a) => {
            match egress_proxies::state::StateFile::read(&a.state).and_then(|state| {
                let path = egress_control::credential_store::FileCredentials::path_for(&a.state);
                let leases = egress_proxies::leases::LeaseFile::read(
                    &egress_proxies::leases::LeaseFile::path_for(&a.state),
                )?;
                egress_control::credential_store::FileCredentials::open(path)
                    .map(|c| (state, c, leases))
                    .map_err(egress_proxies::CliError::Runtime)
            }) {
                Ok((state, credentials, leases)) => {
                    let filter = egress_core::discovery::Filter {
                        provider: a.provider,
                        namespace: a.namespace,
                        pool: a.pool,
                    };
                    let list = state.discover(&credentials, &leases, &filter);
                    match a.output {
                        egress_proxies::cli::ProxiesFormat::Text => {
                            print!("{}", egress_core::discovery::text(&list))
                        }
                        egress_proxies::cli::ProxiesFormat::Json => println!(
                            "{}",
                            serde_json::to_string_pretty(&egress_core::discovery::json(&list))
                                .unwrap_or_default()
                        ),
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Gateway(a) => match egress_proxies::gateway::run(a, terminated()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Echo(a) => match egress_proxies::echo::run(&a, interrupted()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Check(a) => {
            let all_embedded = a.providers.is_none();
            let world = match a.world {
                Some(p) => Some(Source::File(p)),
                None if all_embedded => Some(examples::world()),
                None => None,
            };
            match egress_proxies::run_check(
                source(a.providers, examples::providers),
                a.dry_run,
                world,
                RuntimeOptions::default(),
            )
            .await
            {
                Ok(reports) => {
                    print!("{}", output::check(&reports, a.output.into()));
                    if output::all_healthy(&reports) {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(2)
                    }
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
