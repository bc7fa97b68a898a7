//! The pool's record of lost leases: those its own removals lose ([`lose`]),
//! those it only sees (an instance replaced under a lease, a member deleted by someone else),
//! and what of the prior record still stands.

use crate::model::lease::LostProxy;
use crate::model::pool::*;

/// What a member's leases lose when it goes: each live binding, for the reason it goes (one of
/// a replaced instance, for that).
pub(super) fn lose(m: &Member, why: &str, now: i64) -> Vec<LostProxy> {
    m.leases
        .iter()
        .filter(|l| l.live(now))
        .map(|l| LostProxy {
            lease: l.id.clone(),
            proxy: m.name.clone(),
            reason: if l.holds {
                why.to_string()
            } else {
                crate::model::lease::INSTANCE_REPLACED.to_string()
            },
            at: egress_time::format_rfc3339(now),
            holder: Some(l.holder.clone()),
        })
        .collect()
}

/// Losses the pool did not decide, recorded as soon as it sees them, so they outlive the
/// bindings that show them: an instance replaced under a lease (the binding holds nothing
/// from then on), and a member being deleted (by someone else, or by a decision whose record
/// was not written) with a lease on it.
pub(super) fn seen_lost(members: &[Member], now: i64) -> Vec<LostProxy> {
    let mut lost = Vec::new();
    for m in members {
        for l in m.leases.iter().filter(|l| l.live(now)) {
            let why = if !l.holds {
                crate::model::lease::INSTANCE_REPLACED.to_string()
            } else if m.deleting {
                "its Proxy is being deleted".to_string()
            } else {
                continue;
            };
            lost.push(LostProxy {
                lease: l.id.clone(),
                proxy: m.name.clone(),
                reason: why,
                at: egress_time::format_rfc3339(now),
                holder: Some(l.holder.clone()),
            });
        }
    }
    lost
}

/// The pool's record of lost leases: the prior one's entries younger than [`LOST_KEPT`] (but
/// those the world contradicts: a member not going now whose lease still holds it, where a
/// record written before a deletion that then did not happen would otherwise stand), then
/// the new ones, each (lease, proxy) once, the newest [`LOST_KEPT_MAX`].
pub(super) fn lost_record(
    prior: &PoolStatus,
    members: &[Member],
    deletes: &[(String, DeleteReason)],
    new: Vec<LostProxy>,
    now: i64,
) -> Vec<LostProxy> {
    let still_held = |l: &LostProxy| {
        !deletes.iter().any(|(d, _)| *d == l.proxy)
            && members.iter().any(|m| {
                m.name == l.proxy
                    && !m.deleting
                    && m.leases
                        .iter()
                        .any(|b| b.id == l.lease && b.holds && b.live(now))
            })
    };
    let mut out: Vec<LostProxy> = Vec::new();
    for l in prior
        .lost_leases
        .iter()
        .filter(|l| {
            egress_time::parse_rfc3339(&l.at)
                .is_some_and(|t| now.saturating_sub(t) < LOST_KEPT.as_secs() as i64)
        })
        .filter(|l| !still_held(l))
        .cloned()
        .chain(new)
    {
        if !out.iter().any(|o| o.lease == l.lease && o.proxy == l.proxy) {
            out.push(l);
        }
    }
    let over = out.len().saturating_sub(LOST_KEPT_MAX);
    out.drain(..over);
    out
}
