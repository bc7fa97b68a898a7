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

use crate::model::labels::{PLACEMENT_LABEL, REVISION_ANNOTATION};
use crate::model::pool::*;

use crate::model::proxy::{Condition, Placement};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// Problems in a pool's spec, each naming the field.
pub fn validate(pool: &ProxyPool) -> Vec<String> {
    let mut problems = Vec::new();
    if pool.api_version != crate::model::proxy::API_VERSION {
        problems.push(format!(
            "apiVersion: expected {}, got {:?}",
            crate::model::proxy::API_VERSION,
            pool.api_version
        ));
    }
    if pool.metadata.name.is_empty() || !crate::config::is_dns_label(&pool.metadata.name) {
        problems.push(format!(
            "metadata.name: {:?} is not a DNS label (the pool's Proxies are named after it)",
            pool.metadata.name
        ));
    } else if pool.metadata.name.len() > 63 - 1 - NAME_LEN {
        problems.push(format!(
            "metadata.name: at most {} characters (its Proxies add a suffix)",
            63 - 1 - NAME_LEN
        ));
    }
    let s = &pool.spec;
    if s.replicas > MAX_REPLICAS_CEILING {
        problems.push(format!(
            "spec.replicas: {} is more than {MAX_REPLICAS_CEILING}",
            s.replicas
        ));
    }
    if s.placements.is_empty() {
        problems.push("spec.placements: at least one placement is needed".into());
    }
    if s.placements.len() > MAX_PLACEMENTS {
        problems.push(format!(
            "spec.placements: {} placements, at most {MAX_PLACEMENTS}",
            s.placements.len()
        ));
    }
    for (i, p) in s.placements.iter().enumerate() {
        if p.provider.is_empty() {
            problems.push(format!("spec.placements[{i}].provider: must not be empty"));
        }
        if p.weight == 0 {
            problems.push(format!("spec.placements[{i}].weight: must be at least 1"));
        }
        if p.zones.len() > MAX_ZONES {
            problems.push(format!(
                "spec.placements[{i}].zones: {} zones, at most {MAX_ZONES}",
                p.zones.len()
            ));
        }
    }
    if s.template.port == 0 {
        problems.push("spec.template.port: must be between 1 and 65535".into());
    }
    if s.template.cloud_init.is_some() && s.template.cloud_init_secret_ref.is_some() {
        problems.push("spec.template: cloudInit and cloudInitSecretRef are exclusive".into());
    }
    for (field, v) in [
        ("spec.strategy.maxSurge", &s.strategy.max_surge),
        ("spec.strategy.maxUnavailable", &s.strategy.max_unavailable),
    ] {
        if let Err(m) = v.check(100) {
            problems.push(format!("{field}: {m}"));
        }
    }
    let (surge, unavailable) = budgets(s);
    if s.replicas > 0 && surge == 0 && unavailable == 0 {
        problems.push(
            "spec.strategy: maxSurge and maxUnavailable cannot both be 0: nothing could ever be replaced"
                .into(),
        );
    }
    if let Some(r) = &s.rotation {
        let max_age = match crate::config::parse_duration(&r.max_age) {
            Ok(d) if d.is_zero() => {
                problems.push("spec.rotation.maxAge: must be longer than 0".into());
                None
            }
            Ok(d) => Some(d),
            Err(m) => {
                problems.push(format!("spec.rotation.maxAge: {m}"));
                None
            }
        };
        let jitter = match r.jitter.as_deref().map(crate::config::parse_duration) {
            Some(Ok(j)) => Some(j),
            Some(Err(m)) => {
                problems.push(format!("spec.rotation.jitter: {m}"));
                None
            }
            None => None,
        };
        if let (Some(age), Some(j)) = (max_age, jitter)
            && j >= age
        {
            // An age limit of maxAge - jitter at or below zero rotates a member the moment it
            // is made.
            problems.push(format!(
                "spec.rotation.jitter: {} must be shorter than maxAge ({})",
                r.jitter.as_deref().unwrap_or(""),
                r.max_age
            ));
        }
    }
    if let Some(a) = &s.spill_after
        && let Err(m) = crate::config::parse_duration(a)
    {
        problems.push(format!("spec.spillAfter: {m}"));
    }
    if let Some(a) = &s.drain_timeout {
        match crate::config::parse_duration(a) {
            Ok(d) if d.is_zero() => {
                problems.push("spec.drainTimeout: must be longer than 0".into());
            }
            Ok(_) => {}
            Err(m) => problems.push(format!("spec.drainTimeout: {m}")),
        }
    }
    if let Some(l) = &s.leases {
        if l.max_shared == 0 {
            problems.push("spec.leases.maxShared: must be at least 1".into());
        }
        if l.cordon_after_bans as usize > crate::model::lease::BAN_REPORTS_KEPT {
            problems.push(format!(
                "spec.leases.cordonAfterBans: at most {} (the reports a proxy keeps)",
                crate::model::lease::BAN_REPORTS_KEPT
            ));
        }
        if let Err(m) = l.max_per_holder.check(100) {
            problems.push(format!("spec.leases.maxPerHolder: {m}"));
        }
        let max = crate::config::parse_duration(&l.max_ttl)
            .map_err(|m| problems.push(format!("spec.leases.maxTTL: {m}")))
            .ok();
        let default = crate::config::parse_duration(&l.default_ttl)
            .map_err(|m| problems.push(format!("spec.leases.defaultTTL: {m}")))
            .ok();
        if let (Some(max), Some(default)) = (max, default)
            && default > max
        {
            problems.push(format!(
                "spec.leases.defaultTTL: {} is longer than maxTTL ({})",
                l.default_ttl, l.max_ttl
            ));
        }
    }
    problems
}

/// What a pool is checked against beyond its own spec: the providers config it runs with.
#[derive(Debug, Clone, Copy)]
pub struct Environment<'a> {
    /// The providers config's entry names.
    pub providers: &'a [String],
    /// The egress check's startupTimeout, when the check is configured: how long a member
    /// may take to verify.
    pub startup_timeout: Option<Duration>,
    /// The most replicas a pool may ask for (`--max-replicas`; [`DEFAULT_MAX_REPLICAS`]).
    pub max_replicas: u32,
}

