//! A dry-run's crawl (the world's `crawl`, [`egress_control::crawl`]): every simulated minute,
//! each crawling pool's members as the run tracks them take the minute's requests, and the
//! crawler's reports of the targets' refusals are recorded on them as the lease API records a
//! report (the core's `report`: once per holder and quarantine, within the holder's rate),
//! a member quarantined by `replaceAfterTargets` targets at once cordoned to be replaced. The
//! pools then decide over what the records say.

use super::pools::PoolRun;
use super::report::ReportEvent;
use super::tracked::Tracked;
use egress_control::crawl::{Crawl, CrawlMember};
use egress_core::discovery::CORDON_ANNOTATION;
use egress_core::target::{
    Cooldowns, Quarantine, QuarantinePolicy, Reported, Signal, TargetView, pool_targets, report,
    to_replace,
};
use std::collections::BTreeMap;

/// Who the crawler's reports are counted for.
const HOLDER: &str = "crawler";

/// Routable: ready, and neither cordoned, being deleted, released nor draining.
fn usable(t: &Tracked) -> bool {
    let meta = &t.proxy.metadata;
    !t.released
        && !t.deleting
        && egress_core::reconcile::ready_is_true(&t.status)
        && meta
            .annotations
            .get(CORDON_ANNOTATION)
            .is_none_or(|v| v != "true")
        && egress_core::pool::retiring(&meta.annotations).is_none()
}

/// The pool's members that count toward its cap, by tracked key.
fn records<'a>(
    run: &PoolRun,
    tracked: &'a BTreeMap<String, Tracked>,
) -> Vec<(&'a String, &'a Tracked)> {
    tracked
        .iter()
        .filter(|(_, t)| run.owns(t) && !t.released && !t.deleting)
        .collect()
}

/// The pool's targets as `members`' records say at `now`, its cap applied.
fn views_of(
    members: &[(&String, &Tracked)],
    policy: &QuarantinePolicy,
    now: i64,
) -> BTreeMap<String, TargetView> {
    pool_targets(
        members.iter().map(|(_, t)| {
            (
                t.proxy.metadata.name.as_str(),
                t.status.quarantines.as_slice(),
            )
        }),
        members.len(),
        policy.max_quarantined_percent,
        now,
    )
}

/// One minute of every crawling pool's crawl, ending at `now_ms`.
pub(super) fn minute(
    crawl: &mut Crawl,
    pools: &mut [PoolRun],
    tracked: &mut BTreeMap<String, Tracked>,
    now_ms: u64,
    at: &str,
    seq: &mut dyn FnMut() -> u64,
) {
    let now = (now_ms / 1000) as i64;
    for run in pools.iter_mut() {
        let key = run.key();
        if !crawl.crawls(&key) {
            continue;
        }
        let policy = run.pool.spec.quarantine_policy();
        let cooldowns = Cooldowns::of(&policy);
        let members = records(run, tracked);
        let views = views_of(&members, &policy, now);
        let seen: Vec<CrawlMember<'_>> = members
            .iter()
            .map(|(_, t)| CrawlMember {
                name: &t.proxy.metadata.name,
                address: t
                    .status
                    .egress_ip
                    .as_deref()
                    .or(t.status.ip.as_deref())
                    .unwrap_or(&t.proxy.metadata.name),
                usable: usable(t),
            })
            .collect();
        // What the gateways would tell the pool, and whether they would hold the minute's
        // requests: an autoscaled pool with no member to route to, waking within its
        // coldStartWait.
        let tunnels = crawl.in_flight(&key, now);
        run.set_demand(egress_core::autoscale::Demand {
            tunnels,
            ..Default::default()
        });
        let hold = match &run.pool.spec.autoscale {
            Some(a) if tunnels > 0 && !seen.iter().any(|m| m.usable) => {
                let since = *run.cold_since.get_or_insert(now);
                now.saturating_sub(since) <= a.cold_start_wait().as_secs() as i64
            }
            _ => {
                run.cold_since = None;
                false
            }
        };
        let refusals = crawl.minute(&key, &seen, &views, now, hold);
        let by_name: BTreeMap<String, String> = members
            .iter()
            .map(|(k, t)| (t.proxy.metadata.name.clone(), (*k).clone()))
            .collect();
        let mut changed = false;
        for r in refusals {
            let Some(k) = by_name.get(&r.member) else {
                continue;
            };
            let in_pool: Vec<Quarantine> = by_name
                .values()
                .filter_map(|k| tracked.get(k))
                .flat_map(|t| t.status.quarantines.iter().cloned())
                .collect();
            let Some(t) = tracked.get_mut(k) else {
                continue;
            };
            let signal = Signal {
                member: &r.member,
                target: &r.target,
                holder: HOLDER,
                retry_after: None,
            };
            if let Reported::Quarantined { records, .. } =
                report(&t.status.quarantines, &in_pool, &signal, &cooldowns, now)
            {
                t.status.quarantines = records;
                crawl.quarantined(&key, &r.target);
                changed = true;
            }
        }
        if !changed {
            continue;
        }
        run.touch();
        // Quarantined by enough targets at once: cordoned, replaced through the budget.
        let views = views_of(&records(run, tracked), &policy, now);
        for name in to_replace(&views, &policy) {
            let Some(t) = by_name.get(&name).and_then(|k| tracked.get_mut(k)) else {
                continue;
            };
            let a = &mut t.proxy.metadata.annotations;
            if a.get(CORDON_ANNOTATION).is_some_and(|v| v == "true") {
                continue;
            }
            a.insert(CORDON_ANNOTATION.into(), "true".into());
            run.events.push(ReportEvent {
                at: at.to_string(),
                at_ms: now_ms,
                seq: seq(),
                warning: true,
                reason: "Cordoned".into(),
                message: format!(
                    "{name}: quarantined by {} targets at once (quarantine.replaceAfterTargets)",
                    policy.replace_after_targets
                ),
            });
        }
    }
}
