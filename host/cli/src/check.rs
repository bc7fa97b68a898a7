//! `check`'s run: each provider's health check, against the real backends or a dry-run's
//! world.

use crate::error::CliError;
use crate::inputs::{Inputs, Source, load_config};
use crate::wiring::{backends_for, load_providers};
use egress_runtime::RuntimeOptions;

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