/// [`validate`], and what the installation decides: no more replicas than it allows, every
/// placement names a provider the providers config has, and a member lives long enough to
/// serve before it is rotated (maxAge - jitter at least twice the egress check's
/// startupTimeout, and at least [`MIN_AGE_LIMIT`]); otherwise the surge slot churns forever on
/// members that never serve, and the others are never rotated.
pub fn validate_in(pool: &ProxyPool, env: Environment<'_>) -> Vec<String> {
    let mut problems = validate(pool);
    let s = &pool.spec;
    if s.replicas > env.max_replicas && s.replicas <= MAX_REPLICAS_CEILING {
        problems.push(format!(
            "spec.replicas: {} is more than the {} this installation allows (--max-replicas raises it)",
            s.replicas, env.max_replicas
        ));
    }
    for (i, p) in s.placements.iter().enumerate() {
        if !p.provider.is_empty() && !env.providers.contains(&p.provider) {
            problems.push(format!(
                "spec.placements[{i}].provider: {:?} is not in the providers config (it has {})",
                p.provider,
                if env.providers.is_empty() {
                    "none".to_string()
                } else {
                    env.providers.join(", ")
                }
            ));
        }
    }
    if let Some(r) = &s.rotation
        && let Ok(age) = crate::config::parse_duration(&r.max_age)
    {
        let jitter = r
            .jitter
            .as_deref()
            .and_then(|j| crate::config::parse_duration(j).ok())
            .unwrap_or_default();
        let shortest = age.saturating_sub(jitter);
        let needed = env
            .startup_timeout
            .map_or(MIN_AGE_LIMIT, |t| (t * 2).max(MIN_AGE_LIMIT));
        if jitter < age && shortest < needed {
            problems.push(format!(
                "spec.rotation.maxAge: maxAge - jitter is {}s, shorter than {}s ({}): a member must live long enough to serve before it is rotated",
                shortest.as_secs(),
                needed.as_secs(),
                match env.startup_timeout {
                    Some(t) => format!(
                        "twice the egress check's startupTimeout of {}s",
                        t.as_secs()
                    ),
                    None => "the least the pool allows".to_string(),
                }
            ));
        }
    }
    problems
}

/// The pool's `spillAfter`, parsed (its default when absent or unreadable).
pub fn spill_after(s: &PoolSpec) -> Duration {
    s.spill_after
        .as_deref()
        .and_then(|a| crate::config::parse_duration(a).ok())
        .unwrap_or(DEFAULT_SPILL_AFTER)
}

/// (maxSurge, maxUnavailable) against `replicas`: surge rounded up, unavailability down, as
/// Kubernetes' ResolveFenceposts.
pub fn budgets(s: &PoolSpec) -> (usize, usize) {
    let n = s.replicas as usize;
    (
        s.strategy.max_surge.resolve(n, true),
        s.strategy.max_unavailable.resolve(n, false),
    )
}

/// The revision of what placement `i` makes: the template, the placement and its provider
/// entry's revision. A Proxy of another revision is out of date.
pub fn revision(spec: &PoolSpec, i: usize, provider_revision: &str) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(&spec.template).unwrap_or_default());
    h.update(serde_json::to_vec(&spec.placements.get(i)).unwrap_or_default());
    h.update(provider_revision.as_bytes());
    hex::encode(&h.finalize()[..8])
}

/// How old a member may grow before it is rotated: maxAge moved by a fixed share of ± jitter
/// drawn from its name.
pub fn age_limit(rotation: &Rotation, name: &str) -> Option<i64> {
    let max_age = crate::config::parse_duration(&rotation.max_age)
        .ok()?
        .as_secs() as i64;
    let jitter = rotation
        .jitter
        .as_deref()
        .and_then(|j| crate::config::parse_duration(j).ok())
        .map_or(0, |d| d.as_secs() as i64);
    if jitter == 0 {
        return Some(max_age);
    }
    let h = Sha256::digest(name.as_bytes());
    let unit = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
    // A point in [-jitter, +jitter].
    let span = (2 * jitter + 1) as u64;
    let offset = (unit % span) as i64 - jitter;
    Some((max_age + offset).max(1))
}

/// The integer share of `replicas` each placement gets: by weight, capped by maxReplicas, the
/// rest of a capped placement's share going to the others, remainders by largest fraction
/// (ties to the earlier placement).
pub fn targets(spec: &PoolSpec) -> Vec<usize> {
    let caps: Vec<usize> = spec
        .placements
        .iter()
        .map(|p| p.max_replicas.map_or(usize::MAX, |m| m as usize))
        .collect();
    shares(spec, &caps)
}

/// [`targets`] with each placement capped at `caps[i]`; what no placement has room for is
/// left unassigned.
fn shares(spec: &PoolSpec, caps: &[usize]) -> Vec<usize> {
    let n = spec.placements.len();
    let cap = |i: usize| caps.get(i).copied().unwrap_or(usize::MAX);
    let mut target = vec![0usize; n];
    let mut open: Vec<usize> = (0..n).filter(|&i| cap(i) > 0).collect();
    let mut left = spec.replicas as usize;
    while left > 0 && !open.is_empty() {
        let weight: u64 = open
            .iter()
            .map(|&i| u64::from(spec.placements[i].weight))
            .sum();
        if weight == 0 {
            break;
        }
        // Shares of what is left, as (whole, remainder) by largest remainder.
        let mut shares: Vec<(usize, usize, u64)> = open
            .iter()
            .map(|&i| {
                let w = u64::from(spec.placements[i].weight) * left as u64;
                (i, (w / weight) as usize, w % weight)
            })
            .collect();
        let given: usize = shares.iter().map(|s| s.1).sum();
        let mut by_rest: Vec<usize> = (0..shares.len()).collect();
        by_rest.sort_by(|&a, &b| {
            shares[b]
                .2
                .cmp(&shares[a].2)
                .then(shares[a].0.cmp(&shares[b].0))
        });
        for k in by_rest.into_iter().take(left.saturating_sub(given)) {
            shares[k].1 += 1;
        }
        let mut capped = false;
        for (i, share, _) in shares {
            let room = cap(i).saturating_sub(target[i]);
            let take = share.min(room);
            target[i] += take;
            left -= take;
            if take < share {
                capped = true;
            }
        }
        open.retain(|&i| target[i] < cap(i));
        if !capped {
            break;
        }
    }
    target
}

/// How long the pool waits before replacing a member held in a permanent failure, after
/// `failures` such replacements in its placement in a row.
pub fn failed_replacement_backoff(failures: u32) -> Duration {
    FAILED_REPLACEMENT_BASE
        .saturating_mul(1u32 << failures.min(16))
        .min(FAILED_REPLACEMENT_MAX)
}

