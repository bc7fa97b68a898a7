//! The `gcp` block: the project, where instances attach, and what the provider manages around
//! them (an optional firewall rule).

use guest_sdk::ProviderError;
use guest_sdk::json::{config_error, parse_config};
use guest_sdk::squid::{
    SourceRange, check_allowed_destinations, check_allowed_ranges, private_ranges,
};
use serde::{Deserialize, Serialize};

/// The Compute API's root when no `endpoint` is configured.
pub const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GcpConfig {
    /// The project instances are created in. Required.
    #[serde(default)]
    pub project: String,
    /// The VPC network: a name in the project, or a `projects/<p>/global/networks/<n>` path
    /// (a shared VPC).
    #[serde(default = "default_network")]
    pub network: String,
    /// The network tag every instance carries; the managed firewall rule targets it.
    #[serde(default = "default_tag")]
    pub network_tag: String,
    #[serde(default = "default_disk")]
    pub disk_size_gb: u32,
    /// The API root, e.g. `https://compute.googleapis.com` (the default). Plain http only on
    /// loopback, for local doubles: bearer tokens never cross a network in clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Instances get no external address; the proxy's address is the NIC's internal one.
    #[serde(default, rename = "internalIP")]
    pub internal_ip: bool,
    /// Ensure one firewall rule per provider that opens the proxy port to the tagged instances.
    #[serde(default)]
    pub manage_firewall: bool,
    /// Source ranges the proxy admits: the generated Squid (a Proxy without cloudInit) accepts
    /// clients from them, and the managed firewall rule opens the port to them. Default: the
    /// private ranges, so a VM with an external address is never an open proxy; clients that
    /// reach that address arrive from their public addresses, which must be listed. Never
    /// empty, never a /0 (an empty `sourceRanges` would make GCE open the rule to 0.0.0.0/0).
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
    /// The Google credentials file this provider's calls use (a service-account key or an
    /// authorized-user file), read by the host, which attaches the token: the module never
    /// sees it. Default: Application Default Credentials. Its `token_uri` is honoured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_file: Option<String>,
    /// The region whose quota headroom the health check reports. Default: the region of a
    /// managed instance, when the check sees one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

fn default_network() -> String {
    "default".into()
}
fn default_tag() -> String {
    "egress-proxy".into()
}
fn default_disk() -> u32 {
    10
}

impl GcpConfig {
    /// The API root without a trailing slash.
    pub fn endpoint(&self) -> &str {
        self.endpoint
            .as_deref()
            .unwrap_or(DEFAULT_ENDPOINT)
            .trim_end_matches('/')
    }

    /// The network as the API wants it in a NIC.
    pub fn network_path(&self) -> String {
        if self.network.contains('/') {
            self.network.clone()
        } else {
            format!("global/networks/{}", self.network)
        }
    }
}

/// A GCE resource name: `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_resource_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !s.ends_with('-')
}

/// A project ID: 6-30 of `[a-z0-9-]`, starting with a letter (a domain-scoped `example.com:p`
/// is allowed too).
fn is_project(s: &str) -> bool {
    let id = s.rsplit(':').next().unwrap_or(s);
    (6..=30).contains(&id.len())
        && id.as_bytes()[0].is_ascii_lowercase()
        && id
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !id.ends_with('-')
}

fn is_loopback(host: &str) -> bool {
    matches!(host, "localhost" | "127.0.0.1" | "[::1]") || host.starts_with("127.")
}

/// Parses, defaults and checks the block; errors name the field under `path`.
pub fn validate(path: &str, text: &str) -> Result<GcpConfig, ProviderError> {
    let cfg: GcpConfig = parse_config(path, text)?;
    let at = |field: &str| format!("{path}.{field}");
    if cfg.project.is_empty() {
        return Err(config_error(&at("project"), "is required"));
    }
    if !is_project(&cfg.project) {
        return Err(config_error(
            &at("project"),
            &format!("{:?} is not a project ID", cfg.project),
        ));
    }
    let network_ok = if cfg.network.contains('/') {
        let parts: Vec<&str> = cfg.network.split('/').collect();
        matches!(parts.as_slice(), ["projects", p, "global", "networks", n] if is_project(p) && is_resource_name(n))
    } else {
        is_resource_name(&cfg.network)
    };
    if !network_ok {
        return Err(config_error(
            &at("network"),
            &format!(
                "{:?} is neither a network name nor projects/<p>/global/networks/<n>",
                cfg.network
            ),
        ));
    }
    if !is_resource_name(&cfg.network_tag) {
        return Err(config_error(
            &at("networkTag"),
            &format!("{:?} is not a valid tag ([a-z][-a-z0-9]*)", cfg.network_tag),
        ));
    }
    if !(10..=65_536).contains(&cfg.disk_size_gb) {
        return Err(config_error(
            &at("diskSizeGb"),
            "must be between 10 and 65536",
        ));
    }
    if let Some(endpoint) = &cfg.endpoint {
        check_endpoint(endpoint).map_err(|m| config_error(&at("endpoint"), &m))?;
    }
    check_allowed_ranges(&at("allowedSourceCIDRs"), &cfg.allowed_source_cidrs)?;
    check_allowed_destinations(
        &at("allowedDestinationCIDRs"),
        &cfg.allowed_destination_cidrs,
    )?;
    if let Some(file) = &cfg.credentials_file
        && (file.trim().is_empty() || file.contains('\0'))
    {
        return Err(config_error(&at("credentialsFile"), "must be a file path"));
    }
    if let Some(region) = &cfg.region
        && !is_resource_name(region)
    {
        return Err(config_error(
            &at("region"),
            &format!("{region:?} is not a region name"),
        ));
    }
    Ok(cfg)
}

fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let (https, rest) = if let Some(r) = endpoint.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = endpoint.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("{endpoint:?} is not an http(s) URL"));
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "{endpoint:?} must be a scheme and host (and port) only, e.g. {DEFAULT_ENDPOINT}"
        ));
    }
    let host = match rest.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => h,
        _ => rest,
    };
    if !https && !is_loopback(host) {
        return Err(format!(
            "{endpoint:?}: plain http is allowed on loopback only; tokens must not travel in clear"
        ));
    }
    Ok(())
}
