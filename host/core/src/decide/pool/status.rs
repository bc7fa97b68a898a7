//! The pool's status after a decision: its counts, each placement's (its share, whether it is
//! degraded and why, what it lent), and the Available, Progressing and PlacementDegraded
//! conditions.

use super::health::Health;
use super::observed::Observed;
use super::shares::targets;
use super::stale::Stale;
use crate::model::pool::*;
use crate::model::proxy::Condition;

/// The counts a status reports.
pub(super) struct Counts {
    pub ready: usize,
    pub available: usize,
    pub updated: usize,
    pub min_available: usize,
    /// Members still being deleted.
    pub deleting: usize,
    /// Members draining, or starting to.
    pub draining: usize,
}

impl Counts {
    /// The counts of `members` as `seen`: ready (not cordoned), available, up to date (stale
    /// for no rollout reason), being deleted, and draining (`drains` start now).
    pub fn of(
        seen: &Observed<'_>,
        members: &[Member],
        stale: &Stale<'_>,
        min_available: usize,
        drains: usize,
    ) -> Counts {
        let live = &seen.live;
        Counts {
            ready: live.iter().filter(|m| m.ready && !m.cordoned).count(),
            available: seen.available_count(),
            updated: live
                .iter()
                .filter(|m| {
                    !matches!(
                        stale.get(m.name.as_str()),
                        Some(
                            DeleteReason::Cordoned
                                | DeleteReason::OutOfDate
                                | DeleteReason::Rotated
                        )
                    )
                })
                .count(),
            min_available,
            deleting: members.iter().filter(|m| m.deleting).count(),
            draining: seen.draining.len() + drains,
        }
    }
}

