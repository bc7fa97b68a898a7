//! `usage`: who used what over a time range, from audit trail files (`crate::usage`).

use super::failed;
use crate::cli::{UsageArgs, UsageFormat};
use crate::error::CliError;
use crate::inputs::Source;
use std::process::ExitCode;

/// A line longer than this is no trail's: it is left out unread (a bound on what one line
/// of a shipped log can make the command hold).
const MAX_LINE: usize = 64 * 1024;

/// Prints the usage of the range; exit code 1 when a file or the range cannot be read.
pub fn command(a: UsageArgs) -> ExitCode {
    match run(&a) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => failed(e),
    }
}

fn input(what: &str, message: String) -> CliError {
    CliError::Input {
        what: what.into(),
        message,
    }
}

/// `text` as Unix milliseconds: RFC 3339, or a duration back from `now_ms` (`24h`).
fn instant(what: &str, text: &str, now_ms: u64) -> Result<u64, CliError> {
    if let Some(ms) = egress_time::parse_rfc3339_millis(text) {
        return Ok(ms);
    }
    egress_core::config::parse_duration(text)
        .map(|d| now_ms.saturating_sub(d.as_millis() as u64))
        .map_err(|e| {
            input(
                what,
                format!("{text:?} is neither RFC 3339 nor a duration: {e}"),
            )
        })
}

fn run(a: &UsageArgs) -> Result<String, CliError> {
    let now_ms = egress_time::now::unix_now_millis();
    let from = instant("--since", &a.since, now_ms)?;
    let to = match &a.until {
        Some(t) => instant("--until", t, now_ms)?,
        None => now_ms,
    };
    if to <= from {
        return Err(input("--until", "is not after --since".into()));
    }
    let mut text = String::new();
    for f in &a.files {
        let t = std::fs::read_to_string(f)
            .map_err(|e| input("FILE", format!("{}: {e}", f.display())))?;
        text.push_str(&t);
        text.push('\n');
    }
    let lines = || {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| if l.len() > MAX_LINE { "" } else { l })
    };
    let mut usage = crate::usage::Usage::new(from, to);
    usage.read(lines());
    if let (Some(providers), Some(pools)) = (&a.providers, &a.pools) {
        let (config, _) = crate::inputs::load_config(&Source::File(providers.clone()))?;
        let pools_text = std::fs::read_to_string(pools)
            .map_err(|e| input("--pools", format!("{}: {e}", pools.display())))?;
        let inputs = crate::inputs::parse_inputs(&pools_text, &pools.display().to_string())?;
        // A pool's egress price: its placements' providers' `egressPerGiB`, by weight.
        let mut prices = std::collections::BTreeMap::new();
        let mut currency = None;
        for pool in &inputs.pools {
            let (mut sum, mut weights) = (0.0, 0u64);
            for p in &pool.spec.placements {
                if let Some(pr) = config.provider(&p.provider).and_then(|e| e.prices.as_ref()) {
                    currency.get_or_insert_with(|| pr.currency.clone());
                    if currency.as_deref() == Some(pr.currency.as_str()) {
                        sum += pr.egress_per_gib * f64::from(p.weight);
                        weights += u64::from(p.weight);
                    }
                }
            }
            if weights > 0 {
                prices.insert(
                    format!("{}/{}", pool.metadata.namespace, pool.metadata.name),
                    sum / weights as f64,
                );
            }
        }
        if let Some(c) = currency {
            usage.price(&c, |p| prices.get(p).copied(), lines());
        }
    }
    Ok(match a.output {
        UsageFormat::Text => usage.text(),
        UsageFormat::Json => serde_json::to_string_pretty(&usage).unwrap_or_default() + "\n",
    })
}
