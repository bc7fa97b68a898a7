//! Steps 6 and 7, the rollout's removals: stale members that serve no one go at once
//! ([`remove_not_serving`]); those that serve go only while the available count stays at or
//! above `replicas - maxUnavailable`, a leased one draining instead ([`remove_serving`]); a
//! draining member goes once no lease holds it or at its retirement ([`end_drains`]).

use super::lost::lose;
use super::observed::Observed;
use super::removals::Removals;
use super::stale::Stale;
use crate::model::pool::*;

/// The stale live members with why, in the order they go: by reason, unleased before leased
/// within a reason (a leased one only starts to drain), then the oldest.
pub(super) fn stale_members<'a>(
    seen: &Observed<'a>,
    stale: &Stale<'_>,
) -> Vec<(&'a Member, DeleteReason)> {
    let now = seen.now;
    let mut out: Vec<(&Member, DeleteReason)> = seen
        .live
        .iter()
        .filter_map(|m| stale.get(m.name.as_str()).map(|r| (*m, *r)))
        .collect();
    out.sort_by_key(|(m, r)| {
        (
            *r,
            m.leased(now),
            m.created_at.unwrap_or(i64::MIN),
            m.name.clone(),
        )
    });
    out
}

/// Stale members that serve no one cost nothing to remove, leased or not: a proxy that failed
/// is not drained, it goes, and its holders read why in the status.
pub(super) fn remove_not_serving(
    seen: &Observed<'_>,
    stale_members: &[(&Member, DeleteReason)],
) -> Removals {
    let mut out = Removals::default();
    for (m, r) in stale_members {
        if !seen.available(m) {
            out.deletes.push((m.name.clone(), *r));
            out.lost.extend(lose(
                m,
                &format!(
                    "{}: it does not serve (it failed its check or never started)",
                    r.as_str()
                ),
                seen.now,
            ));
        }
    }
    out
}

/// Stale members that still serve, while `room` (serving members that may go before the
/// floor) lasts; a leased one drains instead of going, which costs the floor the same.
pub(super) fn remove_serving(
    seen: &Observed<'_>,
    stale_members: &[(&Member, DeleteReason)],
    room: usize,
) -> Removals {
    let mut out = Removals::default();
    for (m, r) in stale_members {
        if seen.available(m) && out.spent < room {
            if m.leased(seen.now) {
                out.drains.push((m.name.clone(), *r));
            } else {
                out.deletes.push((m.name.clone(), *r));
            }
            out.spent += 1;
        }
    }
    out
}

/// A draining member goes once no lease holds it, or at its retirement (and the leases still
/// on it then are lost).
pub(super) fn end_drains(seen: &Observed<'_>) -> Removals {
    let now = seen.now;
    let mut out = Removals::default();
    for m in &seen.draining {
        let Some((at, why)) = m.retiring else {
            continue;
        };
        if m.leased(now) && now < at {
            continue;
        }
        out.deletes.push((m.name.clone(), why));
        out.lost.extend(lose(
            m,
            &format!("{}: drained until drainTimeout", why.as_str()),
            now,
        ));
    }
    out
}
