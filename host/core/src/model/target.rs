//! Targets: the sites a crawler reaches through a proxy, as the quarantine keys them, and what
//! a Proxy's status and a pool's spec say about them.
//!
//! A target is the registrable domain of a request's host (the CONNECT authority's, or a plain
//! request's), by the Public Suffix List: `www.shop.example.co.uk` and `img.example.co.uk` are
//! one target, `example.co.uk`, because a site that bans an address bans it on every host of its
//! own; `a.github.io` and `b.github.io` are two, because the list says `github.io` is a suffix
//! under which each name is somebody else's. An address is its own target.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The longest target name (a DNS name is at most 253 characters).
pub const MAX_TARGET: usize = 253;

/// The target of `host` (a DNS name, a dotted quad or a bracketed IPv6 address, as the
/// gateway's destination rules take them; without the port): its registrable domain in
/// lower case, or the host itself when it is an address, a public suffix or a name the list
/// knows no suffix of. None for an empty or overlong host.
pub fn target_of(host: &str) -> Option<String> {
    let host = host.trim_end_matches('.');
    if host.is_empty() || host.len() > MAX_TARGET {
        return None;
    }
    let lower = host.to_ascii_lowercase();
    if lower.starts_with('[') || lower.parse::<std::net::Ipv4Addr>().is_ok() {
        return Some(lower);
    }
    // The maintained list, compiled into the `psl` crate (updated with each release of it),
    // rather than a list of our own that would go stale. A name under no known suffix (an
    // internal name) is matched by the list's default rule, `*`: its last two labels.
    let domain = psl::domain_str(&lower).unwrap_or(&lower);
    Some(domain.to_string())
}

/// A target that refused a proxy's address, as the Proxy's status keeps it (written with the
/// leases, under the same resourceVersion precondition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Quarantine {
    /// The target ([`target_of`]).
    pub target: String,
    /// RFC 3339: when its latest quarantine began.
    pub since: String,
    /// RFC 3339: until when new traffic for the target avoids the proxy.
    pub until: String,
    /// Quarantines in a row: each doubles the cooldown. The record is forgotten once the
    /// target has been quiet for `maxCooldown` past `until`, and the next one starts at 1.
    pub strikes: u32,
    /// Who signalled during the latest quarantine and when: holders as the first 16 hex digits
    /// of the SHA-256 of their names (no one is named), the newest [`REPORTERS_KEPT`]. A
    /// holder's further reports of the same quarantine count once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reporters: Vec<crate::model::lease::BanReport>,
}

/// Quarantine records one Proxy keeps at most: a bound on its status whatever is reported.
pub const QUARANTINES_KEPT: usize = 32;

/// Reporters one record keeps (the newest).
pub const REPORTERS_KEPT: usize = 8;

/// A holder's target reports count at most [`REPORTS_PER_WINDOW`] times per pool in this long:
/// a crawler that reports every address for every site it meets cannot quarantine a pool's
/// worth at once (and the cap per target bounds what it can).
pub const REPORT_WINDOW: Duration = Duration::from_secs(60);

pub const REPORTS_PER_WINDOW: usize = 60;

/// `spec.quarantine` of a ProxyPool: how a member banned by a target is kept from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuarantinePolicy {
    /// The first quarantine of a member for a target (default 5m); each one in a row doubles
    /// it, ±10% (fixed per member, target and strike, so replicas and plans agree), up to
    /// `maxCooldown`. A longer `Retry-After` from the target is honoured.
    #[serde(default = "default_cooldown")]
    pub cooldown: String,
    /// The longest quarantine (default 6h); a target quiet this long past a quarantine's end
    /// forgets the member's strikes.
    #[serde(default = "default_max_cooldown")]
    pub max_cooldown: String,
    /// The most of the pool's members quarantined for one target at once, in percent (default
    /// 50, rounded down): past it, signals for the target are recorded but quarantine no one,
    /// and the pool says `TargetBlocked`, so one site that bans everyone cannot take the pool
    /// from the sites that do not.
    #[serde(default = "default_max_quarantined_percent")]
    #[schemars(range(max = 100))]
    pub max_quarantined_percent: u32,
    /// A member quarantined by this many distinct targets at once is replaced, through the
    /// pool's budget like any voluntary disruption (default 5; 0 never).
    #[serde(default = "default_replace_after_targets")]
    pub replace_after_targets: u32,
    /// The statuses of a plain request's answer the gateway reads as the target refusing the
    /// member's address (default 403, 429, 503).
    #[serde(default = "default_signal_statuses")]
    #[schemars(length(max = 16))]
    pub signal_statuses: Vec<u16>,
}

