//! Quotas per namespace and per holder, as whoever runs the installation declares them (a
//! file: in a cluster, a ConfigMap of the installation's own namespace). Read by the gateway
//! (bytes per day, tunnels at once) and by the lease API (proxies leased at once); each reads
//! the limits it enforces and leaves the others.
//!
//! ```yaml
//! quotas:
//!   - namespace: crawlers          # every holder on the namespace's pools, together
//!     bytesPerDay: 500Gi
//!     concurrentTunnels: 2000
//!     concurrentLeases: 40
//!   - namespace: crawlers
//!     holder: system:serviceaccount:crawlers:spider   # this holder on them
//!     bytesPerDay: 50Gi
//!     concurrentLeases: 10
//!     memberHoursPerDay: 200       # exclusive member-hours its leases take per UTC day
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Rules at most in a quotas file.
pub const MAX_RULES: usize = 10_000;
/// The largest quotas file read: ten thousand rules fit in far less.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    quotas: Vec<QuotaRule>,
}

/// One quota.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaRule {
    /// The namespace whose pools it covers.
    pub namespace: String,
    /// One holder on them; unset: all of them together.
    #[serde(default)]
    pub holder: Option<String>,
    /// Bytes both ways per UTC day: a number, or one with a binary suffix (`Ki`, `Mi`, `Gi`,
    /// `Ti`).
    #[serde(default, deserialize_with = "bytes")]
    pub bytes_per_day: Option<u64>,
    /// Tunnels open at once.
    #[serde(default)]
    pub concurrent_tunnels: Option<u64>,
    /// Proxies held under live leases at once, over every pool of the namespace.
    #[serde(default)]
    pub concurrent_leases: Option<u64>,
    /// Hours of members held under exclusive leases per UTC day, over every pool of the
    /// namespace (a member held for 30 minutes is half an hour).
    #[serde(default)]
    pub member_hours_per_day: Option<u64>,
}

impl QuotaRule {
    /// Whether it covers `holder` on the pools of `namespace`.
    pub fn applies(&self, namespace: &str, holder: &str) -> bool {
        self.namespace == namespace && self.holder.as_deref().is_none_or(|h| h == holder)
    }

    /// `namespace crawlers` or `holder spider in namespace crawlers`: what a refusal names.
    pub fn of(&self) -> String {
        match &self.holder {
            Some(holder) => format!("holder {holder} in namespace {}", self.namespace),
            None => format!("namespace {}", self.namespace),
        }
    }
}

fn bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Number(u64),
        Text(String),
    }
    let given = Option::<Given>::deserialize(d)?;
    match given {
        None => Ok(None),
        Some(Given::Number(n)) => Ok(Some(n)),
        Some(Given::Text(t)) => parse_bytes(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

/// `500Gi` → bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40)]
        .iter()
        .find_map(|(s, shift)| t.strip_suffix(s).map(|d| (d, *shift)))
        .unwrap_or((t, 0));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (a number, or with Ki, Mi, Gi, Ti)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// The rules of a quotas file's `text` (YAML), checked: each names a namespace and a limit;
/// an error names the field at fault.
pub fn parse(text: &str) -> Result<Vec<QuotaRule>, String> {
    let file: File = serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
        .map_err(|e| e.to_string())?;
    if file.quotas.len() > MAX_RULES {
        return Err(format!("quotas: more than {MAX_RULES} rules"));
    }
    for (i, r) in file.quotas.iter().enumerate() {
        if r.namespace.is_empty() {
            return Err(format!("quotas[{i}].namespace: empty"));
        }
        if r.bytes_per_day.is_none()
            && r.concurrent_tunnels.is_none()
            && r.concurrent_leases.is_none()
            && r.member_hours_per_day.is_none()
        {
            return Err(format!(
                "quotas[{i}]: no limit (bytesPerDay, concurrentTunnels, concurrentLeases or memberHoursPerDay)"
            ));
        }
    }
    Ok(file.quotas)
}

/// The `concurrentLeases` a lease of `asked` more proxies by `holder` on the pools of
/// `namespace` would pass, where the namespace's holders hold `held` now (holder, proxies):
/// the first rule it would pass, with its limit. Pure: the lease API reads `held` from the
/// bindings of the namespace's members.
pub fn leases_past<'a>(
    rules: &'a [QuotaRule],
    namespace: &str,
    holder: &str,
    held: &[(String, u64)],
    asked: u64,
) -> Option<(&'a QuotaRule, u64)> {
    rules.iter().find_map(|r| {
        let limit = r.concurrent_leases?;
        if !r.applies(namespace, holder) {
            return None;
        }
        let now: u64 = held
            .iter()
            .filter(|(h, _)| r.holder.as_deref().is_none_or(|rh| rh == h))
            .map(|(_, n)| *n)
            .sum();
        (now.saturating_add(asked) > limit).then_some((r, limit))
    })
}

/// `status.leaseUsage` of a pool: the exclusive member-seconds each holder's leases took on
/// the UTC day `day`, as the pool controller integrates them (kept in the pool's status,
/// which no tenant writes, so it survives restarts and every replica reads one count).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaseUsage {
    /// The UTC day (days since 1970-01-01) the seconds are of.
    pub day: u64,
    /// Unix seconds: when the seconds were last added up to.
    pub accounted_at: i64,
    /// Per holder (at most [`MAX_USAGE_HOLDERS`]; the rest together as `*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<HolderUsage>,
}