/// What a placement's record says and what its members show now.
struct Health {
    /// Unix seconds: since when its creates fail (None: it creates).
    degraded_since: Option<i64>,
    failed_replacements: u32,
    /// Members replaced in a row for a shared egress address (distinctEgress), and the
    /// serial of the last one counted.
    shared_replacements: u32,
    shared_counted_to: Option<u64>,
    /// The addresses of that run.
    shared_ips: Vec<String>,
    /// Its failing member's `Reason: message`, if one is failing now.
    failure: Option<String>,
}

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
    use std::collections::BTreeMap;
    let replicas = spec.replicas as usize;
    let (surge, unavailable) = budgets(spec);
    let min_available = replicas.saturating_sub(unavailable);
    let n = spec.placements.len();
    // Draining members are on their way out: apart from the rest, neither counted nor chosen.
    let live: Vec<&Member> = members
        .iter()
        .filter(|m| !m.deleting && m.retiring.is_none())
        .collect();
    let draining: Vec<&Member> = members
        .iter()
        .filter(|m| !m.deleting && m.retiring.is_some())
        .collect();
    let shared = shared_egress(spec, &live);
    // A cordoned member that serves still counts: a cordon is a voluntary disruption (it is
    // out of discovery and new leases, replaced first, drained while leased, and goes only
    // while the floor holds), not a failure. With distinctEgress, one on an address another
    // member has does not count twice.
    let duplicates = cordoned_duplicates(spec, &live);
    let available_of = |m: &Member| {
        m.available && !shared.contains_key(&*m.name) && !duplicates.contains(&*m.name)
    };
    // Available, on an address no other live member has and none of its placement's run of
    // shared ones.
    let unique = |m: &Member, known_shared: &[String]| {
        available_of(m)
            && m.egress_ip.as_deref().is_some_and(|ip| {
                !known_shared.iter().any(|s| s == ip)
                    && live
                        .iter()
                        .filter(|o| o.name != m.name)
                        .all(|o| o.egress_ip.as_deref() != Some(ip))
            })
    };
    let spill = spill_after(spec).as_secs() as i64;

    let rotation_due = |m: &Member| {
        spec.rotation.as_ref().is_some_and(|r| {
            age_limit(r, &m.name)
                .zip(m.created_at)
                .is_some_and(|(limit, created)| now.saturating_sub(created) >= limit)
        })
    };
    let out_of_date = |m: &Member| match m.placement {
        Some(i) if i < n => revisions.get(i) != Some(&m.revision) || m.drifted,
        _ => true,
    };
    // Why each member is stale, by name; Rebalanced and Failed are added below, once the
    // placements' shares are known.
    let mut stale: BTreeMap<&str, DeleteReason> = BTreeMap::new();
    for m in &live {
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

    // 1. Each placement's health: degraded while its creates fail, until a member of it
    //    serves again; its share is capped at what of it serves now.
    let mine = |i: usize| live.iter().copied().filter(move |m| m.placement == Some(i));
    let health: Vec<Health> = (0..n)
        .map(|i| {
            let recorded = prior
                .placements
                .get(i)
                .filter(|p| p.provider == spec.placements[i].provider);
            let since = recorded
                .and_then(|p| p.degraded_since.as_deref())
                .and_then(egress_time::parse_rfc3339);
            let failing = mine(i)
                .filter_map(|m| m.failure.as_ref())
                .filter(|f| match f.kind {
                    FailureKind::Permanent => true,
                    FailureKind::Quota => f.since.is_none_or(|t| now.saturating_sub(t) >= spill),
                })
                .min_by_key(|f| (f.since, f.message.clone()));
            let recovered = since.is_some_and(|t| {
                mine(i).any(|m| available_of(m) && m.running_since.is_some_and(|r| r >= t))
            });
            // A member with an address no other member of the pool has, newer than the last
            // shared one counted, ends the run of shared addresses. (Not merely the oldest
            // holder of a shared address: while that one blips, the next holder is available,
            // yet its placement still gives shared addresses.)
            let counted_to = recorded.and_then(|p| p.shared_egress_counted_serial);
            let known_shared: &[String] = recorded.map_or(&[], |p| &p.shared_egress_ips);
            let own_address_since = counted_to.is_some_and(|t| {
                mine(i).any(|m| unique(m, known_shared) && m.serial.is_some_and(|c| c > t))
            });
            // The members giving shared addresses now count at once, so the decision that
            // meets the limit does not first create more here.
            let sharing_now = mine(i)
                .filter(|m| shared.contains_key(&*m.name))
                .filter(|m| counted_to.is_none_or(|t| m.serial.unwrap_or(0) > t))
                .count() as u32;
            let recorded_sharing = recorded.map_or(0, |p| p.shared_egress_replacements);
            // Degraded for giving shared addresses, it recovers only through a member with
            // an address of its own.
            let degraded_for_sharing =
                spec.distinct_egress && recorded_sharing + sharing_now >= SHARED_EGRESS_LIMIT;
            let recovered = recovered
                && (!degraded_for_sharing
                    || since.is_some_and(|t| {
                        mine(i).any(|m| {
                            unique(m, known_shared) && m.running_since.is_some_and(|r| r >= t)
                        })
                    }));
            let shared_replacements = if (since.is_some() && recovered) || own_address_since {
                0
            } else {
                recorded_sharing
            };
            let in_a_row = shared_replacements + sharing_now;
            let shares_addresses = spec.distinct_egress && in_a_row >= SHARED_EGRESS_LIMIT;
            let degraded_since = match (since, failing) {
                (Some(t), _) if !recovered => Some(t),
                (_, Some(_)) => Some(now),
                _ if shares_addresses => Some(now),
                _ => None,
            };
            let failed_replacements = if since.is_some() && recovered {
                0
            } else {
                recorded.map_or(0, |p| p.failed_replacements)
            };
            let failure = mine(i)
                .filter_map(|m| m.failure.as_ref())
                .min_by_key(|f| (f.since, f.message.clone()))
                .map(|f| f.message.clone())
                .or_else(|| {
                    shares_addresses.then(|| {
                        let seen: std::collections::BTreeSet<&str> = mine(i)
                            .filter_map(|m| shared.get(&*m.name).copied())
                            .collect();
                        let mut m = format!(
                            "SharedEgress: {in_a_row} members in a row egressed from an address an older member has"
                        );
                        if !seen.is_empty() {
                            let list: Vec<&str> = seen.into_iter().collect();
                            m.push_str(&format!(" ({})", list.join(", ")));
                        }
                        m
                    })
                });
            Health {
                degraded_since,
                failed_replacements,
                shared_replacements,
                shared_counted_to: if shared_replacements == 0 {
                    None
                } else {
                    counted_to
                },
                shared_ips: if shared_replacements == 0 {
                    Vec::new()
                } else {
                    known_shared.to_vec()
                },
                failure,
            }
        })
        .collect();
    let degraded = |i: usize| health[i].degraded_since.is_some();

    // 2. The shares: by weight within maxReplicas, a degraded placement holding only what of
    //    it serves now and lending the rest.
    let caps: Vec<usize> = (0..n)
        .map(|i| {
            let max = spec.placements[i]
                .max_replicas
                .map_or(usize::MAX, |m| m as usize);
            if degraded(i) {
                let serving = mine(i)
                    .filter(|m| available_of(m) && !stale.contains_key(m.name.as_str()))
                    .count();
                max.min(serving)
            } else {
                max
            }
        })
        .collect();
    let target = shares(spec, &caps);

    // 3. A member held in a permanent failure past its backoff makes way for a new one, one
    //    per placement at a time.
    let mut next_failed_due: Option<i64> = None;
    if !spec.paused {
        for (i, h) in health.iter().enumerate() {
            let wait = failed_replacement_backoff(h.failed_replacements).as_secs() as i64;
            let mut held: Vec<(i64, &Member)> = mine(i)
                .filter(|m| !stale.contains_key(m.name.as_str()))
                .filter_map(|m| {
                    let f = m.failure.as_ref()?;
                    (f.kind == FailureKind::Permanent).then(|| (f.since.unwrap_or(now), m))
                })
                .collect();
            held.sort_by_key(|(since, m)| (*since, m.name.clone()));
            if let Some((since, m)) = held.first() {
                if now.saturating_sub(*since) >= wait {
                    stale.insert(&m.name, DeleteReason::Failed);
                } else {
                    let due = since + wait - now;
                    next_failed_due = Some(next_failed_due.map_or(due, |d| d.min(due)));
                }
            }
        }
    }

    // 3b. With distinctEgress, a member an older member shares an address with makes way for
    //     a new one (it is not available, so this costs the floor nothing); in a degraded
    //     placement, only once it has served for the failed-member backoff, so the probe
    //     tries again at that pace rather than churning.
    if !spec.paused {
        for m in live.iter().filter(|m| shared.contains_key(&*m.name)) {
            if stale.contains_key(m.name.as_str()) {
                continue;
            }
            let Some(i) = m.placement.filter(|&i| i < n) else {
                continue;
            };
            if degraded(i) {
                let wait =
                    failed_replacement_backoff(health[i].shared_replacements).as_secs() as i64;
                let since = m.running_since.or(m.created_at).unwrap_or(now);
                if now.saturating_sub(since) < wait {
                    let due = since + wait - now;
                    next_failed_due = Some(next_failed_due.map_or(due, |d| d.min(due)));
                    continue;
                }
            }
            stale.insert(&m.name, DeleteReason::SharedEgress);
        }
    }

    // 4. A degraded placement keeps one member that does not serve, its probe (one still
    //    trying before one that failed, then the newest); the others make way.
    let mut probes: Vec<&str> = Vec::new();
    for i in (0..n).filter(|&i| degraded(i)) {
        let mut trying: Vec<&Member> = mine(i)
            .filter(|m| !available_of(m) && !stale.contains_key(m.name.as_str()))
            .collect();
        trying.sort_by_key(|m| {
            (
                m.failure.is_none(),
                m.created_at.unwrap_or(i64::MIN),
                m.name.clone(),
            )
        });
        if let Some(probe) = trying.pop() {
            probes.push(&probe.name);
        }
        for m in trying {
            stale.insert(&m.name, DeleteReason::Rebalanced);
        }
    }
    // 5. More current members than replicas (scaled down): the ones that do not serve first,
    //    then the oldest. Then what a placement still has beyond its share is out of place
    //    (another placement took its share back): its oldest serving members.
    let age_key = |m: &&Member| (m.created_at.unwrap_or(i64::MIN), m.name.clone());
    let mut current: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| !stale.contains_key(m.name.as_str()) && !probes.contains(&m.name.as_str()))
        .collect();
    // Unleased before leased: a leased one would only drain.
    current.sort_by_key(|m| (available_of(m), m.leased(now), age_key(m)));
    let scaled_down: Vec<&Member> = current
        .iter()
        .copied()
        .take(current.len().saturating_sub(replicas))
        .collect();
    for (i, t) in target.iter().enumerate() {
        let mut serving: Vec<&Member> = current
            .iter()
            .copied()
            .filter(|m| m.placement == Some(i) && available_of(m))
            .filter(|m| !scaled_down.iter().any(|s| s.name == m.name))
            .collect();
        serving.sort_by_key(age_key);
        for m in serving.iter().take(serving.len().saturating_sub(*t)) {
            stale.insert(&m.name, DeleteReason::Rebalanced);
        }
    }
    current.retain(|m| !stale.contains_key(m.name.as_str()));

    let ready_now = live.iter().filter(|m| m.ready && !m.cordoned).count();
    let available_now = live.iter().filter(|m| available_of(m)).count();
    let updated_now = live
        .iter()
        .filter(|m| {
            !matches!(
                stale.get(m.name.as_str()),
                Some(DeleteReason::Cordoned | DeleteReason::OutOfDate | DeleteReason::Rotated)
            )
        })
        .count();
    let mut deletes: Vec<(String, DeleteReason)> = Vec::new();
    let mut drains: Vec<(String, DeleteReason)> = Vec::new();
    let mut lost: Vec<crate::model::lease::LostProxy> = Vec::new();
    let mut creates = Vec::new();
    let retire_at = now.saturating_add(drain_timeout(spec).as_secs() as i64);
    // What a member's leases lose when it goes: each live binding, for the reason it goes (one
    // of a replaced instance, for that).
    let lose = |lost: &mut Vec<crate::model::lease::LostProxy>, m: &Member, why: String| {
        for l in m.leases.iter().filter(|l| l.live(now)) {
            lost.push(crate::model::lease::LostProxy {
                lease: l.id.clone(),
                proxy: m.name.clone(),
                reason: if l.holds {
                    why.clone()
                } else {
                    crate::model::lease::INSTANCE_REPLACED.to_string()
                },
                at: egress_time::format_rfc3339(now),
                holder: Some(l.holder.clone()),
            });
        }
    };

    if !spec.paused {
        let mut available = available_now;
        let mut stale_members: Vec<(&Member, DeleteReason)> = live
            .iter()
            .filter_map(|m| stale.get(m.name.as_str()).map(|r| (*m, *r)))
            .collect();
        // Unleased before leased within a reason: a leased one only starts to drain.
        stale_members.sort_by_key(|(m, r)| {
            (
                *r,
                m.leased(now),
                m.created_at.unwrap_or(i64::MIN),
                m.name.clone(),
            )
        });

        // 6. Stale members that serve no one cost nothing to remove, leased or not (a proxy
        //    that failed is not drained: it goes, and its holders read why in the status); nor
        //    do members scaled down that serve no one. A serving one scaled down goes only
        //    while the floor holds, drained first when leased.
        for (m, r) in &stale_members {
            if !available_of(m) {
                deletes.push((m.name.clone(), *r));
                lose(
                    &mut lost,
                    m,
                    format!(
                        "{}: it does not serve (it failed its check or never started)",
                        r.as_str()
                    ),
                );
            }
        }
        for m in &scaled_down {
            if available_of(m) {
                if available <= min_available {
                    break;
                }
                available -= 1;
                if m.leased(now) {
                    drains.push((m.name.clone(), DeleteReason::ScaledDown));
                    current.retain(|c| c.name != m.name);
                    continue;
                }
            } else {
                lose(&mut lost, m, "ScaledDown: it does not serve".to_string());
            }
            deletes.push((m.name.clone(), DeleteReason::ScaledDown));
            current.retain(|c| c.name != m.name);
        }
        // 7. Stale members that still serve: only as far as the available count stays at or
        //    above replicas - maxUnavailable; a leased one drains instead of going, which
        //    costs the floor the same.
        for (m, r) in &stale_members {
            if available_of(m) && available > min_available {
                if m.leased(now) {
                    drains.push((m.name.clone(), *r));
                } else {
                    deletes.push((m.name.clone(), *r));
                }
                available -= 1;
            }
        }
        let live_deleted = deletes.len();
        // 7b. A draining member goes once no lease holds it, or at its retirement (and the
        //     leases still on it then are lost).
        for m in &draining {
            let Some((at, why)) = m.retiring else {
                continue;
            };
            if m.leased(now) && now < at {
                continue;
            }
            deletes.push((m.name.clone(), why));
            lose(
                &mut lost,
                m,
                format!("{}: drained until drainTimeout", why.as_str()),
            );
        }
        // 8. New members of the current revision, within maxSurge; a degraded placement's
        //    probe beside them.
        let kept_probes = probes
            .iter()
            .filter(|p| !deletes.iter().any(|(d, _)| d == *p))
            .count();
        // Draining members are not counted: they are bounded by drainTimeout, and counting
        // them would stall a rotation for as long as a lease is held.
        let remaining = live
            .len()
            .saturating_sub(live_deleted + drains.len() + kept_probes);
        let room = replicas.saturating_add(surge).saturating_sub(remaining);
        let wanted = replicas.saturating_sub(current.len()).min(CREATES_PER_PASS);
        let mut per_placement = vec![0usize; n];
        let mut per_zone: Vec<BTreeMap<String, usize>> = vec![Default::default(); n];
        for m in &current {
            if let Some(i) = m.placement.filter(|i| *i < n) {
                per_placement[i] += 1;
                if let Some(z) = &m.zone {
                    *per_zone[i].entry(z.clone()).or_default() += 1;
                }
            }
        }
        let zone_for = |i: usize, per_zone: &mut Vec<BTreeMap<String, usize>>| {
            let zone = spec.placements[i]
                .zones
                .iter()
                .min_by_key(|z| per_zone[i].get(*z).copied().unwrap_or(0))
                .cloned()
                .or_else(|| spec.template.placement.zone.clone());
            if let Some(z) = &zone {
                *per_zone[i].entry(z.clone()).or_default() += 1;
            }
            zone
        };
        for _ in 0..wanted.min(room) {
            // The placement furthest below its share; none below: one with room left.
            let pick = (0..n)
                .filter(|&i| per_placement[i] < caps[i])
                .max_by_key(|&i| {
                    (
                        target[i] as i64 - per_placement[i] as i64,
                        std::cmp::Reverse(i),
                    )
                });
            let Some(i) = pick else { break };
            per_placement[i] += 1;
            creates.push(Create {
                placement: i,
                zone: zone_for(i, &mut per_zone),
                revision: revisions.get(i).cloned().unwrap_or_default(),
                probe: false,
            });
        }
        for i in (0..n).filter(|&i| degraded(i)) {
            let trying = mine(i).any(|m| {
                probes.contains(&m.name.as_str()) && !deletes.iter().any(|(d, _)| *d == m.name)
            });
            if !trying {
                creates.push(Create {
                    placement: i,
                    zone: zone_for(i, &mut per_zone),
                    revision: revisions.get(i).cloned().unwrap_or_default(),
                    probe: true,
                });
            }
        }
    }

    let status = status(
        spec,
        prior,
        &live,
        &available_of,
        &shared,
        Counts {
            ready: ready_now,
            available: available_now,
            updated: updated_now,
            min_available,
            deleting: members.iter().filter(|m| m.deleting).count(),
            draining: draining.len() + drains.len(),
        },
        &health,
        &target,
        &creates,
        &deletes,
    );
    let mut status = status;
    status.leased_replicas = live.iter().filter(|m| m.leased(now)).count() as u32;
    // Losses the pool did not decide, recorded as soon as it sees them, so they outlive the
    // bindings that show them: an instance replaced under a lease (the binding holds nothing
    // from then on), and a member being deleted (by someone else, or by a decision whose
    // record was not written) with a lease on it.
    for m in members {
        for l in m.leases.iter().filter(|l| l.live(now)) {
            let why = if !l.holds {
                crate::model::lease::INSTANCE_REPLACED.to_string()
            } else if m.deleting {
                "its Proxy is being deleted".to_string()
            } else {
                continue;
            };
            lost.push(crate::model::lease::LostProxy {
                lease: l.id.clone(),
                proxy: m.name.clone(),
                reason: why,
                at: egress_time::format_rfc3339(now),
                holder: Some(l.holder.clone()),
            });
        }
    }
    status.lost_leases = lost_record(prior, members, &deletes, lost, now);
    let next_rotation = spec.rotation.as_ref().and_then(|r| {
        live.iter()
            .filter(|m| !stale.contains_key(m.name.as_str()))
            .filter_map(|m| Some(m.created_at? + age_limit(r, &m.name)? - now))
            .min()
    });
    // A quota failure that will have lasted spillAfter.
    let next_spill = live
        .iter()
        .filter_map(|m| m.failure.as_ref())
        .filter(|f| f.kind == FailureKind::Quota)
        .filter_map(|f| f.since)
        .map(|t| t + spill - now)
        .filter(|d| *d > 0)
        .min();
    // A drain ending at its retirement, or when its last lease ends.
    let next_drain_end = draining
        .iter()
        .filter(|m| !deletes.iter().any(|(d, _)| *d == m.name))
        .filter_map(|m| {
            let (at, _) = m.retiring?;
            let lease_end = m
                .leases
                .iter()
                .filter(|l| l.holds)
                .map(|l| l.until)
                .max()
                .unwrap_or(now);
            Some(at.min(lease_end) - now)
        })
        .chain((!drains.is_empty()).then_some(retire_at - now))
        .min();
    let requeue_after = [next_rotation, next_failed_due, next_spill, next_drain_end]
        .into_iter()
        .flatten()
        .min()
        .map(|s| Duration::from_secs(s.max(1) as u64));
    Decision {
        creates,
        deletes,
        drains,
        retire_at,
        status,
        requeue_after,
    }
}

