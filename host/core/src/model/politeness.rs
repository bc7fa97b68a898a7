//! `spec.politeness` of a ProxyPool: how often, and how many at once, the pool's egress
//! addresses start tunnels and requests to a target, so that a crawler's traffic stays below
//! the rate at which sites start banning an address.
//!
//! A budget is kept per (member, target) and, optionally, per (pool, target) over all members;
//! the target is the registrable domain of the request's host
//! ([`crate::model::target::target_of`]), while a rule's `match` is tested against the host.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The most rules one pool lists: each request is matched against them in order.
pub const MAX_RULES: usize = 64;
/// The longest a request may wait for budget before it is refused: a waiting request holds a
/// crawler's connection and a slot of the gateway's.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// The longest gap a rule may ask between two starts.
pub const MAX_EVERY: Duration = Duration::from_secs(3600);
/// The most tunnels or requests in flight a rule may allow per key.
pub const MAX_CONCURRENCY: u32 = 100_000;

/// `spec.politeness`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolitenessPolicy {
    /// How long a request may wait for budget before it is answered 429 (default 0s: at once;
    /// at most 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<String>,
    /// The rules, the first whose `match` fits the request's host applies (at most 64).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub targets: Vec<PoliteTarget>,
}

/// One rule of `spec.politeness.targets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoliteTarget {
    /// `example.com`: that host exactly; `*.example.com`: it and any name under it; `*`: any.
    #[serde(rename = "match")]
    #[schemars(length(max = 253))]
    pub pattern: String,
    /// The budget of each egress address (member) for the request's target.
    pub per_address: Budget,
    /// The budget of the whole pool for the request's target, over all its members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_pool: Option<Budget>,
}

/// A budget: the least time between two starts, and the most in flight at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Budget {
    /// The least time between two starts of a tunnel or request (e.g. 5s; at most 1h; none:
    /// no gap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// Tunnels and requests in flight at once (at least 1, at most 100000; none: no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100_000))]
    pub concurrency: Option<u32>,
}

/// A host pattern, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    Any,
    /// The name and any name under it (lower case, without the `*.`).
    Domain(String),
    /// The name only (lower case).
    Exact(String),
}

impl Pattern {
    /// `s` as a pattern, or what is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let name = |n: &str| -> Result<String, String> {
            let n = n.trim_end_matches('.').to_ascii_lowercase();
            let ok = !n.is_empty()
                && n.len() <= crate::model::target::MAX_TARGET
                && n.split('.').all(|l| {
                    !l.is_empty()
                        && l.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                });
            // An IPv6 address in brackets, as the gateway spells its hosts.
            let v6 = n.starts_with('[')
                && n.ends_with(']')
                && n[1..n.len() - 1].parse::<std::net::Ipv6Addr>().is_ok();
            if ok || v6 {
                Ok(n)
            } else {
                Err(format!(
                    "{s:?} is not a host name, `*.` and a host name, or `*`"
                ))
            }
        };
        match s {
            "*" => Ok(Pattern::Any),
            _ => match s.strip_prefix("*.") {
                Some(rest) => Ok(Pattern::Domain(name(rest)?)),
                None => Ok(Pattern::Exact(name(s)?)),
            },
        }
    }

    /// Whether `host` (lower case or not, without the port) fits.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        match self {
            Pattern::Any => true,
            Pattern::Exact(n) => host.eq_ignore_ascii_case(n),
            Pattern::Domain(n) => {
                host.eq_ignore_ascii_case(n)
                    || (host.len() > n.len()
                        && host.is_char_boundary(host.len() - n.len() - 1)
                        && host.as_bytes()[host.len() - n.len() - 1] == b'.'
                        && host[host.len() - n.len()..].eq_ignore_ascii_case(n))
            }
        }
    }
}

/// A budget, parsed: `every` zero for no gap, `concurrency` None for no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub every: Duration,
    pub concurrency: Option<u32>,
}

/// A rule, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// As written, for the answers that name it.
    pub written: String,
    pub pattern: Pattern,
    pub per_address: Limit,
    pub per_pool: Option<Limit>,
}

impl Rule {
    /// How the rule reads in an answer: `match "*.example.com" (perAddress every 5s,
    /// concurrency 1)`.
    pub fn describe(&self) -> String {
        let limit = |l: &Limit| {
            let mut parts = Vec::new();
            if !l.every.is_zero() {
                parts.push(format!("every {:?}", l.every));
            }
            if let Some(c) = l.concurrency {
                parts.push(format!("concurrency {c}"));
            }
            parts.join(", ")
        };
        let mut s = format!(
            "match {:?} (perAddress {}",
            self.written,
            limit(&self.per_address)
        );
        if let Some(p) = &self.per_pool {
            s.push_str(&format!("; perPool {}", limit(p)));
        }
        s.push(')');
        s
    }
}

/// A policy, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Politeness {
    pub max_wait: Duration,
    pub rules: Vec<Rule>,
}

impl Politeness {
    /// The first rule whose pattern fits `host`.
    pub fn rule_for(&self, host: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.pattern.matches(host))
    }
}

