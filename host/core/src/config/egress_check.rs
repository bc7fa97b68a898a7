//! The `egressCheck` block: the echoes, the schedule, the thresholds and the pinned TLS of the
//! egress check, and `IntOrPercent`, which it and the pool share.

use super::text::{ConfigError, parse_duration};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The egress check: through each running proxy, a plain-HTTP request to an `http://` echo
/// and a CONNECT tunnel with TLS end to end to an `https://` echo, each answering httpbin's
/// `/anything` format with the probe's nonce (`egress-proxies echo` serves both). A proxy is
/// verified only when both pass; its egress address is the one the TLS echo saw, which the
/// proxy can neither read nor forge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EgressCheck {
    /// Echo endpoints: at least one `http://` (port 80 or 443) and one `https://` (port 443),
    /// the ports the generated Squid forwards to. Per scheme, probes use the first that
    /// answers the checker directly, in this order.
    pub urls: Vec<String>,
    /// How the https echoes' certificates are trusted. Default: the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<EgressTls>,
    /// How often each proxy is checked: each at its own offset of the interval (from its
    /// name), so the checks of a fleet spread evenly over it.
    #[serde(default = "default_check_interval")]
    pub interval: String,
    /// One check's bound.
    #[serde(default = "default_check_timeout")]
    pub timeout: String,
    /// Checks under way at once, on their own: they never wait for a reconcile slot nor hold
    /// one, so provider calls are not queued behind slow proxies, nor checks behind slow
    /// creates. Enough for a round of the fleet within the interval when a tenth of it times
    /// out: about fleet / 10 × timeout / interval, with room to spare.
    #[serde(default = "default_check_concurrency")]
    pub concurrency: u32,
    /// Failed checks in a row, after the proxy was verified once, that replace it. Until
    /// then the proxy counts as available to its pool: a blip shorter than this many checks
    /// is invisible to the pool.
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
    /// Failed checks in a row, after the proxy was verified once, that take it out of
    /// discovery (Ready False), as a kubelet readiness probe's failureThreshold; one verified
    /// check puts it back. At most failureThreshold, which is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_failure_threshold: Option<u32>,
    /// How long a running proxy may take to verify for the first time before it is replaced.
    #[serde(default = "default_startup_timeout")]
    pub startup_timeout: String,
    /// When more of one provider's checked proxies than this fail at once (a number or a
    /// percentage), none of them is replaced: an outage, not dead proxies.
    #[serde(default = "default_max_unhealthy")]
    pub max_unhealthy: IntOrPercent,
    /// Other addresses of the checker as the world may see them (a NAT's public address):
    /// an echo that sees one of them was reached without the proxy hiding the client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_addresses: Vec<String>,
    /// The local address probes are sent from (default: the system's choice): a proxy admits
    /// clients by source address, so the checker must come from one it allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_address: Option<String>,
}

/// Trust for the https echoes: a CA bundle, or the echo certificate's fingerprint (what
/// `egress-proxies echo` prints for the certificate it makes itself). At most one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EgressTls {
    /// A PEM file of CA certificates the echo's certificate must chain to, for the URL's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The SHA-256 of the echo's certificate (DER), in hex (colons allowed): only that
    /// certificate is accepted, whatever name it holds.
    #[serde(
        default,
        rename = "certificateSHA256",
        skip_serializing_if = "Option::is_none"
    )]
    pub certificate_sha256: Option<String>,
}

impl EgressTls {
    /// The pinned fingerprint as 32 bytes, or why it is not one.
    pub fn pin(&self) -> Option<Result<[u8; 32], String>> {
        self.certificate_sha256.as_deref().map(parse_sha256)
    }
}

/// 64 hex digits, optionally in colon-separated pairs (as `openssl x509 -fingerprint` prints).
pub fn parse_sha256(text: &str) -> Result<[u8; 32], String> {
    let digits: String = text.chars().filter(|c| *c != ':').collect();
    let bad = || format!("{text:?} is not a SHA-256 fingerprint (64 hex digits, colons allowed)");
    if digits.len() != 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// An echo URL's scheme and port, as the check reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoTarget {
    pub https: bool,
    pub port: u16,
}

