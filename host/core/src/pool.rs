//! ProxyPool: `replicas` proxies spread over providers by weight, rolled when the template or a
//! placement's provider changes and rotated by age, surge first, never taking the Ready count
//! below `replicas - maxUnavailable` once the pool was there. Kubernetes' Deployment semantics
//! (rolling.go: old replicas are scaled down only as far as the available count allows, new
//! ones scaled up within maxSurge) applied to proxies; rotation is just another reason for a
//! proxy to be out of date, so it spends the same budget and never fires all at once.
//!
//! [`decide`] is pure: the pool's spec, its Proxies as observed, the current revision of each
//! placement and the time in; creates, deletes and the status out. The operator and the CLI
//! carry them out.

use crate::config::IntOrPercent;
use crate::proxy::{Condition, Placement, SecretKeyRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::time::Duration;

pub const KIND: &str = "ProxyPool";
/// The annotation recording which revision of the pool's template and placement a Proxy was
/// made from.
pub const REVISION_ANNOTATION: &str = "crawl.example.com/pool-revision";
/// The label recording which placement (its index) a Proxy belongs to.
pub const PLACEMENT_LABEL: &str = "crawl.example.com/pool-placement";

/// A ProxyPool manifest as written in a proxies file or stored in the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyPool {
    pub api_version: String,
    pub kind: String,
    pub metadata: crate::proxy::ObjectMeta,
    pub spec: PoolSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PoolStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolSpec {
    /// How many proxies the pool keeps.
    pub replicas: u32,
    /// What each of its Proxies is, but for the provider (from the placement).
    #[serde(default)]
    pub template: PoolTemplate,
    /// Where the proxies go, spread by weight.
    pub placements: Vec<PoolPlacement>,
    /// Replace each proxy once it is this old (± jitter, fixed per proxy, so a wave of
    /// rotations spreads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<Rotation>,
    #[serde(default)]
    pub strategy: Strategy,
    /// Nothing is created or deleted while paused; the status is still written.
    #[serde(default)]
    pub paused: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolTemplate {
    #[serde(default = "default_port")]
    pub port: u16,
    /// Placement defaults; a placement's own fields win.
    #[serde(default)]
    pub placement: Placement,
    /// Secret: never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_secret_ref: Option<SecretKeyRef>,
}

fn default_port() -> u16 {
    crate::proxy::DEFAULT_PORT
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolPlacement {
    /// A provider entry's name.
    pub provider: String,
    /// Its share of the replicas, relative to the other placements' (default 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// Zones its proxies are spread over, round robin; empty: the template's zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// At most this many of the pool's proxies here; the rest goes to the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<u32>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rotation {
    /// e.g. `24h`.
    pub max_age: String,
    /// e.g. `2h`: each proxy's age limit is moved by up to this much, either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Strategy {
    /// Proxies above `replicas` while replacing (a number or a percentage, rounded up;
    /// default 25%).
    #[serde(default = "default_surge")]
    pub max_surge: IntOrPercent,
    /// Ready proxies below `replicas` a replacement may cost (rounded down; default 0).
    #[serde(default = "default_unavailable")]
    pub max_unavailable: IntOrPercent,
}

impl Default for Strategy {
    fn default() -> Self {
        Self {
            max_surge: default_surge(),
            max_unavailable: default_unavailable(),
        }
    }
}

fn default_surge() -> IntOrPercent {
    IntOrPercent::Percent("25%".into())
}
fn default_unavailable() -> IntOrPercent {
    IntOrPercent::Int(0)
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Proxies the pool has (not being deleted).
    pub replicas: u32,
    /// Ready ones (verified where the egress check is configured), none cordoned.
    pub ready_replicas: u32,
    /// Ones of the current template and provider revision, younger than maxAge.
    pub updated_replicas: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<PlacementStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PlacementStatus {
    pub provider: String,
    pub replicas: u32,
    pub ready_replicas: u32,
    /// The last failure of one of its proxies, if any is failing now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Problems in a pool's spec, each naming the field.
pub fn validate(pool: &ProxyPool) -> Vec<String> {
    let mut problems = Vec::new();
    if pool.api_version != crate::proxy::API_VERSION {
        problems.push(format!(
            "apiVersion: expected {}, got {:?}",
            crate::proxy::API_VERSION,
            pool.api_version
        ));
    }
    if pool.metadata.name.is_empty() || !crate::config::is_dns_label(&pool.metadata.name) {
        problems.push(format!(
            "metadata.name: {:?} is not a DNS label (the pool's Proxies are named after it)",
            pool.metadata.name
        ));
    } else if pool.metadata.name.len() > 50 {
        problems.push("metadata.name: at most 50 characters (its Proxies add a suffix)".into());
    }
    let s = &pool.spec;
    if s.placements.is_empty() {
        problems.push("spec.placements: at least one placement is needed".into());
    }
    for (i, p) in s.placements.iter().enumerate() {
        if p.provider.is_empty() {
            problems.push(format!("spec.placements[{i}].provider: must not be empty"));
        }
        if p.weight == 0 {
            problems.push(format!("spec.placements[{i}].weight: must be at least 1"));
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
        match crate::config::parse_duration(&r.max_age) {
            Ok(d) if d.is_zero() => {
                problems.push("spec.rotation.maxAge: must be longer than 0".into())
            }
            Ok(_) => {}
            Err(m) => problems.push(format!("spec.rotation.maxAge: {m}")),
        }
        if let Some(j) = &r.jitter
            && let Err(m) = crate::config::parse_duration(j)
        {
            problems.push(format!("spec.rotation.jitter: {m}"));
        }
    }
    problems
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

/// One of the pool's Proxies as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Its placement's index (the label), None when it names none that exists.
    pub placement: Option<usize>,
    pub zone: Option<String>,
    /// The revision it was made from (the annotation).
    pub revision: String,
    /// Unix seconds: when the Proxy was created.
    pub created_at: Option<i64>,
    pub ready: bool,
    pub cordoned: bool,
    /// Being deleted already: neither counted nor chosen again.
    pub deleting: bool,
    /// Why it is failing now (a permanent or quota failure), for PlacementDegraded.
    pub failure: Option<String>,
}

/// Why the pool deletes a Proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// Cordoned: out of discovery, replaced.
    Cordoned,
    /// Of an older template or provider revision, or of a placement that is gone.
    OutOfDate,
    /// Older than maxAge (± its jitter).
    Rotated,
    /// More proxies than replicas.
    ScaledDown,
}

impl DeleteReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cordoned => "Cordoned",
            Self::OutOfDate => "OutOfDate",
            Self::Rotated => "Rotated",
            Self::ScaledDown => "ScaledDown",
        }
    }
}

/// A Proxy to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Create {
    pub placement: usize,
    pub zone: Option<String>,
    pub revision: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub creates: Vec<Create>,
    pub deletes: Vec<(String, DeleteReason)>,
    pub status: PoolStatus,
    /// When to look again at the latest (the next rotation due), absent other changes.
    pub requeue_after: Option<Duration>,
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
    let n = spec.placements.len();
    let mut target = vec![0usize; n];
    let mut open: Vec<usize> = (0..n).collect();
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
            let cap = spec.placements[i]
                .max_replicas
                .map_or(usize::MAX, |m| m as usize);
            let room = cap.saturating_sub(target[i]);
            let take = share.min(room);
            target[i] += take;
            left -= take;
            if take < share {
                capped = true;
            }
        }
        open.retain(|&i| {
            spec.placements[i]
                .max_replicas
                .is_none_or(|m| target[i] < m as usize)
        });
        if !capped {
            break;
        }
    }
    target
}

