//! `usage`: who used what over a time range, from audit trail files (`crate::usage`).

use super::failed;
use crate::cli::{UsageArgs, UsageFormat};
use crate::error::CliError;
use crate::inputs::Source;
use std::process::ExitCode;

/// A line longer than this is no trail's: it is left out, read past without being held (a
/// bound on what one line of a shipped log can make the command hold).
const MAX_LINE: usize = 64 * 1024;

/// The lines of a reader, each at most [`MAX_LINE`] bytes: a longer one comes as
/// [`TOO_LONG`] (no trail's line: counted and left out), its bytes skipped. Ends at the end of
/// the input or a read error.
struct BoundedLines<R>(R);

/// What stands for a line past the bound: not JSON, so `usage` counts it as left out.
const TOO_LONG: &str = "(a line longer than the bound)";

impl<R: std::io::BufRead> Iterator for BoundedLines<R> {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        use std::io::{BufRead, Read};
        let mut line = Vec::new();
        let n = (&mut self.0)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .ok()?;
        if n == 0 {
            return None;
        }
        if line.last() != Some(&b'\n') && line.len() > MAX_LINE {
            // Past the bound: skip to the line's end, holding nothing.
            loop {
                let buf = self.0.fill_buf().ok()?;
                if buf.is_empty() {
                    break;
                }
                match buf.iter().position(|b| *b == b'\n') {
                    Some(i) => {
                        self.0.consume(i + 1);
                        break;
                    }
                    None => {
                        let all = buf.len();
                        self.0.consume(all);
                    }
                }
            }
            return Some(TOO_LONG.into());
        }
        Some(String::from_utf8_lossy(&line).into_owned())
    }
}

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
    // Every file opened first, so one that cannot be read is named before any is read.
    for f in &a.files {
        std::fs::File::open(f).map_err(|e| input("FILE", format!("{}: {e}", f.display())))?;
    }
    // Read line by line, each line bounded: a trail of any size costs a line of memory.
    let lines = || {
        a.files
            .iter()
            .filter_map(|f| std::fs::File::open(f).ok())
            .flat_map(|f| BoundedLines(std::io::BufReader::new(f)))
            .filter(|l| !l.trim().is_empty())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A line past the bound is skipped without being held and stands as one left-out line;
    /// the lines around it come whole.
    #[test]
    fn a_line_past_the_bound_is_skipped_and_its_neighbours_kept() {
        let long = "x".repeat(MAX_LINE + 10);
        let text = format!("{{\"a\":1}}\n{long}\n{{\"b\":2}}");
        // A small buffer, so the long line spans many reads.
        let lines: Vec<String> =
            BoundedLines(std::io::BufReader::with_capacity(1024, text.as_bytes())).collect();
        assert_eq!(lines, ["{\"a\":1}\n", TOO_LONG, "{\"b\":2}"]);
    }
}
