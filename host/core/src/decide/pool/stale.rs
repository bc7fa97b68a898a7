//! Why a member is stale: the reasons a rollout replaces a member that may still serve
//! (cordoned, out of date, due for rotation), before the steps that add their own (a member
//! failed, sharing an address, rebalanced).

use super::budgets::age_limit;
use super::observed::Observed;
use crate::model::pool::*;
use std::collections::BTreeMap;

/// Why each stale member is stale, by name: the rollout's reasons ([`rollout_reasons`]), to
/// which [`super::decide`] adds what steps 3 to 5 return ([`mark`]); the removal steps read
/// it. No step changes it itself.
pub(super) type Stale<'a> = BTreeMap<&'a str, DeleteReason>;

/// The live members a rollout replaces whatever the placements' shares: a cordoned one, one of
/// another revision than its placement's (or drifted from its Proxy's spec, or of no placement
/// the spec has), and one older than its age limit.
pub(super) fn rollout_reasons<'a>(seen: &Observed<'a>, revisions: &[String]) -> Stale<'a> {
    let n = seen.placements();
    let rotation_due = |m: &Member| {
        seen.spec.rotation.as_ref().is_some_and(|r| {
            age_limit(r, &m.name)
                .zip(m.created_at)
                .is_some_and(|(limit, created)| seen.now.saturating_sub(created) >= limit)
        })
    };
    let out_of_date = |m: &Member| match m.placement {
        Some(i) if i < n => revisions.get(i) != Some(&m.revision) || m.drifted,
        _ => true,
    };
    let mut stale = Stale::new();
    for m in &seen.live {
        let why = if m.cordoned {
            Some(DeleteReason::Cordoned)
        } else if out_of_date(m) {
            Some(DeleteReason::OutOfDate)
        } else if rotation_due(m) {
            Some(DeleteReason::Rotated)
        } else {
            None
        };
        if let Some(why) = why {
            stale.insert(&m.name, why);
        }
    }
    stale
}

/// Marks `names` stale for `why`, in order.
pub(super) fn mark<'a>(stale: &mut Stale<'a>, names: &[&'a str], why: DeleteReason) {
    for name in names {
        stale.insert(name, why);
    }
}