/// Decides one step of the pool. `revisions[i]` is placement i's current [`revision`]; `now`
/// is Unix seconds.
pub fn decide(spec: &PoolSpec, revisions: &[String], members: &[Member], now: i64) -> Decision {
    let replicas = spec.replicas as usize;
    let (surge, unavailable) = budgets(spec);
    let min_available = replicas.saturating_sub(unavailable);
    let live: Vec<&Member> = members.iter().filter(|m| !m.deleting).collect();

    let rotation_due = |m: &Member| {
        spec.rotation.as_ref().is_some_and(|r| {
            age_limit(r, &m.name)
                .zip(m.created_at)
                .is_some_and(|(limit, created)| now.saturating_sub(created) >= limit)
        })
    };
    let out_of_date = |m: &Member| match m.placement {
        Some(i) => revisions.get(i) != Some(&m.revision),
        None => true,
    };
    let stale_reason = |m: &Member| {
        if m.cordoned {
            Some(DeleteReason::Cordoned)
        } else if out_of_date(m) {
            Some(DeleteReason::OutOfDate)
        } else if rotation_due(m) {
            Some(DeleteReason::Rotated)
        } else {
            None
        }
    };
    let available_of = |m: &Member| m.ready && !m.cordoned;

    let ready_now = live.iter().filter(|m| available_of(m)).count();
    let updated_now = live.iter().filter(|m| stale_reason(m).is_none()).count();
    let mut deletes: Vec<(String, DeleteReason)> = Vec::new();
    let mut creates = Vec::new();

    if !spec.paused {
        let mut available = ready_now;
        let mut current: Vec<&Member> = live
            .iter()
            .copied()
            .filter(|m| stale_reason(m).is_none())
            .collect();
        // Oldest first; unknown creation times count as oldest.
        let age_key = |m: &&Member| (m.created_at.unwrap_or(i64::MIN), m.name.clone());
        let mut stale: Vec<(&Member, DeleteReason)> = live
            .iter()
            .filter_map(|m| stale_reason(m).map(|r| (*m, r)))
            .collect();
        stale.sort_by_key(|(m, r)| (*r as u8, m.created_at.unwrap_or(i64::MIN), m.name.clone()));

        // 1. Out-of-date proxies that serve no one cost nothing to remove.
        for (m, r) in &stale {
            if !available_of(m) {
                deletes.push((m.name.clone(), *r));
            }
        }
        // 2. More current proxies than replicas (scaled down): the not-Ready first, then the
        //    oldest, a Ready one only while the floor holds.
        if current.len() > replicas {
            current.sort_by_key(|m| (m.ready, age_key(m)));
            let excess = current.len() - replicas;
            for m in current.clone().into_iter().take(excess) {
                if m.ready {
                    if available <= min_available {
                        break;
                    }
                    available -= 1;
                }
                deletes.push((m.name.clone(), DeleteReason::ScaledDown));
                current.retain(|c| c.name != m.name);
            }
        }
        // 3. Out-of-date proxies that still serve: only as far as the available count stays
        //    at or above replicas - maxUnavailable.
        for (m, r) in &stale {
            if available_of(m) && available > min_available {
                deletes.push((m.name.clone(), *r));
                available -= 1;
            }
        }
        // 4. New proxies of the current revision, within maxSurge.
        let remaining = live.len() - deletes.len();
        let room = (replicas + surge).saturating_sub(remaining);
        let wanted = replicas.saturating_sub(current.len());
        let mut per_placement = vec![0usize; spec.placements.len()];
        let mut per_zone: Vec<std::collections::BTreeMap<String, usize>> =
            vec![Default::default(); spec.placements.len()];
        for m in &current {
            if let Some(i) = m.placement.filter(|i| *i < per_placement.len()) {
                per_placement[i] += 1;
                if let Some(z) = &m.zone {
                    *per_zone[i].entry(z.clone()).or_default() += 1;
                }
            }
        }
        let target = targets(spec);
        for _ in 0..wanted.min(room) {
            // The placement furthest below its share; none below: the one with room left.
            let pick = (0..per_placement.len())
                .filter(|&i| {
                    spec.placements[i]
                        .max_replicas
                        .is_none_or(|m| per_placement[i] < m as usize)
                })
                .max_by_key(|&i| {
                    (
                        target[i] as i64 - per_placement[i] as i64,
                        std::cmp::Reverse(i),
                    )
                });
            let Some(i) = pick else { break };
            let zones = &spec.placements[i].zones;
            let zone = zones
                .iter()
                .min_by_key(|z| per_zone[i].get(*z).copied().unwrap_or(0))
                .cloned()
                .or_else(|| spec.template.placement.zone.clone());
            if let Some(z) = &zone {
                *per_zone[i].entry(z.clone()).or_default() += 1;
            }
            per_placement[i] += 1;
            creates.push(Create {
                placement: i,
                zone,
                revision: revisions.get(i).cloned().unwrap_or_default(),
            });
        }
    }

    let status = status(
        spec,
        members,
        &live,
        ready_now,
        updated_now,
        min_available,
        &creates,
        &deletes,
    );
    let requeue_after = spec.rotation.as_ref().and_then(|r| {
        live.iter()
            .filter(|m| stale_reason(m).is_none())
            .filter_map(|m| Some(m.created_at? + age_limit(r, &m.name)? - now))
            .min()
            .map(|s| Duration::from_secs(s.max(1) as u64))
    });
    Decision {
        creates,
        deletes,
        status,
        requeue_after,
    }
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
/// annotation, Ready condition and cordon mark. The CLI and the operator both read their
/// Proxies through this, so they decide alike.
pub fn member(
    proxy: &crate::Proxy,
    status: &crate::ProxyStatus,
    created_at: Option<i64>,
    deleting: bool,
) -> Member {
    use crate::reconcile::{self, reason};
    let meta = &proxy.metadata;
    let failure = status
        .condition(reconcile::READY)
        .filter(|c| {
            c.status != "True"
                && matches!(
                    c.reason.as_str(),
                    reason::PERMANENT_FAILURE | reason::QUOTA_EXCEEDED
                )
        })
        .map(|c| format!("{}: {}", c.reason, c.message));
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
        ready: reconcile::ready_is_true(status),
        cordoned: meta
            .annotations
            .get(crate::discovery::CORDON_ANNOTATION)
            .is_some_and(|v| v == "true"),
        deleting,
        failure,
    }
}