/// The pool's record of lost leases: the prior one's entries younger than [`LOST_KEPT`] (but
/// those the world contradicts: a member not going now whose lease still holds it, where a
/// record written before a deletion that then did not happen would otherwise stand), then
/// the new ones, each (lease, proxy) once, the newest [`LOST_KEPT_MAX`].
fn lost_record(
    prior: &PoolStatus,
    members: &[Member],
    deletes: &[(String, DeleteReason)],
    new: Vec<crate::model::lease::LostProxy>,
    now: i64,
) -> Vec<crate::model::lease::LostProxy> {
    let still_held = |l: &crate::model::lease::LostProxy| {
        !deletes.iter().any(|(d, _)| *d == l.proxy)
            && members.iter().any(|m| {
                m.name == l.proxy
                    && !m.deleting
                    && m.leases
                        .iter()
                        .any(|b| b.id == l.lease && b.holds && b.live(now))
            })
    };
    let mut out: Vec<crate::model::lease::LostProxy> = Vec::new();
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

/// The names of the members that count toward the floor as [`decide`] counts them: available
/// (cordoned or not: a cordoned member serves until it is replaced), not being deleted, and
/// with `distinctEgress` not on an address another member counts already. What a harness
/// that checks the floor must count.
pub fn counted_available<'a>(
    spec: &PoolSpec,
    members: &'a [Member],
) -> std::collections::BTreeSet<&'a str> {
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
fn cordoned_duplicates<'a>(
    spec: &PoolSpec,
    live: &[&'a Member],
) -> std::collections::BTreeSet<&'a str> {
    let mut out = std::collections::BTreeSet::new();
    if !spec.distinct_egress {
        return out;
    }
    let mut seen: std::collections::BTreeSet<&str> = live
        .iter()
        .filter(|m| m.available && !m.cordoned)
        .filter_map(|m| m.egress_ip.as_deref())
        .collect();
    let mut cordoned: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| m.available && m.cordoned && m.egress_ip.is_some())
        .collect();
    cordoned.sort_by_key(|m| {
        (
            m.created_at.unwrap_or(i64::MIN),
            m.serial.unwrap_or(0),
            m.name.clone(),
        )
    });
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
fn shared_egress<'a>(
    spec: &PoolSpec,
    live: &[&'a Member],
) -> std::collections::BTreeMap<&'a str, &'a str> {
    let mut out = std::collections::BTreeMap::new();
    if !spec.distinct_egress {
        return out;
    }
    let mut holders: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| m.available && !m.cordoned && m.egress_ip.is_some())
        .collect();
    // Oldest first: by creation time, and within one second by serial, the order the pool
    // made them in.
    holders.sort_by_key(|m| {
        (
            m.created_at.unwrap_or(i64::MIN),
            m.serial.unwrap_or(0),
            m.name.clone(),
        )
    });
    let mut seen = std::collections::BTreeSet::new();
    for m in holders {
        if let Some(ip) = m.egress_ip.as_deref()
            && !seen.insert(ip)
        {
            out.insert(m.name.as_str(), ip);
        }
    }
    out
}

