//! Step 3, members that make way for new ones though no rollout asks: one held in a permanent
//! failure past its placement's backoff ([`failed`]), and with `distinctEgress` one egressing
//! from an address an older member has ([`sharing_an_address`]).

use super::budgets::failed_replacement_backoff;
use super::health::Health;
use super::observed::Observed;
use super::stale::Stale;
use crate::model::pool::*;

/// Members to replace, and when the next one held back will be due.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Replacements<'a> {
    pub members: Vec<&'a str>,
    /// Seconds from now until a member held back by its backoff is due.
    pub next_due: Option<i64>,
}

impl Replacements<'_> {
    fn wait(&mut self, due: i64) {
        self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
    }
}

/// A member held in a permanent failure past its backoff (which doubles with each failed
/// member its placement replaced in a row) makes way for a new one: the longest failing of
/// each placement, one per placement at a time. None while the pool is paused.
pub(super) fn failed<'a>(
    seen: &Observed<'a>,
    health: &[Health],
    stale: &Stale<'_>,
) -> Replacements<'a> {
    let mut out = Replacements::default();
    if seen.spec.paused {
        return out;
    }
    let now = seen.now;
    for (i, h) in health.iter().enumerate() {
        let wait = failed_replacement_backoff(h.failed_replacements).as_secs() as i64;
        let mut held: Vec<(i64, &Member)> = seen
            .of_placement(i)
            .filter(|m| !stale.contains_key(m.name.as_str()) && !out.members.contains(&&*m.name))
            .filter_map(|m| {
                let f = m.failure.as_ref()?;
                (f.kind == FailureKind::Permanent).then(|| (f.since.unwrap_or(now), m))
            })
            .collect();
        held.sort_by_key(|(since, m)| (*since, m.name.clone()));
        if let Some((since, m)) = held.first() {
            if now.saturating_sub(*since) >= wait {
                out.members.push(&m.name);
            } else {
                out.wait(since + wait - now);
            }
        }
    }
    out
}

/// With distinctEgress, a member an older member shares an address with makes way for a new
/// one (it is not available, so this costs the floor nothing); in a degraded placement, only
/// once it has served for the failed-member backoff, so the probe tries again at that pace
/// rather than churning. None while the pool is paused.
pub(super) fn sharing_an_address<'a>(
    seen: &Observed<'a>,
    health: &[Health],
    stale: &Stale<'_>,
) -> Replacements<'a> {
    let mut out = Replacements::default();
    if seen.spec.paused {
        return out;
    }
    let now = seen.now;
    let n = seen.placements();
    for m in seen
        .live
        .iter()
        .filter(|m| seen.shared.contains_key(&*m.name))
    {
        if stale.contains_key(m.name.as_str()) || out.members.contains(&&*m.name) {
            continue;
        }
        let Some(i) = m.placement.filter(|&i| i < n) else {
            continue;
        };
        if health[i].degraded() {
            let wait = failed_replacement_backoff(health[i].shared_replacements).as_secs() as i64;
            let since = m.running_since.or(m.created_at).unwrap_or(now);
            if now.saturating_sub(since) < wait {
                out.wait(since + wait - now);
                continue;
            }
        }
        out.members.push(&m.name);
    }
    out
}
