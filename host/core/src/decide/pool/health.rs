//! Step 1, each placement's health: degraded while its creates fail (a permanent failure at
//! once, quota or capacity after `spillAfter`), or, with `distinctEgress`, while its members
//! keep egressing from addresses older members have; until a member of it serves again (one
//! with an address of its own, for the latter).

use super::observed::Observed;
use crate::model::pool::*;

/// What a placement's record says and what its members show now.
pub(super) struct Health {
    /// Unix seconds: since when its creates fail (None: it creates).
    pub degraded_since: Option<i64>,
    pub failed_replacements: u32,
    /// Members replaced in a row for a shared egress address (distinctEgress), and the
    /// serial of the last one counted.
    pub shared_replacements: u32,
    pub shared_counted_to: Option<u64>,
    /// The addresses of that run.
    pub shared_ips: Vec<String>,
    /// Its failing member's `Reason: message`, if one is failing now.
    pub failure: Option<String>,
}

impl Health {
    /// Whether the placement's share is lent and it keeps a probe.
    pub fn degraded(&self) -> bool {
        self.degraded_since.is_some()
    }
}

/// Each placement's [`Health`], from what `prior` recorded of it (while its provider is the
/// same) and its live members now; `spill` is `spillAfter` in seconds.
pub(super) fn placement_health(seen: &Observed<'_>, prior: &PoolStatus, spill: i64) -> Vec<Health> {
    (0..seen.placements())
        .map(|i| health_of(seen, prior, spill, i))
        .collect()
}

fn health_of(seen: &Observed<'_>, prior: &PoolStatus, spill: i64, i: usize) -> Health {
    let spec = seen.spec;
    let now = seen.now;
    let mine = || seen.of_placement(i);
    let recorded = prior
        .placements
        .get(i)
        .filter(|p| p.provider == spec.placements[i].provider);
    let since = recorded
        .and_then(|p| p.degraded_since.as_deref())
        .and_then(egress_time::parse_rfc3339);
    let failing = mine()
        .filter_map(|m| m.failure.as_ref())
        .filter(|f| match f.kind {
            FailureKind::Permanent => true,
            FailureKind::Quota => f.since.is_none_or(|t| now.saturating_sub(t) >= spill),
        })
        .min_by_key(|f| (f.since, f.message.clone()));
    let recovered = since.is_some_and(|t| {
        mine().any(|m| seen.available(m) && m.running_since.is_some_and(|r| r >= t))
    });
    // A member with an address no other member of the pool has, newer than the last shared
    // one counted, ends the run of shared addresses. (Not merely the oldest holder of a shared
    // address: while that one blips, the next holder is available, yet its placement still
    // gives shared addresses.)
    let counted_to = recorded.and_then(|p| p.shared_egress_counted_serial);
    let known_shared: &[String] = recorded.map_or(&[], |p| &p.shared_egress_ips);
    let own_address_since = counted_to.is_some_and(|t| {
        mine().any(|m| seen.unique(m, known_shared) && m.serial.is_some_and(|c| c > t))
    });
    // The members giving shared addresses now count at once, so the decision that meets the
    // limit does not first create more here.
    let sharing_now = mine()
        .filter(|m| seen.shared.contains_key(&*m.name))
        .filter(|m| counted_to.is_none_or(|t| m.serial.unwrap_or(0) > t))
        .count() as u32;
    let recorded_sharing = recorded.map_or(0, |p| p.shared_egress_replacements);
    // Degraded for giving shared addresses, it recovers only through a member with an address
    // of its own.
    let degraded_for_sharing =
        spec.distinct_egress && recorded_sharing + sharing_now >= SHARED_EGRESS_LIMIT;
    let recovered = recovered
        && (!degraded_for_sharing
            || since.is_some_and(|t| {
                mine().any(|m| {
                    seen.unique(m, known_shared) && m.running_since.is_some_and(|r| r >= t)
                })
            }));
    let shared_replacements = if (since.is_some() && recovered) || own_address_since {
        0
    } else {
        recorded_sharing
    };
    let in_a_row = shared_replacements + sharing_now;
    let shares_addresses = spec.distinct_egress && in_a_row >= SHARED_EGRESS_LIMIT;
    let degraded_since = match (since, failing) {
        (Some(t), _) if !recovered => Some(t),
        (_, Some(_)) => Some(now),
        _ if shares_addresses => Some(now),
        _ => None,
    };
    let failed_replacements = if since.is_some() && recovered {
        0
    } else {
        recorded.map_or(0, |p| p.failed_replacements)
    };
    let failure = mine()
        .filter_map(|m| m.failure.as_ref())
        .min_by_key(|f| (f.since, f.message.clone()))
        .map(|f| f.message.clone())
        .or_else(|| {
            shares_addresses.then(|| {
                let addresses: std::collections::BTreeSet<&str> = mine()
                    .filter_map(|m| seen.shared.get(&*m.name).copied())
                    .collect();
                let mut m = format!(
                    "SharedEgress: {in_a_row} members in a row egressed from an address an older member has"
                );
                if !addresses.is_empty() {
                    let list: Vec<&str> = addresses.into_iter().collect();
                    m.push_str(&format!(" ({})", list.join(", ")));
                }
                m
            })
        });
    Health {
        degraded_since,
        failed_replacements,
        shared_replacements,
        shared_counted_to: if shared_replacements == 0 {
            None
        } else {
            counted_to
        },
        shared_ips: if shared_replacements == 0 {
            Vec::new()
        } else {
            known_shared.to_vec()
        },
        failure,
    }
}
