//! Quarantine per member and target: a target that refuses a member's address (a ban a
//! crawler reports, or a 403/429/503 the gateway relays) keeps new traffic for that target off
//! the member for a cooldown that doubles with each quarantine in a row, while every other
//! target keeps using it.
//!
//! Two bounds keep one site from costing the pool what other sites still accept:
//! - **the cap per target**: at most `maxQuarantinedPercent` of the pool's members are
//!   quarantined for one target at once (the earliest signalled first). Past it, signals are
//!   recorded but quarantine no one, and the pool says the target is blocked, as a
//!   MachineHealthCheck stops remediating at `maxUnhealthy`;
//! - **replacement only by many targets**: a member is replaced only when quarantined by
//!   `replaceAfterTargets` distinct targets at once, and then through the pool's budget.
//!
//! The cap is applied where the records are read ([`pool_targets`]), not only where they are
//! written: two writers racing on two members each see the other's record as it was, and could
//! both pass a cap checked at write time; read with a total order, the records give every
//! gateway replica, the operator and a plan the same quarantined set.
//!
//! Everything here is pure: the records, the policy and the time in; the new records and the
//! routing view out.

use crate::model::lease::{BanReport, holder_digest};
use crate::model::pool::{TARGETS_SHOWN, TargetStatus};
use crate::model::proxy::Condition;
use crate::model::target::{
    QUARANTINES_KEPT, Quarantine, QuarantinePolicy, REPORT_WINDOW, REPORTERS_KEPT,
    REPORTS_PER_WINDOW,
};
use egress_time::{format_rfc3339, parse_rfc3339};
use std::collections::BTreeMap;
use std::time::Duration;

/// A policy's cooldowns, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cooldowns {
    pub base: Duration,
    pub max: Duration,
}

impl Cooldowns {
    /// The policy's, or the defaults' where the policy cannot be read (validation refuses such
    /// a pool before anything acts on it).
    pub fn of(policy: &QuarantinePolicy) -> Self {
        let (base, max) = policy.cooldowns().unwrap_or_else(|_| {
            QuarantinePolicy::default()
                .cooldowns()
                .unwrap_or((Duration::from_secs(300), Duration::from_secs(6 * 3600)))
        });
        Self { base, max }
    }
}

/// The `strikes`th quarantine in a row of member `member` for `target`: `base` doubled per
/// strike before it, ±10% by a jitter fixed per member, target and strike (so two replicas, or
/// two runs of a plan, agree), at most `max`; at least what the target's `Retry-After` asked,
/// within `max` too.
pub fn cooldown(
    c: &Cooldowns,
    strikes: u32,
    member: &str,
    target: &str,
    retry_after: Option<Duration>,
) -> Duration {
    let doublings = strikes.saturating_sub(1).min(32);
    let grown = c.base.saturating_mul(1u32 << doublings.min(31)).min(c.max);
    let j = jitter(member, target, strikes); // in [-0.1, 0.1)
    let jittered = grown.mul_f64(1.0 + j).min(c.max);
    jittered.max(retry_after.unwrap_or_default().min(c.max))
}

fn jitter(member: &str, target: &str, strikes: u32) -> f64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(member.as_bytes());
    h.update([0]);
    h.update(target.as_bytes());
    h.update(strikes.to_be_bytes());
    let d = h.finalize();
    let n = u16::from_be_bytes([d[0], d[1]]) as f64 / 65536.0; // [0, 1)
    (n - 0.5) / 5.0
}

fn at(s: &str) -> i64 {
    parse_rfc3339(s).unwrap_or(0)
}

/// Whether record `q` quarantines at `now`.
pub fn active(q: &Quarantine, now: i64) -> bool {
    at(&q.until) > now
}

/// `records` without those forgotten (quiet for `max` past their end) and within
/// [`QUARANTINES_KEPT`]: the ones ending soonest go first, ended ones before any that holds.
pub fn prune(records: &[Quarantine], c: &Cooldowns, now: i64) -> Vec<Quarantine> {
    let forget = c.max.as_secs() as i64;
    let mut kept: Vec<Quarantine> = records
        .iter()
        .filter(|q| at(&q.until).saturating_add(forget) > now)
        .cloned()
        .collect();
    if kept.len() > QUARANTINES_KEPT {
        kept.sort_by(|a, b| {
            (active(b, now), at(&b.until), &b.target).cmp(&(
                active(a, now),
                at(&a.until),
                &a.target,
            ))
        });
        kept.truncate(QUARANTINES_KEPT);
        kept.sort_by(|a, b| a.target.cmp(&b.target));
    }
    kept
}

/// What a report does to a member's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// The member is quarantined for the target until `until` (Unix seconds); `records` are its
    /// records to write (a new quarantine, or this holder added to the one that holds).
    Quarantined {
        records: Vec<Quarantine>,
        until: i64,
    },
    /// This holder reported the quarantine that holds already: nothing to write.
    Repeated { until: i64 },
    /// This holder reported [`REPORTS_PER_WINDOW`] times in the pool within [`REPORT_WINDOW`]:
    /// not counted.
    OverRate,
}