impl Default for QuarantinePolicy {
    fn default() -> Self {
        Self {
            cooldown: default_cooldown(),
            max_cooldown: default_max_cooldown(),
            max_quarantined_percent: default_max_quarantined_percent(),
            replace_after_targets: default_replace_after_targets(),
            signal_statuses: default_signal_statuses(),
        }
    }
}

impl QuarantinePolicy {
    /// `cooldown` and `maxCooldown`, parsed, or what is wrong (naming the field).
    pub fn cooldowns(&self) -> Result<(Duration, Duration), String> {
        let base = crate::config::parse_duration(&self.cooldown)
            .map_err(|e| format!("spec.quarantine.cooldown: {e}"))?;
        let max = crate::config::parse_duration(&self.max_cooldown)
            .map_err(|e| format!("spec.quarantine.maxCooldown: {e}"))?;
        if base.is_zero() {
            return Err("spec.quarantine.cooldown: must be more than 0s".into());
        }
        if max < base {
            return Err(format!(
                "spec.quarantine.maxCooldown: {} is shorter than cooldown {}",
                self.max_cooldown, self.cooldown
            ));
        }
        Ok((base, max))
    }

    /// What is wrong with the policy, naming the field, if anything.
    pub fn validate(&self) -> Result<(), String> {
        self.cooldowns()?;
        if self.max_quarantined_percent > 100 {
            return Err(format!(
                "spec.quarantine.maxQuarantinedPercent: {} is over 100",
                self.max_quarantined_percent
            ));
        }
        if self.signal_statuses.len() > 16 {
            return Err("spec.quarantine.signalStatuses: at most 16".into());
        }
        if let Some(s) = self
            .signal_statuses
            .iter()
            .find(|s| !(400..=599).contains(*s))
        {
            return Err(format!(
                "spec.quarantine.signalStatuses: {s} is not a 4xx or 5xx status"
            ));
        }
        Ok(())
    }
}

fn default_cooldown() -> String {
    "5m".into()
}

fn default_max_cooldown() -> String {
    "6h".into()
}

fn default_max_quarantined_percent() -> u32 {
    50
}

fn default_replace_after_targets() -> u32 {
    5
}

fn default_signal_statuses() -> Vec<u16> {
    vec![403, 429, 503]
}

/// `POST /v1/reports`, as a crawler sends it: a target refused one of the pool's proxies.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReportRequest {
    pub namespace: String,
    pub pool: String,
    /// The Proxy's name (as discovery and the lease answer name it).
    pub proxy: String,
    /// The host the crawler was refused by; its target is its registrable domain.
    pub target: String,
    /// Seconds the target asked to wait (its `Retry-After`), if it said.
    #[serde(default)]
    pub retry_after: Option<u64>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_target_is_the_registrable_domain_by_the_public_suffix_list() {
        let cases = [
            ("www.example.com", "example.com"),
            ("EXAMPLE.com.", "example.com"),
            ("a.b.shop.example.co.uk", "example.co.uk"),
            ("img.example.co.uk", "example.co.uk"),
            // A suffix under which each name is somebody else's.
            ("alice.github.io", "alice.github.io"),
            ("bob.github.io", "bob.github.io"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]", "[::1]"),
            ("localhost", "localhost"),
            ("echo.internal.test", "internal.test"),
        ];
        for (host, target) in cases {
            assert_eq!(target_of(host).as_deref(), Some(target), "{host}");
        }
        assert_eq!(target_of(""), None);
        assert_eq!(target_of(&"a".repeat(254)), None);
    }

    #[test]
    fn a_policy_names_the_field_at_fault() {
        let ok = QuarantinePolicy::default();
        assert_eq!(ok.validate(), Ok(()));
        let bad = QuarantinePolicy {
            cooldown: "10m".into(),
            max_cooldown: "5m".into(),
            ..ok.clone()
        };
        assert!(bad.validate().unwrap_err().contains("maxCooldown"));
        let bad = QuarantinePolicy {
            max_quarantined_percent: 101,
            ..ok.clone()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("maxQuarantinedPercent")
        );
        let bad = QuarantinePolicy {
            signal_statuses: vec![200],
            ..ok
        };
        assert!(bad.validate().unwrap_err().contains("signalStatuses"));
    }
}
