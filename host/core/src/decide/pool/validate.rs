//! Whether a pool's spec can be acted on: its own fields ([`validate`]) and what the
//! installation it runs in allows ([`validate_in`]). Each problem names the field at fault.

use super::budgets::budgets;
use super::members::NAME_LEN;
use crate::model::pool::*;
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
    // An autoscaled pool's budgets are those of the size it may reach.
    let at_most = PoolSpec {
        replicas: s.most_replicas(),
        ..s.clone()
    };
    let (surge, unavailable) = budgets(&at_most);
    if at_most.replicas > 0 && surge == 0 && unavailable == 0 {
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
    if let Some(q) = &s.quarantine
        && let Err(m) = q.validate()
    {
        problems.push(m);
    }
    if let Some(p) = &s.politeness
        && let Err(m) = p.validate()
    {
        problems.push(m);
    }
    if let Some(a) = &s.autoscale {
        if a.max_replicas < a.min_replicas {
            problems.push(format!(
                "spec.autoscale.maxReplicas: {} is less than minReplicas ({})",
                a.max_replicas, a.min_replicas
            ));
        }
        if a.max_replicas > MAX_REPLICAS_CEILING {
            problems.push(format!(
                "spec.autoscale.maxReplicas: {} is more than {MAX_REPLICAS_CEILING}",
                a.max_replicas
            ));
        }
        for (field, v) in [
            ("tunnelsPerMember", a.tunnels_per_member),
            ("leasesPerMember", a.leases_per_member),
        ] {
            if v == Some(0) {
                problems.push(format!("spec.autoscale.{field}: must be at least 1"));
            }
        }
        for (field, v, most) in [
            ("idleAfter", &a.idle_after, None),
            (
                "coldStartWait",
                &a.cold_start_wait,
                Some(crate::model::autoscale::MAX_COLD_START_WAIT),
            ),
        ] {
            match v.as_deref().map(crate::config::parse_duration) {
                Some(Err(m)) => problems.push(format!("spec.autoscale.{field}: {m}")),
                Some(Ok(d)) if most.is_some_and(|m| d > m) => problems.push(format!(
                    "spec.autoscale.{field}: at most {}s",
                    most.map_or(0, |m| m.as_secs())
                )),
                _ => {}
            }
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
    if let Some(a) = &s.autoscale
        && a.max_replicas > env.max_replicas
        && a.max_replicas <= MAX_REPLICAS_CEILING
    {
        problems.push(format!(
            "spec.autoscale.maxReplicas: {} is more than the {} this installation allows (--max-replicas raises it)",
            a.max_replicas, env.max_replicas
        ));
    }
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
