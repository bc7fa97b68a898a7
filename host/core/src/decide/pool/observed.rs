//! The pool's members as one decision sees them: which are live and which draining, and which
//! count as available (with `distinctEgress`, an address counts once). Every step reads this;
//! none changes it.

use crate::model::pool::*;
use std::collections::{BTreeMap, BTreeSet};

/// The members of one decision, told apart once: live or draining, and which share an address.
pub(super) struct Observed<'a> {
    pub spec: &'a PoolSpec,
    /// Unix seconds.
    pub now: i64,
    /// Neither being deleted nor draining: the members counted and chosen.
    pub live: Vec<&'a Member>,
    /// Draining members are on their way out: apart from the rest, neither counted nor chosen.
    pub draining: Vec<&'a Member>,
    /// Live members whose address an older available member has, each with that address
    /// ([`shared_egress`]).
    pub shared: BTreeMap<&'a str, &'a str>,
    /// Cordoned live members whose address counts with another member ([`cordoned_duplicates`]).
    pub duplicates: BTreeSet<&'a str>,
}

impl<'a> Observed<'a> {
    pub fn new(spec: &'a PoolSpec, members: &'a [Member], now: i64) -> Self {
        let live: Vec<&Member> = members
            .iter()
            .filter(|m| !m.deleting && m.retiring.is_none())
            .collect();
        let draining: Vec<&Member> = members
            .iter()
            .filter(|m| !m.deleting && m.retiring.is_some())
            .collect();
        let shared = shared_egress(spec, &live);
        let duplicates = cordoned_duplicates(spec, &live);
        Self {
            spec,
            now,
            live,
            draining,
            shared,
            duplicates,
        }
    }

    /// The number of placements.
    pub fn placements(&self) -> usize {
        self.spec.placements.len()
    }

    /// Whether `m` counts toward the floor. A cordoned member that serves still counts: a
    /// cordon is a voluntary disruption (it is out of discovery and new leases, replaced first,
    /// drained while leased, and goes only while the floor holds), not a failure. With
    /// distinctEgress, one on an address another member has does not count twice.
    pub fn available(&self, m: &Member) -> bool {
        m.available && !self.shared.contains_key(&*m.name) && !self.duplicates.contains(&*m.name)
    }

    /// How many live members count toward the floor now.
    pub fn available_count(&self) -> usize {
        self.live.iter().filter(|m| self.available(m)).count()
    }

    /// The live members of placement `i`.
    pub fn of_placement(&self, i: usize) -> impl Iterator<Item = &'a Member> + '_ {
        self.live
            .iter()
            .copied()
            .filter(move |m| m.placement == Some(i))
    }

    /// Available, on an address no other live member has and none of its placement's run of
    /// shared ones (`known_shared`).
    pub fn unique(&self, m: &Member, known_shared: &[String]) -> bool {
        self.available(m)
            && m.egress_ip.as_deref().is_some_and(|ip| {
                !known_shared.iter().any(|s| s == ip)
                    && self
                        .live
                        .iter()
                        .filter(|o| o.name != m.name)
                        .all(|o| o.egress_ip.as_deref() != Some(ip))
            })
    }
}

/// The names of the members that count toward the floor as [`super::decide`] counts them:
/// available (cordoned or not: a cordoned member serves until it is replaced), not being
/// deleted, and with `distinctEgress` not on an address another member counts already. What a
/// harness that checks the floor must count.
pub fn counted_available<'a>(spec: &PoolSpec, members: &'a [Member]) -> BTreeSet<&'a str> {
    let live: Vec<&Member> = members.iter().filter(|m| !m.deleting).collect();
    let shared = shared_egress(spec, &live);
    let duplicates = cordoned_duplicates(spec, &live);
    live.iter()
        .filter(|m| m.available)
        .filter(|m| !shared.contains_key(m.name.as_str()) && !duplicates.contains(m.name.as_str()))
        .map(|m| m.name.as_str())
        .collect()
}

/// With `distinctEgress`, the cordoned available members whose egress address a member that
/// is not cordoned has, or an older cordoned one: they serve, but their address counts once,
/// with the member that stays. (They are not replaced for sharing: their cordon replaces
/// them already.)
fn cordoned_duplicates<'a>(spec: &PoolSpec, live: &[&'a Member]) -> BTreeSet<&'a str> {
    let mut out = BTreeSet::new();
    if !spec.distinct_egress {
        return out;
    }
    let mut seen: BTreeSet<&str> = live
        .iter()
        .filter(|m| m.available && !m.cordoned)
        .filter_map(|m| m.egress_ip.as_deref())
        .collect();
    let mut cordoned: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| m.available && m.cordoned && m.egress_ip.is_some())
        .collect();
    cordoned.sort_by_key(oldest_first);
    for m in cordoned {
        if let Some(ip) = m.egress_ip.as_deref()
            && !seen.insert(ip)
        {
            out.insert(m.name.as_str());
        }
    }
    out
}

/// With `distinctEgress`, the members whose egress address an older available member (by
/// creation, then name) already has, each with that address. The oldest holder of an
/// address keeps it; without `distinctEgress`, none.
fn shared_egress<'a>(spec: &PoolSpec, live: &[&'a Member]) -> BTreeMap<&'a str, &'a str> {
    let mut out = BTreeMap::new();
    if !spec.distinct_egress {
        return out;
    }
    let mut holders: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| m.available && !m.cordoned && m.egress_ip.is_some())
        .collect();
    holders.sort_by_key(oldest_first);
    let mut seen = BTreeSet::new();
    for m in holders {
        if let Some(ip) = m.egress_ip.as_deref()
            && !seen.insert(ip)
        {
            out.insert(m.name.as_str(), ip);
        }
    }
    out
}

/// Oldest first: by creation time, and within one second by serial, the order the pool made
/// them in.
fn oldest_first(m: &&Member) -> (i64, u64, String) {
    (
        m.created_at.unwrap_or(i64::MIN),
        m.serial.unwrap_or(0),
        m.name.clone(),
    )
}
