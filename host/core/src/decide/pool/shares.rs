//! Step 2, the placements' shares of `replicas`: by weight within each placement's
//! maxReplicas ([`targets`]); a degraded placement holds only what of it serves now and lends
//! the rest to the others ([`lent_shares`]).

use super::health::Health;
use super::observed::Observed;
use super::stale::Stale;
use crate::model::pool::*;

/// Each placement's share of this decision and the most it may hold.
pub(super) struct Shares {
    /// The most members placement i may hold now: its maxReplicas, or what of it serves
    /// when it is degraded.
    pub caps: Vec<usize>,
    /// Placement i's share within `caps`.
    pub target: Vec<usize>,
}

/// The shares when degraded placements lend theirs: a degraded placement is capped at its
/// members that serve and are not stale, and what it cannot hold goes to the others within
/// their maxReplicas.
pub(super) fn lent_shares(seen: &Observed<'_>, health: &[Health], stale: &Stale<'_>) -> Shares {
    let spec = seen.spec;
    let caps: Vec<usize> = (0..seen.placements())
        .map(|i| {
            let max = spec.placements[i]
                .max_replicas
                .map_or(usize::MAX, |m| m as usize);
            if health[i].degraded() {
                let serving = seen
                    .of_placement(i)
                    .filter(|m| seen.available(m) && !stale.contains_key(m.name.as_str()))
                    .count();
                max.min(serving)
            } else {
                max
            }
        })
        .collect();
    let target = shares(spec, &caps);
    Shares { caps, target }
}

/// The integer share of `replicas` each placement gets: by weight, capped by maxReplicas, the
/// rest of a capped placement's share going to the others, remainders by largest fraction
/// (ties to the earlier placement).
pub fn targets(spec: &PoolSpec) -> Vec<usize> {
    let caps: Vec<usize> = spec
        .placements
        .iter()
        .map(|p| p.max_replicas.map_or(usize::MAX, |m| m as usize))
        .collect();
    shares(spec, &caps)
}

/// [`targets`] with each placement capped at `caps[i]`; what no placement has room for is
/// left unassigned.
fn shares(spec: &PoolSpec, caps: &[usize]) -> Vec<usize> {
    let n = spec.placements.len();
    let cap = |i: usize| caps.get(i).copied().unwrap_or(usize::MAX);
    let mut target = vec![0usize; n];
    let mut open: Vec<usize> = (0..n).filter(|&i| cap(i) > 0).collect();
    let mut left = spec.replicas as usize;
    while left > 0 && !open.is_empty() {
        let weight: u64 = open
            .iter()
            .map(|&i| u64::from(spec.placements[i].weight))
            .sum();
        if weight == 0 {
            break;
        }
        // Shares of what is left, as (whole, remainder) by largest remainder.
        let mut shares: Vec<(usize, usize, u64)> = open
            .iter()
            .map(|&i| {
                let w = u64::from(spec.placements[i].weight) * left as u64;
                (i, (w / weight) as usize, w % weight)
            })
            .collect();
        let given: usize = shares.iter().map(|s| s.1).sum();
        let mut by_rest: Vec<usize> = (0..shares.len()).collect();
        by_rest.sort_by(|&a, &b| {
            shares[b]
                .2
                .cmp(&shares[a].2)
                .then(shares[a].0.cmp(&shares[b].0))
        });
        for k in by_rest.into_iter().take(left.saturating_sub(given)) {
            shares[k].1 += 1;
        }
        let mut capped = false;
        for (i, share, _) in shares {
            let room = cap(i).saturating_sub(target[i]);
            let take = share.min(room);
            target[i] += take;
            left -= take;
            if take < share {
                capped = true;
            }
        }
        open.retain(|&i| target[i] < cap(i));
        if !capped {
            break;
        }
    }
    target
}