/// Each placement's [`revision`], from its provider entry's revision (`missing` for an entry
/// the config does not have, so its Proxies are out of date until it appears).
pub fn revisions(spec: &PoolSpec, provider_revisions: &[String]) -> Vec<String> {
    (0..spec.placements.len())
        .map(|i| {
            let p = provider_revisions.get(i).map_or("missing", String::as_str);
            revision(spec, i, p)
        })
        .collect()
}

/// One of the pool's Proxies as the decisions see it: its placement label, zone, revision
/// annotation, whether it serves (with the egress check's thresholds, when configured), its
/// cordon mark and a failure to create. The CLI and the operator both read their Proxies
/// through this, so they decide alike.
pub fn member(
    pool: &ProxyPool,
    proxy: &crate::model::proxy::Proxy,
    status: &crate::model::proxy::ProxyStatus,
    created_at: Option<i64>,
    deleting: bool,
    egress: Option<crate::decide::egress::Thresholds>,
) -> Member {
    use crate::model::conditions::{READY, ready_is_true, reason};
    let meta = &proxy.metadata;
    let ready = status.condition(READY);
    let failure = ready.filter(|c| c.status != "True").and_then(|c| {
        let kind = match c.reason.as_str() {
            reason::PERMANENT_FAILURE | reason::PROVIDER_NOT_FOUND => FailureKind::Permanent,
            reason::QUOTA_EXCEEDED => FailureKind::Quota,
            _ => return None,
        };
        Some(MemberFailure {
            kind,
            since: egress_time::parse_rfc3339(&c.last_transition_time),
            message: format!("{}: {}", c.reason, c.message),
        })
    });
    let running =
        status.state == Some(crate::model::instance::InstanceState::Running) && status.ip.is_some();
    let available = match egress {
        Some(t) => running && failure.is_none() && crate::decide::egress::available(status, t),
        None => ready_is_true(status),
    };
    Member {
        name: meta.name.clone(),
        placement: meta
            .labels
            .get(PLACEMENT_LABEL)
            .and_then(|p| p.parse().ok()),
        zone: proxy.spec.placement.zone.clone(),
        revision: meta
            .annotations
            .get(REVISION_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        created_at,
        serial: member_serial(pool, &meta.name),
        running_since: status
            .running_since
            .as_deref()
            .and_then(egress_time::parse_rfc3339),
        available,
        ready: ready_is_true(status),
        cordoned: meta
            .annotations
            .get(crate::model::labels::CORDON_ANNOTATION)
            .is_some_and(|v| v == "true"),
        deleting,
        drifted: crate::decide::reconcile::spec_drift(proxy, status).is_some(),
        egress_ip: status.egress_ip.clone(),
        failure,
        leases: status
            .leases
            .iter()
            .map(|b| MemberLease {
                id: b.id.clone(),
                until: b.expires(),
                holder: crate::model::lease::holder_digest(&b.holder),
                holds: b.holds(status.ip.as_deref()),
            })
            .collect(),
        retiring: retiring(&meta.annotations),
    }
}

/// A Proxy's drain, from its annotations: when it retires at the latest and why (a reason
/// not known reads as a rotation; a time not readable as now, so a garbled mark ends the
/// drain rather than holding the member for ever).
pub fn retiring(
    annotations: &std::collections::BTreeMap<String, String>,
) -> Option<(i64, DeleteReason)> {
    let at = annotations.get(crate::model::labels::RETIRE_AT_ANNOTATION)?;
    let why = annotations
        .get(crate::model::labels::RETIRE_REASON_ANNOTATION)
        .and_then(|r| DeleteReason::parse(r))
        .unwrap_or(DeleteReason::Rotated);
    Some((egress_time::parse_rfc3339(at).unwrap_or(i64::MIN), why))
}

/// The letters of a member name's suffix: Kubernetes' own for generated names (no vowels, no
/// look-alikes), so a suffix never spells a word.
const NAME_LETTERS: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";
/// Letters of a suffix: 27^9 covers the 40 bits of a serial.
const NAME_LEN: usize = 9;

/// `<pool>-<9 letters>`, the pool's `serial`-th member name. The suffix is a permutation of the
/// serial keyed by the pool's identity (a four-round Feistel network over 40 bits), so the
/// names of one pool look unrelated, yet two serials below 2^40 never give the same name; the
/// serial is kept (the pool's status, the CLI's state), so no name repeats in the pool's life
/// and a new member never takes the name (and, in the CLI, the derived UID) of an old one.
pub fn member_name(pool: &ProxyPool, serial: u64) -> String {
    let round = name_rounds(pool);
    let x = serial & ((1 << (2 * NAME_HALF)) - 1);
    let (mut left, mut right) = (x >> NAME_HALF, x & NAME_MASK);
    for k in 0..4 {
        (left, right) = (right, left ^ round(k, right));
    }
    let mut y = (left << NAME_HALF) | right;
    let mut suffix = [0u8; NAME_LEN];
    for c in suffix.iter_mut().rev() {
        *c = NAME_LETTERS[(y % 27) as usize];
        y /= 27;
    }
    format!(
        "{}-{}",
        pool.metadata.name,
        String::from_utf8_lossy(&suffix)
    )
}

/// The serial `name` was made from by [`member_name`] for `pool`, None when the pool did not
/// make it: the Feistel rounds run backwards.
pub fn member_serial(pool: &ProxyPool, name: &str) -> Option<u64> {
    let suffix = name
        .strip_prefix(pool.metadata.name.as_str())?
        .strip_prefix('-')?;
    if suffix.len() != NAME_LEN {
        return None;
    }
    let mut y: u64 = 0;
    for c in suffix.bytes() {
        let digit = NAME_LETTERS.iter().position(|l| *l == c)? as u64;
        y = y * 27 + digit;
    }
    if y >> (2 * NAME_HALF) != 0 {
        return None;
    }
    let round = name_rounds(pool);
    let (mut left, mut right) = (y >> NAME_HALF, y & NAME_MASK);
    for k in (0..4).rev() {
        (left, right) = (right ^ round(k, left), left);
    }
    Some((left << NAME_HALF) | right)
}

/// Half of a serial's 40 bits.
const NAME_HALF: u32 = 20;
const NAME_MASK: u64 = (1 << NAME_HALF) - 1;

/// The round function of a pool's name permutation, keyed by the pool's identity.
fn name_rounds(pool: &ProxyPool) -> impl Fn(u8, u64) -> u64 {
    let identity = pool.metadata.uid.clone().unwrap_or_else(|| {
        crate::model::name::derived_uid(&pool.metadata.namespace, &pool.metadata.name)
    });
    let key = Sha256::digest(identity.as_bytes());
    move |k: u8, half: u64| {
        let mut h = Sha256::new();
        h.update(key);
        h.update([k]);
        h.update(half.to_be_bytes());
        let d = h.finalize();
        u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) & NAME_MASK
    }
}