impl Budget {
    fn parse(&self, field: &str) -> Result<Limit, String> {
        let every = match &self.every {
            None => Duration::ZERO,
            Some(e) => {
                crate::config::parse_duration(e).map_err(|m| format!("{field}.every: {m}"))?
            }
        };
        if every > MAX_EVERY {
            return Err(format!("{field}.every: at most 1h"));
        }
        match self.concurrency {
            Some(0) => return Err(format!("{field}.concurrency: at least 1")),
            Some(c) if c > MAX_CONCURRENCY => {
                return Err(format!("{field}.concurrency: at most {MAX_CONCURRENCY}"));
            }
            _ => {}
        }
        if every.is_zero() && self.concurrency.is_none() {
            return Err(format!(
                "{field}: give every, concurrency or both (an empty budget limits nothing)"
            ));
        }
        Ok(Limit {
            every,
            concurrency: self.concurrency,
        })
    }
}

impl PolitenessPolicy {
    /// The policy parsed, or what is wrong with it (naming the field).
    pub fn parse(&self) -> Result<Politeness, String> {
        let max_wait = match &self.max_wait {
            None => Duration::ZERO,
            Some(w) => crate::config::parse_duration(w)
                .map_err(|m| format!("spec.politeness.maxWait: {m}"))?,
        };
        if max_wait > MAX_WAIT {
            return Err("spec.politeness.maxWait: at most 30s".into());
        }
        if self.targets.len() > MAX_RULES {
            return Err(format!("spec.politeness.targets: at most {MAX_RULES}"));
        }
        let rules = self
            .targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let field = format!("spec.politeness.targets[{i}]");
                Ok(Rule {
                    written: t.pattern.clone(),
                    pattern: Pattern::parse(&t.pattern)
                        .map_err(|m| format!("{field}.match: {m}"))?,
                    per_address: t.per_address.parse(&format!("{field}.perAddress"))?,
                    per_pool: t
                        .per_pool
                        .as_ref()
                        .map(|p| p.parse(&format!("{field}.perPool")))
                        .transpose()?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Politeness { max_wait, rules })
    }

    /// What is wrong with the policy, naming the field, if anything.
    pub fn validate(&self) -> Result<(), String> {
        self.parse().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn policy(yaml: &str) -> Result<PolitenessPolicy, String> {
        serde_yaml::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn the_brief_form_reads_and_the_first_matching_rule_applies() {
        let p = policy(
            "maxWait: 2s\ntargets:\n- match: \"*.example.com\"\n  perAddress: {every: 5s, concurrency: 1}\n  perPool: {every: 100ms, concurrency: 50}\n- match: \"*\"\n  perAddress: {concurrency: 4}\n",
        )
        .unwrap()
        .parse()
        .unwrap();
        assert_eq!(p.max_wait, Duration::from_secs(2));
        let r = p.rule_for("img.Example.com").unwrap();
        assert_eq!(r.written, "*.example.com");
        assert_eq!(r.per_address.every, Duration::from_secs(5));
        assert_eq!(r.per_pool.unwrap().concurrency, Some(50));
        assert_eq!(p.rule_for("example.com").unwrap().written, "*.example.com");
        assert_eq!(p.rule_for("notexample.com").unwrap().written, "*");
        assert!(r.describe().contains("every 5s") && r.describe().contains("perPool"));
    }

    #[test]
    fn patterns_match_exactly_under_a_domain_or_anything() {
        let exact = Pattern::parse("example.com").unwrap();
        assert!(exact.matches("EXAMPLE.com.") && !exact.matches("www.example.com"));
        let domain = Pattern::parse("*.example.com").unwrap();
        for host in ["example.com", "a.example.com", "a.b.example.com"] {
            assert!(domain.matches(host), "{host}");
        }
        for host in ["badexample.com", "example.org", "com"] {
            assert!(!domain.matches(host), "{host}");
        }
        assert!(Pattern::parse("127.0.0.14").unwrap().matches("127.0.0.14"));
        assert!(Pattern::parse("[::1]").unwrap().matches("[::1]"));
        assert!(Pattern::parse("*").unwrap().matches("anything"));
        for bad in ["", "*.", "a.*.com", "exa mple.com", "a..b", "**"] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_policy_names_the_field_at_fault() {
        let cases = [
            ("maxWait: 31s", "spec.politeness.maxWait"),
            ("maxWait: soon", "spec.politeness.maxWait"),
            (
                "targets: [{match: 'a..b', perAddress: {every: 1s}}]",
                "spec.politeness.targets[0].match",
            ),
            (
                "targets: [{match: a.com, perAddress: {every: 2h}}]",
                "spec.politeness.targets[0].perAddress.every",
            ),
            (
                "targets: [{match: a.com, perAddress: {concurrency: 0}}]",
                "spec.politeness.targets[0].perAddress.concurrency",
            ),
            (
                "targets: [{match: a.com, perAddress: {every: 1s}}, {match: b.com, perAddress: {}}]",
                "spec.politeness.targets[1].perAddress",
            ),
            (
                "targets: [{match: a.com, perAddress: {every: 1s}, perPool: {concurrency: 100001}}]",
                "spec.politeness.targets[0].perPool.concurrency",
            ),
        ];
        for (yaml, field) in cases {
            let e = policy(yaml).unwrap().validate().unwrap_err();
            assert!(e.starts_with(field), "{yaml}: {e}");
        }
        let many: Vec<String> = (0..65)
            .map(|i| format!("{{match: a{i}.com, perAddress: {{every: 1s}}}}"))
            .collect();
        let e = policy(&format!("targets: [{}]", many.join(", ")))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.starts_with("spec.politeness.targets:"), "{e}");
        assert!(
            policy("targets: [{match: a.com, perAddress: {every: 1s}, extra: 1}]").is_err(),
            "unknown fields are refused"
        );
        assert_eq!(PolitenessPolicy::default().validate(), Ok(()));
    }
}
