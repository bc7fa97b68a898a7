//! The `kubernetes` block: the Squid image, resources, and who may use the proxy.

use guest_sdk::ProviderError;
use guest_sdk::json::{config_error, parse_config};
use guest_sdk::squid::{
    SourceRange, check_allowed_destinations, check_allowed_ranges, private_ranges,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const DEFAULT_IMAGE: &str = "docker.io/ubuntu/squid:6.10-24.10_beta";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesConfig {
    #[serde(default = "default_image")]
    pub image: String,
    #[serde(default)]
    pub resources: Resources,
    /// Source ranges Squid accepts clients from (`http_access`). Default: the private ranges
    /// Pod networks use; never "allow all" (a /0 does not parse).
    #[serde(default = "private_ranges", rename = "allowedSourceCIDRs")]
    pub allowed_source_cidrs: Vec<SourceRange>,
    /// Destinations the generated Squid reaches although they are internal (loopback and `::`, RFC
    /// 1918, CGNAT, NAT64, link-local, unique-local: `guest_sdk::squid::REFUSED_DESTINATIONS`), for
    /// crawls of private sites. Default: none. A range holding a cloud metadata address is
    /// refused: the metadata services stay closed whatever this lists.
    #[serde(
        default,
        rename = "allowedDestinationCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allowed_destination_cidrs: Vec<SourceRange>,
    /// The user the container runs as (the image's `proxy` user by default).
    #[serde(default = "default_uid")]
    pub run_as_user: i64,
    /// Spreads the proxies' Pods over a topology (nodes by default), for clusters whose nodes
    /// egress on addresses of their own: Pods on distinct nodes then have distinct egress IPs.
    /// Without it the scheduler places them as it likes, often several on one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
}

/// A topology spread constraint over every proxy Pod of this provider and installation (every
/// pool's: proxies of two pools on one node share its egress address as much as those of one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spread {
    /// The node label whose values are the domains spread over.
    #[serde(default = "default_topology_key")]
    pub topology_key: String,
    /// `ScheduleAnyway` (the default: a Pod with no empty domain left still runs, on a node
    /// that has one already, and the pool's distinctEgress rule replaces it) or
    /// `DoNotSchedule` (it stays Pending until a domain frees).
    #[serde(default = "default_when_unsatisfiable")]
    pub when_unsatisfiable: String,
    /// How many more Pods one domain may hold than the emptiest.
    #[serde(default = "default_max_skew")]
    pub max_skew: u32,
}

fn default_topology_key() -> String {
    "kubernetes.io/hostname".into()
}
fn default_when_unsatisfiable() -> String {
    "ScheduleAnyway".into()
}
fn default_max_skew() -> u32 {
    1
}

/// Whether `key` is a Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a
/// name of at most 63 alphanumerics, `-`, `_` or `.`, starting and ending alphanumeric.
fn label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Resources {
    #[serde(default = "default_requests")]
    pub requests: BTreeMap<String, String>,
    #[serde(default = "default_limits")]
    pub limits: BTreeMap<String, String>,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            requests: default_requests(),
            limits: default_limits(),
        }
    }
}

fn default_image() -> String {
    DEFAULT_IMAGE.to_string()
}
fn default_uid() -> i64 {
    13
}
fn default_requests() -> BTreeMap<String, String> {
    [("cpu", "50m"), ("memory", "64Mi")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into()
}
fn default_limits() -> BTreeMap<String, String> {
    [("memory", "256Mi")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into()
}

/// Parses, defaults and checks the block; errors name the field under `path`.
pub fn validate(path: &str, text: &str) -> Result<KubernetesConfig, ProviderError> {
    let cfg: KubernetesConfig = parse_config(path, text)?;
    if cfg.image.trim().is_empty() || cfg.image.chars().any(char::is_whitespace) {
        return Err(config_error(
            &format!("{path}.image"),
            "must be a non-empty image reference without spaces",
        ));
    }
    check_allowed_ranges(
        &format!("{path}.allowedSourceCIDRs"),
        &cfg.allowed_source_cidrs,
    )?;
    check_allowed_destinations(
        &format!("{path}.allowedDestinationCIDRs"),
        &cfg.allowed_destination_cidrs,
    )?;
    if let Some(spread) = &cfg.spread {
        if !label_key(&spread.topology_key) {
            return Err(config_error(
                &format!("{path}.spread.topologyKey"),
                &format!("{:?} is not a label key", spread.topology_key),
            ));
        }
        if !matches!(
            spread.when_unsatisfiable.as_str(),
            "ScheduleAnyway" | "DoNotSchedule"
        ) {
            return Err(config_error(
                &format!("{path}.spread.whenUnsatisfiable"),
                "is ScheduleAnyway or DoNotSchedule",
            ));
        }
        if spread.max_skew == 0 {
            return Err(config_error(
                &format!("{path}.spread.maxSkew"),
                "must be at least 1",
            ));
        }
    }
    if cfg.run_as_user <= 0 {
        return Err(config_error(
            &format!("{path}.runAsUser"),
            "must be a non-root user id (> 0)",
        ));
    }
    for (section, map) in [
        ("requests", &cfg.resources.requests),
        ("limits", &cfg.resources.limits),
    ] {
        for (k, v) in map {
            if !matches!(k.as_str(), "cpu" | "memory" | "ephemeral-storage") {
                return Err(config_error(
                    &format!("{path}.resources.{section}.{k}"),
                    "unknown resource; use cpu, memory or ephemeral-storage",
                ));
            }
            if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') {
                return Err(config_error(
                    &format!("{path}.resources.{section}.{k}"),
                    &format!("{v:?} is not a quantity"),
                ));
            }
        }
    }
    Ok(cfg)
}
