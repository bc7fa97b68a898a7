//! When the pool must be decided again though nothing changes: the next rotation, the next
//! failed member past its backoff, the next quota failure to last spillAfter, the next drain
//! to end.

use super::budgets::age_limit;
use super::observed::Observed;
use super::removals::Removals;
use super::stale::Stale;
use crate::model::pool::*;
use std::time::Duration;

/// The soonest of those, at least a second away; `failed_due` is what the replacement steps
/// held back, `removals` what this decision removes, `retire_at` when the drains it starts end.
pub(super) fn requeue_after(
    seen: &Observed<'_>,
    stale: &Stale<'_>,
    spill: i64,
    failed_due: Option<i64>,
    removals: &Removals,
    retire_at: i64,
) -> Option<Duration> {
    [
        next_rotation(seen, stale),
        failed_due,
        next_spill(seen, spill),
        next_drain_end(seen, removals, retire_at),
    ]
    .into_iter()
    .flatten()
    .min()
    .map(|s| Duration::from_secs(s.max(1) as u64))
}

/// Seconds until the next member not yet stale reaches its age limit.
fn next_rotation(seen: &Observed<'_>, stale: &Stale<'_>) -> Option<i64> {
    seen.spec.rotation.as_ref().and_then(|r| {
        seen.live
            .iter()
            .filter(|m| !stale.contains_key(m.name.as_str()))
            .filter_map(|m| Some(m.created_at? + age_limit(r, &m.name)? - seen.now))
            .min()
    })
}

/// Seconds until a quota failure will have lasted spillAfter.
fn next_spill(seen: &Observed<'_>, spill: i64) -> Option<i64> {
    seen.live
        .iter()
        .filter_map(|m| m.failure.as_ref())
        .filter(|f| f.kind == FailureKind::Quota)
        .filter_map(|f| f.since)
        .map(|t| t + spill - seen.now)
        .filter(|d| *d > 0)
        .min()
}

/// Seconds until a drain ends at its retirement or when its last lease ends, or until the
/// drains this decision starts retire.
fn next_drain_end(seen: &Observed<'_>, removals: &Removals, retire_at: i64) -> Option<i64> {
    let now = seen.now;
    seen.draining
        .iter()
        .filter(|m| !removals.deletes.iter().any(|(d, _)| *d == m.name))
        .filter_map(|m| {
            let (at, _) = m.retiring?;
            let lease_end = m
                .leases
                .iter()
                .filter(|l| l.holds)
                .map(|l| l.until)
                .max()
                .unwrap_or(now);
            Some(at.min(lease_end) - now)
        })
        .chain((!removals.drains.is_empty()).then_some(retire_at - now))
        .min()
}
