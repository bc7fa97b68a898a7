//! ProxyPool: `replicas` proxies spread over providers by weight, rolled when the template or a
//! placement's provider changes and rotated by age, surge first. The rule, as for Kubernetes'
//! Deployments and disruption budgets: **the pool's own decisions never take its available
//! members below `replicas - maxUnavailable`**; only involuntary failures can, and the pool then
//! replaces them within its surge. Rotation is just another reason for a proxy to be out of
//! date, so it spends the same budget and never fires all at once.
//!
//! "Available" is not "Ready this instant": a member counts from its first verified check until
//! it has failed the egress check's `failureThreshold` checks in a row (see
//! [`crate::decide::egress::available`]), so a blip, an API error or an echo outage moves nothing. A
//! member that never served (still starting) or that failed past the threshold is disposable.
//!
//! A placement whose creates keep failing (a permanent failure at once; quota or capacity after
//! `spillAfter`) lends its share to the others within their `maxReplicas`, keeps one member
//! trying (its probe, beside `replicas` and the surge), and takes its share back once a member
//! of it serves again. A member held in a permanent failure is replaced by the pool after a
//! backoff that doubles per failure of its placement.
//!
//! [`decide`] is pure: the pool's spec, its Proxies as observed, what its last status recorded,
//! the current revision of each placement and the time in; creates, deletes and the status out.
//! The operator and the CLI carry them out.
//!
//! [`decide`] reads as its steps, each a function of its own module:
//!
//! 1. `health`: each placement's health, degraded while its creates fail;
//! 2. `shares`: the placements' shares, a degraded one lending what of it does not serve;
//! 3. `replace`: a member in a permanent failure past its backoff, and with distinctEgress
//!    one on an address an older member has, make way for new ones;
//! 4. `probe`: a degraded placement keeps one member trying;
//! 5. `scale`: the members beyond `replicas`, and the serving ones beyond their placement's
//!    share;
//! 6. `rollout` and `scale`: the stale members that serve no one go, then the scaled-down
//!    ones within the floor;
//! 7. `rollout`: the stale members that serve go within the floor, the leased ones draining;
//!    drains end;
//! 8. `create`: new members within maxSurge, and the probes.
//!
//! Then `status`, the record of lost leases (`lost`) and when to decide again
//! (`requeue`). Why a member is stale (`stale`) starts with the rollout's reasons and is
//! added to by steps 3 to 5; every step reads the members through one `observed` view and
//! returns what it decides, which [`decide`] alone puts together.

mod budgets;
mod create;
mod health;
mod lost;
mod members;
mod observed;
mod probe;
mod removals;
mod replace;
mod requeue;
mod revision;
mod rollout;
mod scale;
mod shares;
mod stale;
mod status;
mod validate;

pub use budgets::{age_limit, budgets, failed_replacement_backoff, spill_after};
pub use members::{member, member_name, member_proxy, member_serial, retiring};
pub use observed::counted_available;
pub use revision::{revision, revisions};
pub use shares::targets;
pub use validate::{Environment, validate, validate_in};

use crate::model::pool::*;
use observed::Observed;
use removals::Removals;

/// Decides one step of the pool. `revisions[i]` is placement i's current [`revision`]; `prior`
/// is the status the last decision left (which placements are degraded, since when, and how
/// many failed members each replaced); `now` is Unix seconds.
pub fn decide(
    spec: &PoolSpec,
    revisions: &[String],
    members: &[Member],
    prior: &PoolStatus,
    now: i64,
) -> Decision {
    let replicas = spec.replicas as usize;
    let (surge, unavailable) = budgets(spec);
    let min_available = replicas.saturating_sub(unavailable);
    let seen = Observed::new(spec, members, now);
    let spill = spill_after(spec).as_secs() as i64;
    let mut stale = stale::rollout_reasons(&seen, revisions);

    // 1 to 5: which members are stale, and why.
    let health = health::placement_health(&seen, prior, spill);
    let shares = shares::lent_shares(&seen, &health, &stale);
    let failed = replace::failed(&seen, &health, &stale);
    stale::mark(&mut stale, &failed.members, DeleteReason::Failed);
    let sharing = replace::sharing_an_address(&seen, &health, &stale);
    stale::mark(&mut stale, &sharing.members, DeleteReason::SharedEgress);
    let probes = probe::keep_probes(&seen, &health, &stale);
    stale::mark(&mut stale, &probes.rebalanced, DeleteReason::Rebalanced);
    let scale = scale::scale_down(&seen, &stale, &probes.kept, &shares.target);
    stale::mark(&mut stale, &scale.out_of_place, DeleteReason::Rebalanced);

    // 6 to 8: what goes, within the floor, and what is made, within the surge. A paused pool
    // does neither.
    let retire_at = now.saturating_add(drain_timeout(spec).as_secs() as i64);
    let (removals, creates) = if spec.paused {
        (Removals::default(), Vec::new())
    } else {
        let room = seen.available_count().saturating_sub(min_available);
        let stale_members = rollout::stale_members(&seen, &stale);
        let not_serving = rollout::remove_not_serving(&seen, &stale_members);
        let scaled = scale::remove_scaled_down(&seen, &scale.scaled_down, room);
        let serving = rollout::remove_serving(&seen, &stale_members, room - scaled.spent);
        let mut current = scale.current.clone();
        current.retain(|m| !scaled.removes(&m.name));
        let live = not_serving.then(scaled).then(serving);
        let going = live.deletes.len() + live.drains.len();
        let removals = live.then(rollout::end_drains(&seen));
        let creates = create::new_members(
            &seen,
            &create::Room {
                revisions,
                surge,
                shares: &shares,
                health: &health,
                probes: &probes.kept,
                current: &current,
                going,
                deletes: &removals.deletes,
            },
        );
        (removals, creates)
    };

    let counts = status::Counts::of(&seen, members, &stale, min_available, removals.drains.len());
    let mut status = status::status(
        &seen,
        prior,
        counts,
        &health,
        &shares.target,
        &creates,
        &removals.deletes,
    );
    status.leased_replicas = seen.live.iter().filter(|m| m.leased(now)).count() as u32;
    // The targets that quarantine its members, the cap applied over the members it has.
    let percent = spec.quarantine_policy().max_quarantined_percent;
    let views = crate::decide::quarantine::pool_targets(
        seen.live
            .iter()
            .map(|m| (m.name.as_str(), m.quarantines.as_slice())),
        seen.live.len(),
        percent,
        now,
    );
    (status.targets, status.other_targets) = crate::decide::quarantine::targets_status(&views);
    status
        .conditions
        .extend(crate::decide::quarantine::target_blocked(
            &views,
            percent,
            &prior.conditions,
        ));
    let failed_due = [failed.next_due, sharing.next_due]
        .into_iter()
        .flatten()
        .min();
    let requeue_after =
        requeue::requeue_after(&seen, &stale, spill, failed_due, &removals, retire_at);
    let Removals {
        deletes,
        drains,
        mut lost,
        ..
    } = removals;
    lost.extend(lost::seen_lost(members, now));
    status.lost_leases = lost::lost_record(prior, members, &deletes, lost, now);
    Decision {
        creates,
        deletes,
        drains,
        retire_at,
        status,
        requeue_after,
    }
}

#[cfg(test)]
mod tests;
