//! How many members an autoscaled pool keeps, from its demand and what the last decision
//! recorded: up at once to what the demand needs, down only once the demand has stayed below
//! the pool's size for `idleAfter`, and then to the most it needed over that time (as a
//! HorizontalPodAutoscaler's scale-down stabilisation window does), so a demand that comes and
//! goes within the window never makes the pool flap.
//!
//! Which members go is the pool's decision ([`crate::decide::pool`]): the ones that serve no
//! lease first, each within the floor and the budget, a leased one only draining. The floor
//! itself follows the size decided here: members the demand no longer needs are not a floor
//! to keep.

use crate::model::autoscale::{AutoscalePolicy, AutoscaleStatus, Demand};
use crate::model::pool::{Decision, Member, PoolSpec, PoolStatus};
use std::time::Duration;

/// The members `demand` needs, within the policy's bounds.
pub fn needed(policy: &AutoscalePolicy, demand: &Demand) -> u32 {
    let tunnels = demand
        .tunnels
        .saturating_add(demand.waiting_tunnels)
        .div_ceil(policy.tunnels_per_member());
    let leases = demand
        .leases
        .saturating_add(demand.waiting_leases)
        .div_ceil(policy.leases_per_member());
    within(policy, tunnels.max(leases))
}

/// `n` within `[minReplicas, maxReplicas]` (a max below the min, which validation refuses,
/// reads as the min).
fn within(policy: &AutoscalePolicy, n: u32) -> u32 {
    n.min(policy.max_replicas).max(policy.min_replicas)
}

/// What one autoscale decision says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scaled {
    pub status: AutoscaleStatus,
    /// Unix seconds: when the pool may shrink, absent a change of demand (none while the
    /// demand needs every member it has).
    pub shrink_at: Option<i64>,
}

/// The pool's size now, from `demand` and the status the last decision left (`prior`; none
/// for a pool's first decision, which starts at what the demand needs).
pub fn autoscale(
    policy: &AutoscalePolicy,
    demand: &Demand,
    prior: Option<&AutoscaleStatus>,
    now: i64,
) -> Scaled {
    let need = needed(policy, demand);
    let idle = policy.idle_after().as_secs() as i64;
    let at = |replicas: u32, peak: u32, since: i64| AutoscaleStatus {
        replicas,
        needed: need,
        peak,
        since: Some(egress_time::format_rfc3339(since)),
        demand: *demand,
    };
    let Some(prior) = prior else {
        return Scaled {
            status: at(need, 0, now),
            shrink_at: None,
        };
    };
    let current = within(policy, prior.replicas);
    if need >= current {
        // Every member is needed: a peak of the whole size, so the window of "below" starts
        // at the next decision that sees less.
        return Scaled {
            status: at(need, need, now),
            shrink_at: None,
        };
    }
    let (since, peak) = if prior.peak >= current {
        // The first decision to see the demand below the size: the window starts now.
        (now, need)
    } else {
        let since = prior
            .since
            .as_deref()
            .and_then(egress_time::parse_rfc3339)
            .filter(|s| *s <= now)
            .unwrap_or(now);
        // The most it needed while below, never above what it has (a changed max may lower
        // both).
        (since, prior.peak.max(need).min(current))
    };
    if now.saturating_sub(since) >= idle {
        let replicas = peak;
        let shrink_at = (replicas > need).then(|| now.saturating_add(idle));
        return Scaled {
            status: at(replicas, need, now),
            shrink_at,
        };
    }
    Scaled {
        status: at(current, peak, since),
        shrink_at: Some(since.saturating_add(idle)),
    }
}

