//! Step 5, scaling down: more current members than replicas, the ones that do not serve go
//! first, then the unleased, then the oldest; and what a placement still has beyond its share
//! (another placement took its share back) is out of place. Removing the scaled-down members
//! within the floor is [`remove_scaled_down`].

use super::lost::lose;
use super::observed::Observed;
use super::removals::Removals;
use super::stale::Stale;
use crate::model::pool::*;

/// What scaling down decides.
#[derive(Debug, Default, PartialEq)]
pub(super) struct ScaleDown<'a> {
    /// The current members beyond `replicas`, in the order they go.
    pub scaled_down: Vec<&'a Member>,
    /// Serving members beyond their placement's share, the oldest first (Rebalanced).
    pub out_of_place: Vec<&'a str>,
    /// The members that stay current: neither stale, a probe nor out of place (the scaled-down
    /// ones still among them, until they go).
    pub current: Vec<&'a Member>,
}

/// Which members scaling down takes: of the live members neither stale nor a probe, those
/// beyond `replicas` (not serving first; unleased before leased, since a leased one would only
/// drain; then the oldest), and the serving ones beyond each placement's `target`.
pub(super) fn scale_down<'a>(
    seen: &Observed<'a>,
    stale: &Stale<'_>,
    probes: &[&str],
    target: &[usize],
) -> ScaleDown<'a> {
    let replicas = seen.spec.replicas as usize;
    let now = seen.now;
    let age_key = |m: &&Member| (m.created_at.unwrap_or(i64::MIN), m.name.clone());
    let mut current: Vec<&Member> = seen
        .live
        .iter()
        .copied()
        .filter(|m| !stale.contains_key(m.name.as_str()) && !probes.contains(&m.name.as_str()))
        .collect();
    current.sort_by_key(|m| (seen.available(m), m.leased(now), age_key(m)));
    let scaled_down: Vec<&Member> = current
        .iter()
        .copied()
        .take(current.len().saturating_sub(replicas))
        .collect();
    let mut out_of_place: Vec<&str> = Vec::new();
    for (i, t) in target.iter().enumerate() {
        let mut serving: Vec<&Member> = current
            .iter()
            .copied()
            .filter(|m| m.placement == Some(i) && seen.available(m))
            .filter(|m| !scaled_down.iter().any(|s| s.name == m.name))
            .collect();
        serving.sort_by_key(age_key);
        for m in serving.iter().take(serving.len().saturating_sub(*t)) {
            out_of_place.push(&m.name);
        }
    }
    current.retain(|m| !out_of_place.contains(&m.name.as_str()));
    ScaleDown {
        scaled_down,
        out_of_place,
        current,
    }
}

/// Removes the scaled-down members: one that serves no one costs nothing (its leases are
/// lost); one that serves goes only while `room` (serving members that may go before the
/// floor) lasts, and drains instead when leased.
pub(super) fn remove_scaled_down(
    seen: &Observed<'_>,
    scaled_down: &[&Member],
    room: usize,
) -> Removals {
    let now = seen.now;
    let mut out = Removals::default();
    for m in scaled_down {
        if seen.available(m) {
            if out.spent >= room {
                break;
            }
            out.spent += 1;
            if m.leased(now) {
                out.drains.push((m.name.clone(), DeleteReason::ScaledDown));
                continue;
            }
        } else {
            out.lost
                .extend(lose(m, "ScaledDown: it does not serve", now));
        }
        out.deletes.push((m.name.clone(), DeleteReason::ScaledDown));
    }
    out
}
