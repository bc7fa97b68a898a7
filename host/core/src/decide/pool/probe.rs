//! Step 4, a degraded placement's probe: of its members that do not serve, it keeps one
//! trying (one still trying before one that failed, then the newest); the others make way.

use super::health::Health;
use super::observed::Observed;
use super::stale::Stale;
use crate::model::pool::*;

/// The probes kept, and the members that make way for them.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Probes<'a> {
    pub kept: Vec<&'a str>,
    /// Members of degraded placements that do not serve and are not their probe (Rebalanced).
    pub rebalanced: Vec<&'a str>,
}

/// Each degraded placement's probe among its members that neither serve nor are stale.
pub(super) fn keep_probes<'a>(
    seen: &Observed<'a>,
    health: &[Health],
    stale: &Stale<'_>,
) -> Probes<'a> {
    let mut out = Probes::default();
    for i in (0..seen.placements()).filter(|&i| health[i].degraded()) {
        let mut trying: Vec<&Member> = seen
            .of_placement(i)
            .filter(|m| {
                !seen.available(m)
                    && !stale.contains_key(m.name.as_str())
                    && !out.rebalanced.contains(&&*m.name)
            })
            .collect();
        trying.sort_by_key(|m| {
            (
                m.failure.is_none(),
                m.created_at.unwrap_or(i64::MIN),
                m.name.clone(),
            )
        });
        if let Some(probe) = trying.pop() {
            out.kept.push(&probe.name);
        }
        out.rebalanced
            .extend(trying.iter().map(|m| m.name.as_str()));
    }
    out
}