/// A signal that a target refused a member's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal<'a> {
    /// The member's name.
    pub member: &'a str,
    /// The target ([`crate::model::target::target_of`]).
    pub target: &'a str,
    /// Who signalled: the caller whose request was refused.
    pub holder: &'a str,
    /// What the target's `Retry-After` asked, if it said.
    pub retry_after: Option<Duration>,
}

/// Signal `s` at `now`, on a member with records `records`, given every record of the pool
/// (`in_pool`, for the holder's rate).
pub fn report<'a>(
    records: &[Quarantine],
    in_pool: impl IntoIterator<Item = &'a Quarantine>,
    s: &Signal<'_>,
    c: &Cooldowns,
    now: i64,
) -> Reported {
    let Signal {
        member,
        target,
        holder,
        retry_after,
    } = *s;
    let who = holder_digest(holder);
    let mut records = prune(records, c, now);
    let stamp = BanReport {
        reporter: who.clone(),
        at: format_rfc3339(now),
    };
    if let Some(q) = records
        .iter_mut()
        .find(|q| q.target == target && active(q, now))
    {
        let until = at(&q.until);
        let asked = retry_after.map(|r| now.saturating_add(r.min(c.max).as_secs() as i64));
        if q.reporters.iter().any(|r| r.reporter == who) && asked.is_none_or(|a| a <= until) {
            return Reported::Repeated { until };
        }
        // Another holder's signal of the same quarantine: recorded, not lengthened, but for a
        // longer Retry-After, which the target asked for.
        let until = asked.map_or(until, |a| a.max(until));
        q.until = format_rfc3339(until);
        q.reporters.retain(|r| r.reporter != who);
        q.reporters.push(stamp);
        let over = q.reporters.len().saturating_sub(REPORTERS_KEPT);
        q.reporters.drain(..over);
        return Reported::Quarantined { records, until };
    }
    let since = now.saturating_sub(REPORT_WINDOW.as_secs() as i64);
    let recent = in_pool
        .into_iter()
        .flat_map(|q| &q.reporters)
        .filter(|r| r.reporter == who && at(&r.at) > since)
        .count();
    if recent >= REPORTS_PER_WINDOW {
        return Reported::OverRate;
    }
    let strikes = records
        .iter()
        .find(|q| q.target == target)
        .map_or(1, |q| q.strikes.saturating_add(1));
    let until =
        now.saturating_add(cooldown(c, strikes, member, target, retry_after).as_secs() as i64);
    records.retain(|q| q.target != target);
    records.push(Quarantine {
        target: target.to_string(),
        since: format_rfc3339(now),
        until: format_rfc3339(until),
        strikes,
        reporters: vec![stamp],
    });
    records.sort_by(|a, b| a.target.cmp(&b.target));
    let records = prune(&records, c, now);
    Reported::Quarantined { records, until }
}

/// One target as the pool sees it at a time: who is quarantined for it, within the cap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetView {
    /// Members quarantined for it now (the cap applied), with Unix seconds of each one's end.
    pub quarantined: BTreeMap<String, i64>,
    /// Members whose record for it holds now, the cap not applied.
    pub signalled: usize,
    /// Signalled past the cap: some of them quarantine no one.
    pub capped: bool,
}

/// A record as routing reads it, its times parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub target: String,
    /// Unix seconds: when its quarantine began.
    pub since: i64,
    /// Unix seconds: when it ends.
    pub until: i64,
}

impl Hold {
    pub fn of(q: &Quarantine) -> Self {
        Self {
            target: q.target.clone(),
            since: at(&q.since),
            until: at(&q.until),
        }
    }
}

/// Of the members whose record for one target holds (each as when its quarantine began, the
/// member, when it ends), those a cap of `cap` quarantines: the earliest begun first, then by
/// member. The one order every reader applies.
pub fn within_cap<K: Ord>(mut held: Vec<(i64, K, i64)>, cap: usize) -> Vec<(i64, K, i64)> {
    held.sort();
    held.truncate(cap);
    held
}

/// How many of `pool_size` members one target may quarantine at once: `percent`, rounded down.
pub fn cap(pool_size: usize, percent: u32) -> usize {
    pool_size.saturating_mul(percent.min(100) as usize) / 100
}

