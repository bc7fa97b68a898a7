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
//! ```

use serde::Deserialize;

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
        {
            return Err(format!(
                "quotas[{i}]: no limit (bytesPerDay, concurrentTunnels or concurrentLeases)"
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
}