/// Reads `http[s]://host[:port]...` far enough to know where the proxy must go, or says why it
/// cannot be an echo URL. The network layer parses it fully; this is the load-time check.
pub fn echo_target(url: &str) -> Result<EchoTarget, String> {
    let lower = url.to_ascii_lowercase();
    let (https, rest) = if lower.starts_with("http://") {
        (false, &url["http://".len()..])
    } else if lower.starts_with("https://") {
        (true, &url["https://".len()..])
    } else {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    };
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{url:?} holds whitespace or a control character"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(format!(
            "{url:?} carries user information; an echo URL takes none"
        ));
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((h, after)) => (h, after.strip_prefix(':')),
            None => ("", None),
        },
        None => match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(format!("{url:?} names no host"));
    }
    let port = match port {
        None => {
            if https {
                443
            } else {
                80
            }
        }
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("{url:?} has an invalid port")),
        },
    };
    Ok(EchoTarget { https, port })
}

fn default_check_interval() -> String {
    "30s".to_string()
}

/// The most checks a config may run at once.
pub const MAX_CHECK_CONCURRENCY: u32 = 4096;

fn default_check_concurrency() -> u32 {
    256
}

fn default_check_timeout() -> String {
    "5s".to_string()
}

fn default_failure_threshold() -> u32 {
    3
}

fn default_startup_timeout() -> String {
    "10m".to_string()
}

fn default_max_unhealthy() -> IntOrPercent {
    IntOrPercent::Percent("40%".to_string())
}

/// A count or a percentage of a total, as Kubernetes' IntOrString (`3`, `"25%"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum IntOrPercent {
    Int(u32),
    Percent(String),
}

impl std::fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Percent(p) => f.write_str(p),
        }
    }
}

impl IntOrPercent {
    /// The value against `total`: a percentage rounded up or down as `round_up` says, as
    /// Kubernetes' GetScaledValueFromIntOrPercent. An unparsable percentage counts as 0.
    pub fn resolve(&self, total: usize, round_up: bool) -> usize {
        match self {
            Self::Int(n) => *n as usize,
            Self::Percent(p) => {
                let pct = percent(p).unwrap_or(0) as usize;
                if round_up {
                    (pct * total).div_ceil(100)
                } else {
                    pct * total / 100
                }
            }
        }
    }

    /// An error for a malformed value, e.g. `"40"` or `"140%"` where `max_pct` is 100.
    pub fn check(&self, max_pct: u32) -> Result<(), String> {
        match self {
            Self::Int(_) => Ok(()),
            Self::Percent(p) => match percent(p) {
                Some(n) if n <= max_pct => Ok(()),
                Some(n) => Err(format!("{n}% is more than {max_pct}%")),
                None => Err(format!(
                    "{p:?} is neither a number nor a percentage like \"25%\""
                )),
            },
        }
    }
}

fn percent(p: &str) -> Option<u32> {
    p.strip_suffix('%')?.parse().ok()
}