/// One holder's member-seconds of the day, and the members it held exclusively then.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HolderUsage {
    /// The holder (`*`: every holder past the bound, together).
    pub holder: String,
    /// Exclusive member-seconds its leases took this day, up to `accountedAt`.
    pub member_seconds: u64,
    /// Members it held exclusively at `accountedAt` (what the next interval is counted at).
    #[serde(default)]
    pub holding: u64,
}

/// Holders a pool's `status.leaseUsage` names at most; past it, the rest are counted as one
/// `*`, which every holder's quota counts (a quota errs toward holding).
pub const MAX_USAGE_HOLDERS: usize = 256;

/// The holder that stands for every holder past [`MAX_USAGE_HOLDERS`].
pub const OTHER_HOLDERS: &str = "*";

/// `prev` carried to `now` (unix seconds): each holder's member-seconds grow by the members it
/// held at the last accounting times the time since (within today: a new UTC day starts at
/// zero), and `holding` (holder, members held exclusively now) is what the next interval is
/// counted at. None while nothing was held today.
pub fn account(
    prev: Option<&LeaseUsage>,
    holding: &[(String, u64)],
    now: i64,
) -> Option<LeaseUsage> {
    let day = u64::try_from(now.max(0) / 86_400).unwrap_or(0);
    let start = i64::try_from(day * 86_400).unwrap_or(i64::MAX);
    let mut seconds: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    if let Some(p) = prev {
        let since = p.accounted_at.max(start);
        let elapsed = u64::try_from(now.saturating_sub(since)).unwrap_or(0);
        for h in &p.holders {
            let before = if p.day == day { h.member_seconds } else { 0 };
            let added = h.holding.saturating_mul(elapsed);
            let total = before.saturating_add(added);
            if total > 0 {
                *seconds.entry(h.holder.clone()).or_default() += total;
            }
        }
    }
    let mut now_holding: std::collections::BTreeMap<String, u64> = Default::default();
    for (h, n) in holding.iter().filter(|(_, n)| *n > 0) {
        *now_holding.entry(h.clone()).or_default() += n;
    }
    if seconds.is_empty() && now_holding.is_empty() {
        return None;
    }
    let names: std::collections::BTreeSet<String> =
        seconds.keys().chain(now_holding.keys()).cloned().collect();
    let mut holders: Vec<HolderUsage> = names
        .into_iter()
        .map(|holder| HolderUsage {
            member_seconds: seconds.get(&holder).copied().unwrap_or(0),
            holding: now_holding.get(&holder).copied().unwrap_or(0),
            holder,
        })
        .collect();
    // `*` from before stays one with whatever else does not fit.
    let mut other = holders
        .iter()
        .position(|h| h.holder == OTHER_HOLDERS)
        .map(|i| holders.remove(i));
    if holders.len() + usize::from(other.is_some()) > MAX_USAGE_HOLDERS {
        // The most used stay by name; the rest are one.
        holders.sort_by(|a, b| {
            (b.member_seconds, b.holding)
                .cmp(&(a.member_seconds, a.holding))
                .then(a.holder.cmp(&b.holder))
        });
        let rest = holders.split_off(MAX_USAGE_HOLDERS - 1);
        let o = other.get_or_insert_with(|| HolderUsage {
            holder: OTHER_HOLDERS.into(),
            ..HolderUsage::default()
        });
        for h in rest {
            o.member_seconds = o.member_seconds.saturating_add(h.member_seconds);
            o.holding = o.holding.saturating_add(h.holding);
        }
    }
    holders.extend(other);
    holders.sort_by(|a, b| a.holder.cmp(&b.holder));
    Some(LeaseUsage {
        day,
        accounted_at: now,
        holders,
    })
}