/// The live leases on a pool's members: demand whoever reports it, so a leased pool never
/// shrinks under its holders for want of a report.
pub fn leases_held(members: &[Member], now: i64) -> u32 {
    let n: usize = members
        .iter()
        .filter(|m| !m.deleting)
        .map(|m| m.leases.iter().filter(|l| l.holds && l.live(now)).count())
        .sum();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The replicas pool `spec` works to under `status` (an autoscaled pool's decided size), and
/// its floor (those less `maxUnavailable`).
pub fn replicas_and_floor(spec: &PoolSpec, status: &PoolStatus) -> (u32, u32) {
    let replicas = status
        .autoscale
        .as_ref()
        .filter(|_| spec.autoscale.is_some())
        .map_or(spec.replicas, |a| a.replicas);
    let sized = PoolSpec {
        replicas,
        ..spec.clone()
    };
    let unavailable = crate::decide::pool::budgets(&sized).1 as u32;
    (replicas, replicas.saturating_sub(unavailable))
}

/// [`crate::decide::pool::decide`] for a pool as its demand sizes it: with `spec.autoscale`,
/// the replicas are [`autoscale`]'s (from `demand`, the leases its members hold, and
/// `prior.autoscale`), recorded in `status.autoscale`, and the pool is looked at again when
/// it may shrink. Without, `decide` as it is.
pub fn decide(
    spec: &PoolSpec,
    revisions: &[String],
    members: &[Member],
    prior: &PoolStatus,
    demand: Demand,
    now: i64,
) -> Decision {
    let Some(policy) = &spec.autoscale else {
        return crate::decide::pool::decide(spec, revisions, members, prior, now);
    };
    let mut demand = demand;
    demand.leases = demand.leases.max(leases_held(members, now));
    let scaled = autoscale(policy, &demand, prior.autoscale.as_ref(), now);
    let sized = PoolSpec {
        replicas: scaled.status.replicas,
        ..spec.clone()
    };
    let mut d = crate::decide::pool::decide(&sized, revisions, members, prior, now);
    d.status.autoscale = Some(scaled.status);
    if let Some(at) = scaled.shrink_at {
        let after = Duration::from_secs(at.saturating_sub(now).max(1) as u64);
        d.requeue_after = Some(d.requeue_after.map_or(after, |r| r.min(after)));
    }
    d
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const IDLE: i64 = 600;

    fn policy(min: u32, max: u32) -> AutoscalePolicy {
        AutoscalePolicy {
            min_replicas: min,
            max_replicas: max,
            tunnels_per_member: Some(1),
            leases_per_member: None,
            idle_after: Some("10m".into()),
            cold_start_wait: None,
        }
    }

    fn tunnels(n: u32) -> Demand {
        Demand {
            tunnels: n,
            ..Demand::default()
        }
    }

    /// Every state of a small pool: bounds, the size it has, the peak of its window, the
    /// demand now, and how long it has been below; the rules hold in each.
    #[test]
    fn over_every_state_the_size_follows_the_demand_and_never_flaps() {
        let now = 1_000_000;
        let mut states = 0;
        for min in 0..=2 {
            for max in min..=4 {
                let p = policy(min, max);
                for had in 0..=5u32 {
                    for peak in 0..=5u32 {
                        for asked in 0..=6u32 {
                            for ago in [0, 1, IDLE - 1, IDLE, IDLE + 1, 10 * IDLE] {
                                states += 1;
                                let prior = AutoscaleStatus {
                                    replicas: had,
                                    peak,
                                    since: Some(egress_time::format_rfc3339(now - ago)),
                                    ..AutoscaleStatus::default()
                                };
                                let s = autoscale(&p, &tunnels(asked), Some(&prior), now);
                                let r = s.status.replicas;
                                let need = asked.clamp(min, max);
                                let current = had.clamp(min, max);
                                let case = format!(
                                    "min {min} max {max} had {had} peak {peak} asked {asked} ago {ago}: {s:?}"
                                );
                                // Within the bounds, and never below what is asked now.
                                assert!(r >= min && r <= max, "{case}");
                                assert!(r >= need, "{case}");
                                assert_eq!(s.status.needed, need, "{case}");
                                if need >= current {
                                    // Up (or level) at once, to exactly what is asked.
                                    assert_eq!(r, need, "{case}");
                                    assert_eq!(s.shrink_at, None, "{case}");
                                    assert_eq!(s.status.peak, r, "{case}");
                                } else if peak >= current {
                                    // The first decision below: the window starts now.
                                    assert_eq!(r, current, "{case}");
                                    assert_eq!(s.shrink_at, Some(now + IDLE), "{case}");
                                } else if ago < IDLE {
                                    // Below for less than idleAfter: nothing goes.
                                    assert_eq!(r, current, "{case}");
                                    assert_eq!(s.shrink_at, Some(now - ago + IDLE), "{case}");
                                } else {
                                    // Down, to the most asked over the window, never to less.
                                    assert_eq!(r, peak.max(need).min(current), "{case}");
                                    assert!(r <= current, "{case}");
                                    assert_eq!(s.shrink_at.is_some(), r > need, "{case}");
                                    assert_eq!(
                                        s.status.since,
                                        Some(egress_time::format_rfc3339(now))
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(states, 12 * 36 * 7 * 6);
    }

    #[test]
    fn a_pool_at_zero_wakes_on_one_waiting_tunnel_or_lease_and_sleeps_after_idle() {
        let p = policy(0, 10);
        let waiting = Demand {
            waiting_tunnels: 1,
            ..Demand::default()
        };
        let s = autoscale(&p, &Demand::default(), None, 0);
        assert_eq!(s.status.replicas, 0);
        let s = autoscale(&p, &waiting, Some(&s.status), 10);
        assert_eq!(s.status.replicas, 1);
        let lease = Demand {
            waiting_leases: 3,
            ..Demand::default()
        };
        let s = autoscale(&p, &lease, Some(&s.status), 20);
        assert_eq!(s.status.replicas, 3);
        // The crawl stops at 30: the pool keeps its 3 until 30 + idleAfter, then goes to 0.
        let mut st = s.status;
        for t in (30..30 + IDLE).step_by(15) {
            let s = autoscale(&p, &Demand::default(), Some(&st), t);
            assert_eq!(s.status.replicas, 3, "at {t}");
            assert_eq!(s.shrink_at, Some(30 + IDLE));
            st = s.status;
        }
        let s = autoscale(&p, &Demand::default(), Some(&st), 30 + IDLE);
        assert_eq!(s.status.replicas, 0);
        assert_eq!(s.shrink_at, None);
    }

    #[test]
    fn a_demand_that_comes_and_goes_within_the_window_keeps_the_size_it_peaked_at() {
        let p = policy(0, 20);
        let mut st = autoscale(&p, &tunnels(10), None, 0).status;
        // From 1 to 6 and back, every minute, for an hour: down once to 6 after idleAfter,
        // then no further.
        let mut sizes = Vec::new();
        for minute in 1..=60 {
            let asked = if minute % 2 == 0 { 6 } else { 1 };
            st = autoscale(&p, &tunnels(asked), Some(&st), minute * 60).status;
            sizes.push(st.replicas);
        }
        assert!(sizes.iter().all(|s| *s == 10 || *s == 6), "{sizes:?}");
        assert_eq!(sizes.last(), Some(&6));
        let changes = sizes.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(changes, 1, "{sizes:?}");
    }

    #[test]
    fn leases_and_tunnels_each_size_the_pool_by_their_own_target() {
        let p = AutoscalePolicy {
            tunnels_per_member: Some(16),
            leases_per_member: Some(2),
            ..policy(0, 100)
        };
        let d = Demand {
            tunnels: 33,
            waiting_tunnels: 0,
            leases: 5,
            waiting_leases: 2,
        };
        assert_eq!(needed(&p, &d), 4); // 7 leases at 2 a member, 33 tunnels at 16 is 3
        let d = Demand { tunnels: 65, ..d };
        assert_eq!(needed(&p, &d), 5);
        let flood = Demand {
            tunnels: u32::MAX,
            waiting_tunnels: u32::MAX,
            ..d
        };
        assert_eq!(needed(&p, &flood), 100);
    }
}