/// The Proxy a create names: the template, the placement's provider and fields, the pool's
/// label, the placement and the revision.
pub fn member_proxy(pool: &ProxyPool, c: &Create, name: &str) -> crate::model::proxy::Proxy {
    use std::collections::BTreeMap;
    let spec = &pool.spec;
    let p = spec.placements.get(c.placement);
    let t = &spec.template.placement;
    let mut labels = BTreeMap::new();
    labels.insert(
        crate::model::labels::POOL_LABEL.to_string(),
        pool.metadata.name.clone(),
    );
    labels.insert(PLACEMENT_LABEL.to_string(), c.placement.to_string());
    let mut annotations = BTreeMap::new();
    annotations.insert(REVISION_ANNOTATION.to_string(), c.revision.clone());
    crate::model::proxy::Proxy {
        api_version: crate::model::proxy::API_VERSION.into(),
        kind: crate::model::proxy::KIND.into(),
        metadata: crate::model::proxy::ObjectMeta {
            name: name.to_string(),
            namespace: pool.metadata.namespace.clone(),
            uid: None,
            generation: Some(1),
            labels,
            annotations,
        },
        spec: crate::model::proxy::ProxySpec {
            provider: p.map(|p| p.provider.clone()).unwrap_or_default(),
            port: spec.template.port,
            placement: Placement {
                zone: c.zone.clone().or_else(|| t.zone.clone()),
                region: t.region.clone(),
                machine_type: p
                    .and_then(|p| p.machine_type.clone())
                    .or_else(|| t.machine_type.clone()),
                image: p.and_then(|p| p.image.clone()).or_else(|| t.image.clone()),
            },
            cloud_init: spec.template.cloud_init.clone(),
            cloud_init_secret_ref: spec.template.cloud_init_secret_ref.clone(),
        },
        status: None,
    }
}

