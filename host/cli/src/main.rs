//! The `egress-proxies` binary: parses the arguments and hands each command to its module
//! of [`egress_proxies::commands`].

use clap::Parser;
use egress_proxies::cli::{Cli, Command, Doctor, ProviderCmd};
use egress_proxies::commands;
use egress_proxies::progress::Progress;
use egress_proxies::signals::{interrupted, terminated};
use egress_proxies::telemetry;
use std::process::ExitCode;

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
    let command = cli
        .command
        .unwrap_or_else(|| Command::Reconcile(commands::reconcile::embedded_dry_run()));
    match command {
        Command::Reconcile(a) => commands::reconcile::command(a, progress, interrupted()).await,
        Command::Run(a) => commands::operator::command(a).await,
        Command::Provider(ProviderCmd::Test(a)) => commands::provider::test_command(a).await,
        Command::Provider(ProviderCmd::New(a)) => commands::provider::new_command(a),
        Command::Provider(ProviderCmd::Sign(a)) => commands::provider::sign_command(a),
        Command::Provider(ProviderCmd::Push(a)) => commands::provider::push_command(a).await,
        Command::Doctor(Doctor::Libvirt(a)) => commands::doctor::libvirt(a).await,
        Command::Proxies(a) => commands::proxies::command(a),
        Command::Gateway(a) => commands::gateway::command(a, terminated()).await,
        Command::Echo(a) => commands::echo::command(&a, interrupted()).await,
        Command::Check(a) => commands::check::command(a).await,
        Command::Usage(a) => commands::usage::command(a),
    }
}
