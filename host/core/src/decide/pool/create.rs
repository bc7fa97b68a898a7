//! Step 8, new members: of the current revision, up to `replicas`, within maxSurge, each in the
//! placement furthest below its share (and its least used zone); a degraded placement's probe
//! beside them.

use super::health::Health;
use super::observed::Observed;
use super::shares::Shares;
use crate::model::pool::*;
use std::collections::BTreeMap;

/// What this decision's creates are bounded by.
pub(super) struct Room<'s, 'a> {
    pub revisions: &'s [String],
    /// maxSurge, resolved.
    pub surge: usize,
    pub shares: &'s Shares,
    pub health: &'s [Health],
    /// The probes kept.
    pub probes: &'s [&'a str],
    /// The members that stay current after this decision's removals.
    pub current: &'s [&'a Member],
    /// Live members this decision deletes or starts to drain.
    pub going: usize,
    /// Everything this decision deletes (a probe deleted is no longer trying).
    pub deletes: &'s [(String, DeleteReason)],
}

/// The creates: as many as `replicas` lacks of current members (at most
/// [`CREATES_PER_PASS`]) while the live members that stay, the probes not counted, are fewer
/// than `replicas + maxSurge`; then a probe for each degraded placement that has none trying.
/// Draining members are not counted: they are bounded by drainTimeout, and counting them
/// would stall a rotation for as long as a lease is held.
pub(super) fn new_members(seen: &Observed<'_>, room: &Room<'_, '_>) -> Vec<Create> {
    let spec = seen.spec;
    let n = seen.placements();
    let replicas = spec.replicas as usize;
    let deleted = |name: &str| room.deletes.iter().any(|(d, _)| d == name);
    let kept_probes = room.probes.iter().filter(|p| !deleted(p)).count();
    let remaining = seen.live.len().saturating_sub(room.going + kept_probes);
    let free = replicas
        .saturating_add(room.surge)
        .saturating_sub(remaining);
    let wanted = replicas
        .saturating_sub(room.current.len())
        .min(CREATES_PER_PASS);
    let mut per_placement = vec![0usize; n];
    let mut per_zone: Vec<BTreeMap<String, usize>> = vec![Default::default(); n];
    for m in room.current {
        if let Some(i) = m.placement.filter(|i| *i < n) {
            per_placement[i] += 1;
            if let Some(z) = &m.zone {
                *per_zone[i].entry(z.clone()).or_default() += 1;
            }
        }
    }
    let zone_for = |i: usize, per_zone: &mut Vec<BTreeMap<String, usize>>| {
        let zone = spec.placements[i]
            .zones
            .iter()
            .min_by_key(|z| per_zone[i].get(*z).copied().unwrap_or(0))
            .cloned()
            .or_else(|| spec.template.placement.zone.clone());
        if let Some(z) = &zone {
            *per_zone[i].entry(z.clone()).or_default() += 1;
        }
        zone
    };
    let Shares { caps, target } = room.shares;
    let mut creates = Vec::new();
    for _ in 0..wanted.min(free) {
        // The placement furthest below its share; none below: one with room left.
        let pick = (0..n)
            .filter(|&i| per_placement[i] < caps[i])
            .max_by_key(|&i| {
                (
                    target[i] as i64 - per_placement[i] as i64,
                    std::cmp::Reverse(i),
                )
            });
        let Some(i) = pick else { break };
        per_placement[i] += 1;
        creates.push(Create {
            placement: i,
            zone: zone_for(i, &mut per_zone),
            revision: room.revisions.get(i).cloned().unwrap_or_default(),
            probe: false,
        });
    }
    for i in (0..n).filter(|&i| room.health[i].degraded()) {
        let trying = seen
            .of_placement(i)
            .any(|m| room.probes.contains(&m.name.as_str()) && !deleted(&m.name));
        if !trying {
            creates.push(Create {
                placement: i,
                zone: zone_for(i, &mut per_zone),
                revision: room.revisions.get(i).cloned().unwrap_or_default(),
                probe: true,
            });
        }
    }
    creates
}
