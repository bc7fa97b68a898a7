//! `check`: each provider's health check, printed; exit code 2 when a target is unhealthy.

use super::{failed, source, world};
use crate::cli::CheckArgs;
use crate::{examples, output};
use egress_runtime::RuntimeOptions;
use std::process::ExitCode;

/// Runs `check`: exit code 0 when every target is healthy, 2 when one is not, 1 on an error.
pub async fn command(a: CheckArgs) -> ExitCode {
    let all_embedded = a.providers.is_none();
    let world = world(a.world, all_embedded);
    match crate::check::run_check(
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
        Err(e) => failed(e),
    }
}