/// The `memberHoursPerDay` a new lease of `holder` on the pools of `namespace` would find
/// reached, given the pools' `usages` at `now`: the first such rule. What each pool counted up
/// to its `accountedAt` and what its holders held since both count.
pub fn member_hours_reached<'a>(
    rules: &'a [QuotaRule],
    namespace: &str,
    holder: &str,
    usages: &[&LeaseUsage],
    now: i64,
) -> Option<(&'a QuotaRule, u64)> {
    let day = u64::try_from(now.max(0) / 86_400).unwrap_or(0);
    rules.iter().find_map(|r| {
        let limit = r.member_hours_per_day?;
        if !r.applies(namespace, holder) {
            return None;
        }
        let used: u64 = usages
            .iter()
            .filter(|u| u.day == day)
            .flat_map(|u| {
                let since = u64::try_from(now.saturating_sub(u.accounted_at)).unwrap_or(0);
                u.holders.iter().map(move |h| (h, since))
            })
            .filter(|(h, _)| {
                h.holder == OTHER_HOLDERS || r.holder.as_deref().is_none_or(|rh| rh == h.holder)
            })
            .map(|(h, since)| {
                h.member_seconds
                    .saturating_add(h.holding.saturating_mul(since))
            })
            .fold(0u64, u64::saturating_add);
        (used >= limit.saturating_mul(3600)).then_some((r, limit))
    })
}