/// Every target with a record that holds at `now` among `members` (name, records), the cap of
/// `percent` of `pool_size` applied to each in the order their quarantines began (then by
/// member name): the same answer wherever the same records are read.
pub fn pool_targets<'a>(
    members: impl IntoIterator<Item = (&'a str, &'a [Quarantine])>,
    pool_size: usize,
    percent: u32,
    now: i64,
) -> BTreeMap<String, TargetView> {
    let mut holding: BTreeMap<&str, Vec<(i64, &str, i64)>> = BTreeMap::new();
    for (name, records) in members {
        for q in records.iter().filter(|q| active(q, now)) {
            holding
                .entry(q.target.as_str())
                .or_default()
                .push((at(&q.since), name, at(&q.until)));
        }
    }
    let cap = cap(pool_size, percent);
    holding
        .into_iter()
        .map(|(target, held)| {
            let signalled = held.len();
            let view = TargetView {
                signalled,
                capped: signalled > cap,
                quarantined: within_cap(held, cap)
                    .into_iter()
                    .map(|(_, name, until)| (name.to_string(), until))
                    .collect(),
            };
            (target.to_string(), view)
        })
        .collect()
}

/// The members quarantined now by at least `policy.replaceAfterTargets` distinct targets (the
/// cap applied): to be replaced through the pool's budget.
pub fn to_replace(
    targets: &BTreeMap<String, TargetView>,
    policy: &QuarantinePolicy,
) -> Vec<String> {
    if policy.replace_after_targets == 0 {
        return Vec::new();
    }
    let mut by_member: BTreeMap<&str, u32> = BTreeMap::new();
    for view in targets.values() {
        for name in view.quarantined.keys() {
            *by_member.entry(name.as_str()).or_default() += 1;
        }
    }
    by_member
        .into_iter()
        .filter(|(_, n)| *n >= policy.replace_after_targets)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The condition a pool says a target signalled past its cap with.
pub const TARGET_BLOCKED: &str = "TargetBlocked";

/// The pool's targets as its status lists them: those past the cap first, then the most
/// signalled, then by name; at most [`TARGETS_SHOWN`], with how many more there are.
pub fn targets_status(views: &BTreeMap<String, TargetView>) -> (Vec<TargetStatus>, u32) {
    let mut all: Vec<TargetStatus> = views
        .iter()
        .map(|(target, v)| TargetStatus {
            target: target.clone(),
            signalled_replicas: v.signalled as u32,
            quarantined_replicas: v.quarantined.len() as u32,
            cap_reached: v.capped,
        })
        .collect();
    all.sort_by(|a, b| {
        b.cap_reached
            .cmp(&a.cap_reached)
            .then(b.signalled_replicas.cmp(&a.signalled_replicas))
            .then(a.target.cmp(&b.target))
    });
    let others = all.len().saturating_sub(TARGETS_SHOWN) as u32;
    all.truncate(TARGETS_SHOWN);
    (all, others)
}

/// TargetBlocked, as MachineHealthCheck says `maxUnhealthy` stopped it: True while some
/// target signalled more members than `percent` of the pool lets it quarantine (naming the
/// first few), False once none does. None for a pool no target ever blocked (`prior` has no
/// such condition and none does now), so the status of a pool without quarantines is
/// unchanged.
pub fn target_blocked(
    views: &BTreeMap<String, TargetView>,
    percent: u32,
    prior: &[Condition],
) -> Option<Condition> {
    /// Targets a message names at most.
    const NAMED: usize = 5;
    let (listed, _) = targets_status(views);
    let capped: Vec<&TargetStatus> = listed.iter().filter(|t| t.cap_reached).collect();
    let total = views.values().filter(|v| v.capped).count();
    if capped.is_empty() && !prior.iter().any(|c| c.type_ == TARGET_BLOCKED) {
        return None;
    }
    let (status, reason, message) = if capped.is_empty() {
        (
            "False",
            "WithinCap",
            format!(
                "no target signalled more members than maxQuarantinedPercent ({percent}%) lets it quarantine"
            ),
        )
    } else {
        let mut named: Vec<String> = capped
            .iter()
            .take(NAMED)
            .map(|t| {
                format!(
                    "{}: {} members signalled, {} quarantined",
                    t.target, t.signalled_replicas, t.quarantined_replicas
                )
            })
            .collect();
        if total > named.len() {
            named.push(format!("{} more", total - named.len()));
        }
        (
            "True",
            "MaxQuarantinedPercentReached",
            format!(
                "{}; past maxQuarantinedPercent ({percent}%) their signals quarantine no one, and their traffic reaches members they refused",
                named.join("; ")
            ),
        )
    };
    Some(Condition {
        type_: TARGET_BLOCKED.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: String::new(),
    })
}

/// TargetBlocked in `now` when it was not True in `before`: the moment a pool says so in an
/// Event (a Warning), once per blocking rather than at every decision.
pub fn newly_blocked<'a>(before: &[Condition], now: &'a [Condition]) -> Option<&'a Condition> {
    let blocked = |c: &Condition| c.type_ == TARGET_BLOCKED && c.status == "True";
    now.iter()
        .find(|c| blocked(c))
        .filter(|_| !before.iter().any(blocked))
}

#[cfg(test)]
mod tests;