/// The status: `health` and `target` per placement, `creates` and `deletes` this decision's.
/// Leases are left to the caller (`leased_replicas`, `lost_leases`).
pub(super) fn status(
    seen: &Observed<'_>,
    prior: &PoolStatus,
    counts: Counts,
    health: &[Health],
    target: &[usize],
    creates: &[Create],
    deletes: &[(String, DeleteReason)],
) -> PoolStatus {
    let spec = seen.spec;
    let live = &seen.live[..];
    let shared = &seen.shared;
    let available_of = |m: &Member| seen.available(m);
    let base = targets(spec);
    let placements: Vec<PlacementStatus> = spec
        .placements
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mine: Vec<&&Member> = live.iter().filter(|m| m.placement == Some(i)).collect();
            let h = &health[i];
            // Members replaced for a shared address now, each counted once: created after
            // the last one counted.
            let counted: Vec<u64> = deletes
                .iter()
                .filter(|(name, why)| {
                    *why == DeleteReason::SharedEgress || shared.contains_key(name.as_str())
                })
                .filter_map(|(name, _)| mine.iter().find(|m| m.name == *name))
                .map(|m| m.serial.unwrap_or(0))
                .filter(|c| h.shared_counted_to.is_none_or(|t| *c > t))
                .collect();
            PlacementStatus {
                provider: p.provider.clone(),
                replicas: mine.len() as u32,
                ready_replicas: mine.iter().filter(|m| m.ready && !m.cordoned).count() as u32,
                available_replicas: mine.iter().filter(|m| available_of(m)).count() as u32,
                target_replicas: target.get(i).copied().unwrap_or(0) as u32,
                degraded_since: h.degraded_since.map(egress_time::format_rfc3339),
                failed_replacements: h.failed_replacements
                    + deletes
                        .iter()
                        .filter(|(name, why)| {
                            *why == DeleteReason::Failed && mine.iter().any(|m| m.name == *name)
                        })
                        .count() as u32,
                shared_egress_replacements: h.shared_replacements + counted.len() as u32,
                shared_egress_counted_serial: counted.iter().copied().max().or(h.shared_counted_to),
                legacy_shared_egress_counted_to: None,
                shared_egress_ips: {
                    let mut ips: std::collections::BTreeSet<String> =
                        h.shared_ips.iter().cloned().collect();
                    // Those its members share now, whether replaced yet or kept as a probe.
                    ips.extend(
                        mine.iter()
                            .filter_map(|m| shared.get(m.name.as_str()))
                            .map(|ip| ip.to_string()),
                    );
                    ips.into_iter().collect()
                },
                last_error: h.failure.clone(),
            }
        })
        .collect();
    let cond = |type_: &str, ok: bool, reason: &str, message: String| Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: String::new(),
    };
    let replicas = spec.replicas as usize;
    let Counts {
        ready,
        available: serving,
        updated,
        min_available,
        deleting,
        draining,
    } = counts;
    let available = serving >= min_available;
    let settled = creates.is_empty()
        && deletes.is_empty()
        && updated == replicas
        && live.len() == replicas
        && deleting == 0
        && draining == 0;
    let name = |i: usize| format!("placements[{i}] ({})", spec.placements[i].provider);
    let degraded: Vec<String> = placements
        .iter()
        .enumerate()
        .filter(|(_, p)| p.degraded_since.is_some() || p.last_error.is_some())
        .map(|(i, p)| {
            let mut m = format!(
                "{}: {}",
                name(i),
                p.last_error
                    .as_deref()
                    .unwrap_or("no member of it serves yet")
            );
            let lent = base.get(i).copied().unwrap_or(0).saturating_sub(target[i]);
            if p.degraded_since.is_some() && lent > 0 {
                let to: Vec<String> = (0..placements.len())
                    .filter(|&j| target[j] > base.get(j).copied().unwrap_or(0))
                    .map(|j| format!("{} to {}", target[j] - base[j], name(j)))
                    .collect();
                m.push_str(&format!(
                    "; {lent} of its {} lent{}",
                    base[i],
                    if to.is_empty() {
                        " (no other placement has room)".to_string()
                    } else {
                        format!(": {}", to.join(", "))
                    }
                ));
            }
            m
        })
        .collect();
    let any_degraded = placements.iter().any(|p| p.degraded_since.is_some());
    let conditions = vec![
        cond(
            "Available",
            available,
            if available {
                "MinimumReplicasAvailable"
            } else {
                "MinimumReplicasUnavailable"
            },
            format!(
                "{serving} of {replicas} available ({ready} ready); at least {min_available} must be"
            ),
        ),
        cond(
            "Progressing",
            true,
            if spec.paused {
                "Paused"
            } else if settled {
                "Complete"
            } else {
                "RollingOut"
            },
            {
                let mut m = format!(
                    "{updated} of {replicas} up to date; {} to create, {} to delete",
                    creates.len(),
                    deletes.len()
                );
                if draining > 0 {
                    m.push_str(&format!("; {draining} draining for their leases"));
                }
                m
            },
        ),
        cond(
            "PlacementDegraded",
            !degraded.is_empty(),
            if any_degraded {
                "ShareLent"
            } else if degraded.is_empty() {
                "AllPlacementsCreate"
            } else {
                "CannotCreate"
            },
            if degraded.is_empty() {
                "every placement creates".into()
            } else {
                degraded.join("; ")
            },
        ),
    ];
    PoolStatus {
        observed_generation: None,
        replicas: live.len() as u32,
        ready_replicas: ready as u32,
        available_replicas: serving as u32,
        updated_replicas: updated as u32,
        distinct_egress_ips: live
            .iter()
            .filter(|m| m.available && !m.cordoned)
            .filter_map(|m| m.egress_ip.as_deref())
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u32,
        member_serial: prior.member_serial,
        selector: prior.selector.clone(),
        conditions,
        placements,
        leased_replicas: 0,
        draining_replicas: draining as u32,
        lost_leases: Vec::new(),
        targets: Vec::new(),
        other_targets: 0,
        autoscale: None,
        // Counted by the pool controller from the leases, not by this decision.
        lease_usage: prior.lease_usage.clone(),
    }
}