/// The proxies each holder holds under live `bindings` at `now` (unix seconds): what
/// [`leases_past`] reads, from the bindings of a namespace's members.
pub fn held_by_holder<'a>(
    bindings: impl IntoIterator<Item = &'a crate::model::lease::LeaseBinding>,
    now: i64,
) -> Vec<(String, u64)> {
    let mut held: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for b in bindings {
        if b.live(now) {
            *held.entry(b.holder.as_str()).or_default() += 1;
        }
    }
    held.into_iter().map(|(h, n)| (h.to_string(), n)).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_file_names_the_field_at_fault() {
        let rules = parse(
            "quotas:\n- {namespace: ns, bytesPerDay: 2Gi}\n- {namespace: ns, holder: spider, concurrentLeases: 3}\n",
        )
        .unwrap();
        assert_eq!(rules[0].bytes_per_day, Some(2 << 30));
        assert_eq!(rules[1].concurrent_leases, Some(3));
        let e = parse("quotas:\n- {namespace: ns, concurrentLease: 3}\n").unwrap_err();
        assert!(e.starts_with("quotas[0]"), "{e}");
        let e = parse("quotas:\n- {namespace: ns}\n").unwrap_err();
        assert!(e.contains("no limit"), "{e}");
        let e = parse("quotas:\n- {namespace: '', concurrentLeases: 1}\n").unwrap_err();
        assert!(e.contains("namespace: empty"), "{e}");
        assert!(parse("quotas:\n- {namespace: ns, bytesPerDay: 1Pi}\n").is_err());
    }

    /// Over every count held by the holder and the others, and every ask: a lease passes a
    /// holder's rule exactly when its own proxies and the ask exceed it, a namespace's when
    /// everyone's and the ask do; another namespace's rule never applies.
    #[test]
    fn over_every_count_a_lease_passes_a_rule_exactly_past_its_limit() {
        let rules = parse(
            "quotas:\n- {namespace: ns, holder: spider, concurrentLeases: 3}\n- {namespace: ns, concurrentLeases: 5}\n- {namespace: other, concurrentLeases: 0}\n",
        )
        .unwrap();
        for own in 0..=6u64 {
            for others in 0..=6u64 {
                for asked in 0..=4u64 {
                    let held = [("spider".to_string(), own), ("rival".to_string(), others)];
                    let past = leases_past(&rules, "ns", "spider", &held, asked);
                    let want = if own + asked > 3 {
                        Some(3)
                    } else if own + others + asked > 5 {
                        Some(5)
                    } else {
                        None
                    };
                    assert_eq!(past.map(|(_, l)| l), want, "{own} {others} {asked}");
                    // rival has no rule of its own: only the namespace's.
                    let past = leases_past(&rules, "ns", "rival", &held, asked);
                    assert_eq!(
                        past.map(|(_, l)| l),
                        (own + others + asked > 5).then_some(5)
                    );
                }
            }
        }
        assert!(leases_past(&rules, "third", "spider", &[], 100).is_none());
    }

    /// Member-seconds follow the members held between accountings, a new UTC day starts at
    /// zero, and the quota counts what was held since the last accounting too.
    #[test]
    fn member_seconds_follow_what_was_held_and_restart_each_day() {
        let day0 = 20_000 * 86_400;
        let spider = |n: u64| vec![("spider".to_string(), n)];
        assert_eq!(account(None, &[], day0), None, "nothing held, nothing kept");
        let u = account(None, &spider(2), day0 + 100).unwrap();
        assert_eq!((u.holders[0].member_seconds, u.holders[0].holding), (0, 2));
        // Two members for 1800 s: one member-hour; then one member.
        let u = account(Some(&u), &spider(1), day0 + 1900).unwrap();
        assert_eq!(u.holders[0].member_seconds, 3600);
        let rules = parse(
            "quotas:\n- {namespace: ns, holder: spider, memberHoursPerDay: 2}\n- {namespace: ns, memberHoursPerDay: 3}\n",
        )
        .unwrap();
        // At 1900 + 3599 s: 1 h + 3599 s held since: not yet; at + 3600: two hours.
        assert!(member_hours_reached(&rules, "ns", "spider", &[&u], day0 + 1900 + 3599).is_none());
        let (r, limit) =
            member_hours_reached(&rules, "ns", "spider", &[&u], day0 + 1900 + 3600).unwrap();
        assert_eq!((r.holder.as_deref(), limit), (Some("spider"), 2));
        // rival: only the namespace's 3 hours, counting spider's.
        assert!(member_hours_reached(&rules, "ns", "rival", &[&u], day0 + 1900 + 3600).is_none());
        assert!(member_hours_reached(&rules, "ns", "rival", &[&u], day0 + 1900 + 7200).is_some());
        // The next day: yesterday's hours are gone; the member still held counts from midnight.
        let next = day0 + 86_400 + 60;
        let u = account(Some(&u), &spider(1), next).unwrap();
        assert_eq!((u.day, u.holders[0].member_seconds), (20_001, 60));
        assert!(member_hours_reached(&rules, "ns", "spider", &[&u], next).is_none());
        // Released: kept for the day with nothing held.
        let u = account(Some(&u), &[], next + 40).unwrap();
        assert_eq!(
            (u.holders[0].member_seconds, u.holders[0].holding),
            (100, 0)
        );
    }

    /// Past MAX_USAGE_HOLDERS, the least used are one `*`, which counts against everyone.
    #[test]
    fn a_pools_usage_names_at_most_its_bound_of_holders() {
        let now = 20_000 * 86_400;
        let many: Vec<(String, u64)> = (0..MAX_USAGE_HOLDERS as u64 + 10)
            .map(|i| (format!("h{i:04}"), 1 + i))
            .collect();
        let u = account(None, &many, now).unwrap();
        let u = account(Some(&u), &many, now + 10).unwrap();
        assert_eq!(u.holders.len(), MAX_USAGE_HOLDERS);
        let other = u
            .holders
            .iter()
            .find(|h| h.holder == OTHER_HOLDERS)
            .unwrap();
        assert_eq!(other.holding, (1..=11).sum::<u64>());
        let total: u64 = u.holders.iter().map(|h| h.member_seconds).sum();
        assert_eq!(total, many.iter().map(|(_, n)| n * 10).sum::<u64>());
    }
}