/// The counts a status reports.
struct Counts {
    ready: usize,
    available: usize,
    updated: usize,
    min_available: usize,
    /// Members still being deleted.
    deleting: usize,
    /// Members draining, or starting to.
    draining: usize,
}

#[allow(clippy::too_many_arguments)]
fn status(
    spec: &PoolSpec,
    prior: &PoolStatus,
    live: &[&Member],
    available_of: &dyn Fn(&Member) -> bool,
    shared: &std::collections::BTreeMap<&str, &str>,
    counts: Counts,
    health: &[Health],
    target: &[usize],
    creates: &[Create],
    deletes: &[(String, DeleteReason)],
) -> PoolStatus {
    let base = targets(spec);
    let placements: Vec<PlacementStatus> = spec
        .placements
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mine: Vec<&&Member> = live.iter().filter(|m| m.placement == Some(i)).collect();
            let h = &health[i];
            // Members replaced for a shared address now, each counted once: created after
            // the last one counted.
            let counted: Vec<u64> = deletes
                .iter()
                .filter(|(name, why)| {
                    *why == DeleteReason::SharedEgress || shared.contains_key(name.as_str())
                })
                .filter_map(|(name, _)| mine.iter().find(|m| m.name == *name))
                .map(|m| m.serial.unwrap_or(0))
                .filter(|c| h.shared_counted_to.is_none_or(|t| *c > t))
                .collect();
            PlacementStatus {
                provider: p.provider.clone(),
                replicas: mine.len() as u32,
                ready_replicas: mine.iter().filter(|m| m.ready && !m.cordoned).count() as u32,
                available_replicas: mine.iter().filter(|m| available_of(m)).count() as u32,
                target_replicas: target.get(i).copied().unwrap_or(0) as u32,
                degraded_since: h.degraded_since.map(egress_time::format_rfc3339),
                failed_replacements: h.failed_replacements
                    + deletes
                        .iter()
                        .filter(|(name, why)| {
                            *why == DeleteReason::Failed && mine.iter().any(|m| m.name == *name)
                        })
                        .count() as u32,
                shared_egress_replacements: h.shared_replacements + counted.len() as u32,
                shared_egress_counted_serial: counted.iter().copied().max().or(h.shared_counted_to),
                legacy_shared_egress_counted_to: None,
                shared_egress_ips: {
                    let mut ips: std::collections::BTreeSet<String> =
                        h.shared_ips.iter().cloned().collect();
                    // Those its members share now, whether replaced yet or kept as a probe.
                    ips.extend(
                        mine.iter()
                            .filter_map(|m| shared.get(m.name.as_str()))
                            .map(|ip| ip.to_string()),
                    );
                    ips.into_iter().collect()
                },
                last_error: h.failure.clone(),
            }
        })
        .collect();
    let cond = |type_: &str, ok: bool, reason: &str, message: String| Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: String::new(),
    };
    let replicas = spec.replicas as usize;
    let Counts {
        ready,
        available: serving,
        updated,
        min_available,
        deleting,
        draining,
    } = counts;
    let available = serving >= min_available;
    let settled = creates.is_empty()
        && deletes.is_empty()
        && updated == replicas
        && live.len() == replicas
        && deleting == 0
        && draining == 0;
    let name = |i: usize| format!("placements[{i}] ({})", spec.placements[i].provider);
    let degraded: Vec<String> = placements
        .iter()
        .enumerate()
        .filter(|(_, p)| p.degraded_since.is_some() || p.last_error.is_some())
        .map(|(i, p)| {
            let mut m = format!(
                "{}: {}",
                name(i),
                p.last_error
                    .as_deref()
                    .unwrap_or("no member of it serves yet")
            );
            let lent = base.get(i).copied().unwrap_or(0).saturating_sub(target[i]);
            if p.degraded_since.is_some() && lent > 0 {
                let to: Vec<String> = (0..placements.len())
                    .filter(|&j| target[j] > base.get(j).copied().unwrap_or(0))
                    .map(|j| format!("{} to {}", target[j] - base[j], name(j)))
                    .collect();
                m.push_str(&format!(
                    "; {lent} of its {} lent{}",
                    base[i],
                    if to.is_empty() {
                        " (no other placement has room)".to_string()
                    } else {
                        format!(": {}", to.join(", "))
                    }
                ));
            }
            m
        })
        .collect();
    let any_degraded = placements.iter().any(|p| p.degraded_since.is_some());
    let conditions = vec![
        cond(
            "Available",
            available,
            if available {
                "MinimumReplicasAvailable"
            } else {
                "MinimumReplicasUnavailable"
            },
            format!(
                "{serving} of {replicas} available ({ready} ready); at least {min_available} must be"
            ),
        ),
        cond(
            "Progressing",
            true,
            if spec.paused {
                "Paused"
            } else if settled {
                "Complete"
            } else {
                "RollingOut"
            },
            {
                let mut m = format!(
                    "{updated} of {replicas} up to date; {} to create, {} to delete",
                    creates.len(),
                    deletes.len()
                );
                if draining > 0 {
                    m.push_str(&format!("; {draining} draining for their leases"));
                }
                m
            },
        ),
        cond(
            "PlacementDegraded",
            !degraded.is_empty(),
            if any_degraded {
                "ShareLent"
            } else if degraded.is_empty() {
                "AllPlacementsCreate"
            } else {
                "CannotCreate"
            },
            if degraded.is_empty() {
                "every placement creates".into()
            } else {
                degraded.join("; ")
            },
        ),
    ];
    PoolStatus {
        observed_generation: None,
        replicas: live.len() as u32,
        ready_replicas: ready as u32,
        available_replicas: serving as u32,
        updated_replicas: updated as u32,
        distinct_egress_ips: live
            .iter()
            .filter(|m| m.available && !m.cordoned)
            .filter_map(|m| m.egress_ip.as_deref())
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u32,
        member_serial: prior.member_serial,
        selector: prior.selector.clone(),
        conditions,
        placements,
        leased_replicas: 0,
        draining_replicas: draining as u32,
        lost_leases: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