/// `<pool>-<5 hex>`, from the pool's identity and a serial, so names are the same on every
/// run.
pub fn member_name(pool: &ProxyPool, serial: u64) -> String {
    let identity =
        pool.metadata.uid.clone().unwrap_or_else(|| {
            crate::name::derived_uid(&pool.metadata.namespace, &pool.metadata.name)
        });
    let digest = hex::encode(Sha256::digest(format!("{identity}/{serial}").as_bytes()));
    format!("{}-{}", pool.metadata.name, &digest[..5])
}

/// The Proxy a create names: the template, the placement's provider and fields, the pool's
/// label, the placement and the revision.
pub fn member_proxy(pool: &ProxyPool, c: &Create, name: &str) -> crate::Proxy {
    use std::collections::BTreeMap;
    let spec = &pool.spec;
    let p = spec.placements.get(c.placement);
    let t = &spec.template.placement;
    let mut labels = BTreeMap::new();
    labels.insert(
        crate::discovery::POOL_LABEL.to_string(),
        pool.metadata.name.clone(),
    );
    labels.insert(PLACEMENT_LABEL.to_string(), c.placement.to_string());
    let mut annotations = BTreeMap::new();
    annotations.insert(REVISION_ANNOTATION.to_string(), c.revision.clone());
    crate::Proxy {
        api_version: crate::proxy::API_VERSION.into(),
        kind: crate::proxy::KIND.into(),
        metadata: crate::proxy::ObjectMeta {
            name: name.to_string(),
            namespace: pool.metadata.namespace.clone(),
            uid: None,
            generation: Some(1),
            labels,
            annotations,
        },
        spec: crate::ProxySpec {
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

#[allow(clippy::too_many_arguments)]
fn status(
    spec: &PoolSpec,
    members: &[Member],
    live: &[&Member],
    ready: usize,
    updated: usize,
    min_available: usize,
    creates: &[Create],
    deletes: &[(String, DeleteReason)],
) -> PoolStatus {
    let placements: Vec<PlacementStatus> = spec
        .placements
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mine: Vec<&&Member> = live.iter().filter(|m| m.placement == Some(i)).collect();
            PlacementStatus {
                provider: p.provider.clone(),
                replicas: mine.len() as u32,
                ready_replicas: mine.iter().filter(|m| m.ready && !m.cordoned).count() as u32,
                last_error: mine.iter().find_map(|m| m.failure.clone()),
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
    let available = ready >= min_available;
    let settled = creates.is_empty()
        && deletes.is_empty()
        && updated == replicas
        && live.len() == replicas
        && members.iter().all(|m| !m.deleting);
    let degraded: Vec<String> = placements
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            p.last_error
                .as_ref()
                .map(|e| format!("placements[{i}] ({}): {e}", p.provider))
        })
        .collect();
    let mut conditions = vec![
        cond(
            "Available",
            available,
            if available {
                "MinimumReplicasAvailable"
            } else {
                "MinimumReplicasUnavailable"
            },
            format!("{ready} of {replicas} ready; at least {min_available} must be"),
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
            format!(
                "{updated} of {replicas} up to date; {} to create, {} to delete",
                creates.len(),
                deletes.len()
            ),
        ),
    ];
    conditions.push(cond(
        "PlacementDegraded",
        !degraded.is_empty(),
        if degraded.is_empty() {
            "AllPlacementsCreate"
        } else {
            "CannotCreate"
        },
        if degraded.is_empty() {
            "every placement creates".into()
        } else {
            degraded.join("; ")
        },
    ));
    PoolStatus {
        observed_generation: None,
        replicas: live.len() as u32,
        ready_replicas: ready as u32,
        updated_replicas: updated as u32,
        conditions,
        placements,
    }
}

#[cfg(test)]
mod tests;