pub(super) fn check_egress(c: &EgressCheck) -> Result<(), ConfigError> {
    if c.urls.is_empty() {
        return Err(ConfigError::new(
            "egressCheck.urls",
            "must name at least one http:// and one https:// echo endpoint",
        ));
    }
    let mut schemes = (false, false);
    for (i, u) in c.urls.iter().enumerate() {
        let at = || format!("egressCheck.urls[{i}]");
        let target = echo_target(u).map_err(|m| ConfigError::new(at(), m))?;
        // The ports every generated Squid forwards to (guest_sdk::squid: Safe_ports 80 443,
        // CONNECT to SSL_ports 443 only): an echo elsewhere would fail every proxy with
        // ProxyRefused.
        if target.https && target.port != 443 {
            return Err(ConfigError::new(
                at(),
                format!(
                    "{u:?} is on port {}: the generated Squid tunnels (CONNECT) to port 443 only",
                    target.port
                ),
            ));
        }
        if !target.https && !matches!(target.port, 80 | 443) {
            return Err(ConfigError::new(
                at(),
                format!(
                    "{u:?} is on port {}: the generated Squid forwards plain http to ports 80 and 443 only",
                    target.port
                ),
            ));
        }
        if target.https {
            schemes.1 = true;
        } else {
            schemes.0 = true;
        }
    }
    match schemes {
        (true, true) => {}
        (false, _) => {
            return Err(ConfigError::new(
                "egressCheck.urls",
                "must name an http:// echo too: the plain-HTTP request proves the proxy forwards http and hides the client's headers",
            ));
        }
        (_, false) => {
            return Err(ConfigError::new(
                "egressCheck.urls",
                "must name an https:// echo too: the tunnel to it proves CONNECT works and carries the nonce where the proxy cannot read or forge it",
            ));
        }
    }
    if let Some(tls) = &c.tls {
        if tls.ca_file.is_some() && tls.certificate_sha256.is_some() {
            return Err(ConfigError::new(
                "egressCheck.tls",
                "give caFile or certificateSHA256, not both",
            ));
        }
        if let Some(f) = &tls.ca_file
            && (f.trim().is_empty() || f.contains('\0'))
        {
            return Err(ConfigError::new(
                "egressCheck.tls.caFile",
                "must be a file path",
            ));
        }
        if let Some(Err(m)) = tls.pin() {
            return Err(ConfigError::new("egressCheck.tls.certificateSHA256", m));
        }
    }
    for (field, value) in [
        ("interval", &c.interval),
        ("timeout", &c.timeout),
        ("startupTimeout", &c.startup_timeout),
    ] {
        let d = parse_duration(value)
            .map_err(|m| ConfigError::new(format!("egressCheck.{field}"), m))?;
        if d.is_zero() {
            return Err(ConfigError::new(
                format!("egressCheck.{field}"),
                "must be longer than 0",
            ));
        }
    }
    if parse_duration(&c.timeout).ok() >= parse_duration(&c.interval).ok() {
        return Err(ConfigError::new(
            "egressCheck.timeout",
            format!(
                "{} must be shorter than the interval ({})",
                c.timeout, c.interval
            ),
        ));
    }
    if c.failure_threshold == 0 {
        return Err(ConfigError::new(
            "egressCheck.failureThreshold",
            "must be at least 1",
        ));
    }
    // Each check holds two connections and a TLS session at most: past this, a checker would
    // run out of descriptors before it ran out of checks.
    if !(1..=MAX_CHECK_CONCURRENCY).contains(&c.concurrency) {
        return Err(ConfigError::new(
            "egressCheck.concurrency",
            format!(
                "must be between 1 and {MAX_CHECK_CONCURRENCY}, got {}",
                c.concurrency
            ),
        ));
    }
    if let Some(r) = c.readiness_failure_threshold
        && (r == 0 || r > c.failure_threshold)
    {
        return Err(ConfigError::new(
            "egressCheck.readinessFailureThreshold",
            format!(
                "must be between 1 and failureThreshold ({}), got {r}",
                c.failure_threshold
            ),
        ));
    }
    c.max_unhealthy
        .check(100)
        .map_err(|m| ConfigError::new("egressCheck.maxUnhealthy", m))?;
    if let Some(a) = &c.source_address
        && a.parse::<std::net::IpAddr>().is_err()
    {
        return Err(ConfigError::new(
            "egressCheck.sourceAddress",
            format!("{a:?} is not an IP address"),
        ));
    }
    for (i, a) in c.client_addresses.iter().enumerate() {
        if a.parse::<std::net::IpAddr>().is_err() {
            return Err(ConfigError::new(
                format!("egressCheck.clientAddresses[{i}]"),
                format!("{a:?} is not an IP address"),
            ));
        }
    }
    Ok(())
}
