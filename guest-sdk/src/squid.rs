//! The one Squid configuration every provider deploys: the Kubernetes Pod passes it to the
//! container, the VM providers write it with a generated cloud-init when a Proxy brings none.
//!
//! Pure, and built only from typed values: the port is a `u16` and each source range a parsed
//! [`SourceRange`], whose text is re-rendered from the parsed address. Nothing a user writes
//! reaches the output verbatim, so no value can add a Squid directive or a YAML key.
//!
//! The proxy does not announce itself: no `Via`, no `X-Forwarded-For`, no `Cache-Control` of
//! its own, no version string. Sites see the crawler's request as the crawler sent it, from the
//! proxy's address.
//!
//! Nor does it reach what sits beside it: loopback (`::` and the IPv4-compatible range with
//! it), the private and shared ranges, NAT64's prefixes, link-local and unique-local networks
//! ([`REFUSED_DESTINATIONS`]) are refused as destinations unless a provider's
//! `allowedDestinationCIDRs` opts a range back in, and the cloud metadata addresses
//! ([`METADATA_DESTINATIONS`]) are refused always. Nor does it name the host it runs on
//! ([`VISIBLE_HOSTNAME`]).
//!
//! And it serves no one without the proxy's credential: Basic proxy authentication against
//! the htpasswd the host hands each create ([`Htpasswd`]), checked by Squid's
//! `basic_ncsa_auth` (crypt(3), SHA-512 crypt lines). A client outside the allowed source
//! ranges is refused before it is asked for one.

use crate::ProviderError;
use crate::json::config_error;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The private IPv4 ranges (RFC 1918): where Pod networks, VPC subnets and hypervisor LANs
/// put their clients. The default of every provider's `allowedSourceCIDRs`, because a proxy
/// with a public address must never be open to the Internet.
pub const PRIVATE_RANGES: [&str; 3] = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];

/// Destinations every generated Squid refuses unless the provider's `allowedDestinationCIDRs`
/// lists them: "this network" (0/8), loopback, RFC 1918, CGNAT's shared space (RFC 6598),
/// link-local, the IPv4-compatible IPv6 range (::/96, which holds `::1` and the unspecified
/// `::`, which Linux connects to the local host), NAT64's well-known and local-use prefixes
/// (RFC 6052, RFC 8215: a translator beside the proxy carries them to IPv4, loopback and
/// private ranges included), unique-local (fc00::/7) and link-local. Behind them sit the
/// proxy's own host, the VPC's or cluster's other machines and the hypervisor's LAN; a crawler
/// has no business there, and an open path to them turns a proxy into a way in.
///
/// The IPv4-mapped range (`::ffff:0:0/96`) is not listed: Squid keeps every IPv4 address in
/// that form, so it would refuse all of IPv4, and judges `[::ffff:127.0.0.1]` as the IPv4
/// address it carries, which the IPv4 ranges here already refuse.
pub const REFUSED_DESTINATIONS: [&str; 12] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "::/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "fc00::/7",
    "fe80::/10",
];

/// The cloud metadata services (GCE and EC2's IPv4 169.254.169.254, also as the IPv4-mapped
/// IPv6 address a URL may spell it as, EC2's IPv6 fd00:ec2::254, GCE's IPv6 fd20:ce::254),
/// which hand the machine's credentials and user data to whoever asks from it: refused
/// always; no opt-in re-allows them.
pub const METADATA_DESTINATIONS: [&str; 4] = [
    "169.254.169.254/32",
    "::ffff:169.254.169.254/128",
    "fd00:ec2::254/128",
    "fd20:ce::254/128",
];

/// The host name Squid gives itself in error pages (and would in `Via` and `X-Cache`, which
/// the config turns off): a fixed one, so no answer names the machine a proxy runs on.
pub const VISIBLE_HOSTNAME: &str = "egress-proxy";

/// Where a VM's Squid reads the proxy's htpasswd: beside its config, readable by root and the
/// `proxy` group Squid's helpers run as, no one else.
pub const VM_HTPASSWD_PATH: &str = "/etc/squid/egress-proxies.htpasswd";

/// Where a container's Squid reads the proxy's htpasswd: the file `htpasswd` of the Secret
/// volume mounted at [`CONTAINER_AUTH_DIR`] (a whole volume, not a `subPath`, so an updated
/// Secret reaches the running proxy).
pub const CONTAINER_HTPASSWD_PATH: &str = "/etc/squid-auth/htpasswd";
/// The Secret volume's mount point.
pub const CONTAINER_AUTH_DIR: &str = "/etc/squid-auth";
/// The key of the htpasswd in the proxy's Secret.
pub const HTPASSWD_KEY: &str = "htpasswd";

/// Debian's (and the Ubuntu squid image's) Basic authentication helper for htpasswd files.
pub const NCSA_AUTH_HELPER: &str = "/usr/lib/squid/basic_ncsa_auth";

/// The realm a 407 challenge names.
pub const AUTH_REALM: &str = "egress-proxies";

/// The htpasswd of a proxy as the host handed it: one or more `user:hash` lines, each user
/// name and hash made only of the characters crypt(3) hashes and safe user names use, so the
/// text can go into a YAML block or a file without quoting and carries no directive.
#[derive(Clone, PartialEq, Eq)]
pub struct Htpasswd(String);

/// Never printed: it is a secret even hashed.
impl fmt::Debug for Htpasswd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Htpasswd(<{} lines>)", self.0.lines().count())
    }
}

impl Htpasswd {
    /// Checks the host's text. The error says what is wrong without quoting the text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let lines: Vec<&str> = text.lines().collect();
        if lines.is_empty() {
            return Err("the proxy's htpasswd is empty".into());
        }
        for (i, line) in lines.iter().enumerate() {
            let Some((user, hash)) = line.split_once(':') else {
                return Err(format!("line {} of the proxy's htpasswd has no ':'", i + 1));
            };
            let user_ok = !user.is_empty()
                && user
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
            let hash_ok = hash.starts_with('$')
                && hash
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'$' | b'.' | b'/' | b'='));
            if !user_ok || !hash_ok {
                return Err(format!(
                    "line {} of the proxy's htpasswd is not `user:$id$…` in crypt(3)'s characters",
                    i + 1
                ));
            }
        }
        let mut text = lines.join("\n");
        text.push('\n');
        Ok(Self(text))
    }

    /// The file's content, newline-terminated.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An htpasswd no password matches (`*` is no crypt(3) hash): what a generated config
    /// gets should a caller have no credential for it, so it admits no one rather than all.
    pub fn nobody() -> Self {
        Self("nobody:*\n".into())
    }
}

/// The htpasswd a VM create needs: none when the Proxy brings its own cloud-init (it installs
/// whatever it installs, and the host's credential cannot be woven into it), else the host's
/// ([`require_htpasswd`]). Called before anything is made, so a create without a credential
/// leaves nothing behind.
pub fn htpasswd_unless_own(
    host: &dyn crate::Host,
    req: &crate::CreateRequest,
) -> Result<Option<Htpasswd>, ProviderError> {
    match req.cloud_init {
        Some(_) => Ok(None),
        None => require_htpasswd(host).map(Some),
    }
}

/// A VM's user-data: the Proxy's own cloud-init when it brings one (it wins, whatever it
/// holds), else [`cloud_init`] for its port, the block's ranges and the proxy's htpasswd.
pub fn vm_user_data<'a>(
    req: &'a crate::CreateRequest,
    allowed: &[SourceRange],
    allowed_destinations: &[SourceRange],
    htpasswd: Option<&Htpasswd>,
) -> std::borrow::Cow<'a, str> {
    match &req.cloud_init {
        Some(own) => std::borrow::Cow::Borrowed(own),
        None => std::borrow::Cow::Owned(cloud_init(
            req.port,
            allowed,
            allowed_destinations,
            htpasswd.unwrap_or(&Htpasswd::nobody()),
        )),
    }
}

/// The htpasswd of the proxy a create makes, from the host; a create without one fails
/// (permanent: the host is older than the module or broken), since a proxy without a
/// credential would be open to every client in its source ranges.
pub fn require_htpasswd(host: &dyn crate::Host) -> Result<Htpasswd, ProviderError> {
    let text = host.proxy_htpasswd().ok_or_else(|| {
        crate::permanent(
            "NoCredential",
            "the host gave this create no proxy credential; a proxy is never made without one"
                .to_string(),
        )
    })?;
    Htpasswd::parse(&text).map_err(|m| crate::permanent("NoCredential", m))
}

/// Where Squid writes its config on a VM. The distribution's own path, so the packaged
/// service unit starts it as is.
pub const VM_CONF_PATH: &str = "/etc/squid/squid.conf";

/// A range of client addresses the proxy accepts: an IPv4 or IPv6 network in CIDR notation,
/// with no bits set past the prefix, and never a /0 (that would be an open proxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceRange {
    network: IpAddr,
    prefix: u8,
}

/// Why a text is not a [`SourceRange`]. The messages quote the text escaped, so a stray
/// newline or quote is visible in the error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRangeError {
    /// No `/prefix`: a bare address is not accepted, the width must be explicit.
    MissingPrefix(String),
    /// The part before `/` is not an IPv4 or IPv6 address.
    InvalidAddress(String),
    /// The prefix is not a number up to 32 (IPv4) or 128 (IPv6).
    InvalidPrefix(String),
    /// Bits are set past the prefix; `network` is the range the prefix actually covers.
    HostBitsSet { text: String, network: String },
    /// A /0: every address there is.
    Open(String),
}

impl fmt::Display for SourceRangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingPrefix(t) => write!(
                f,
                "{t:?} has no prefix length; write a range such as 10.0.0.0/8, or 203.0.113.7/32 for one address"
            ),
            Self::InvalidAddress(t) => write!(f, "{t:?} is not an IPv4 or IPv6 CIDR"),
            Self::InvalidPrefix(t) => write!(
                f,
                "{t:?} has an invalid prefix length (1-32 for IPv4, 1-128 for IPv6)"
            ),
            Self::HostBitsSet { text, network } => write!(
                f,
                "{text:?} has address bits set beyond its prefix; the range it covers is {network}"
            ),
            Self::Open(t) => write!(f, "{t:?}: a /0 range makes an open proxy"),
        }
    }
}

impl std::error::Error for SourceRangeError {}

fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

impl FromStr for SourceRange {
    type Err = SourceRangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let owned = || text.to_string();
        let (addr, bits) = text
            .split_once('/')
            .ok_or_else(|| SourceRangeError::MissingPrefix(owned()))?;
        let network: IpAddr = addr
            .parse()
            .map_err(|_| SourceRangeError::InvalidAddress(owned()))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        // `u8::from_str` accepts a leading `+`; a prefix is digits only.
        let prefix = match bits.parse::<u8>() {
            Ok(p) if p <= max && bits.bytes().all(|b| b.is_ascii_digit()) => p,
            _ => return Err(SourceRangeError::InvalidPrefix(owned())),
        };
        if prefix == 0 {
            return Err(SourceRangeError::Open(owned()));
        }
        let covered = masked(network, prefix);
        if covered != network {
            return Err(SourceRangeError::HostBitsSet {
                text: owned(),
                network: format!("{covered}/{prefix}"),
            });
        }
        Ok(Self { network, prefix })
    }
}

impl fmt::Display for SourceRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl SourceRange {
    pub fn network(&self) -> IpAddr {
        self.network
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `addr` is in the range (an address of the other family never is).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.network, addr) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                masked(addr, self.prefix) == self.network
            }
            _ => false,
        }
    }
}

/// As the text it was parsed from, so a config block keeps the field's shape (a list of
/// strings) and a parse error names the element (`allowedSourceCIDRs[1]`).
impl Serialize for SourceRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SourceRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// [`PRIVATE_RANGES`], parsed: the serde default of an `allowedSourceCIDRs` field.
pub fn private_ranges() -> Vec<SourceRange> {
    PRIVATE_RANGES
        .iter()
        .filter_map(|r| r.parse().ok())
        .collect()
}

/// Checks a config's `allowedSourceCIDRs` (its field path is `path`): each element parsed
/// already, so what is left is that the list names someone and not everyone. Squid would deny
/// everyone with an empty list, but a config that can never serve is a mistake to report, not
/// to deploy. A single /0 is refused at parse; ranges that together cover all of IPv4 (IPv4
/// ranges and IPv4-mapped IPv6 ones, which Squid matches IPv4 clients against) or all of IPv6
/// make the same open proxy and are refused here.
pub fn check_allowed_ranges(path: &str, ranges: &[SourceRange]) -> Result<(), ProviderError> {
    if ranges.is_empty() {
        return Err(config_error(
            path,
            "must list at least one range; an open proxy is not allowed",
        ));
    }
    if let Some(family) = covered_family(ranges) {
        return Err(config_error(
            path,
            &format!(
                "together the ranges cover every {family} address, which makes an open proxy; list the networks the clients are in"
            ),
        ));
    }
    Ok(())
}

/// A range as inclusive bounds in one family's address space.
fn bounds(network: u128, prefix: u8, bits: u8) -> (u128, u128) {
    let host_bits = u32::from(bits - prefix);
    let span = if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    (network, network | span)
}

/// Whether the intervals cover `0..=max` between them.
fn cover(mut intervals: Vec<(u128, u128)>, max: u128) -> bool {
    intervals.sort_unstable();
    let mut next = 0u128;
    for (start, end) in intervals {
        if start > next {
            return false;
        }
        if end >= max {
            return true;
        }
        next = next.max(end + 1);
    }
    false
}

/// The family ("IPv4" or "IPv6") whose every address the ranges hold between them, if any.
fn covered_family(ranges: &[SourceRange]) -> Option<&'static str> {
    const MAPPED: u128 = 0xffff_0000_0000;
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for r in ranges {
        match r.network {
            IpAddr::V4(a) => v4.push(bounds(u128::from(u32::from(a)), r.prefix, 32)),
            IpAddr::V6(a) => {
                let (start, end) = bounds(u128::from(a), r.prefix, 128);
                v6.push((start, end));
                // The part of the range inside ::ffff:0:0/96, as IPv4.
                let (lo, hi) = (start.max(MAPPED), end.min(MAPPED | 0xffff_ffff));
                if lo <= hi {
                    v4.push((lo - MAPPED, hi - MAPPED));
                }
            }
        }
    }
    if cover(v4, u128::from(u32::MAX)) {
        Some("IPv4")
    } else if cover(v6, u128::MAX) {
        Some("IPv6")
    } else {
        None
    }
}

/// Checks a config's `allowedDestinationCIDRs` (its field path is `path`): a range that holds a
/// metadata address is refused, naming the element, since the metadata services stay closed
/// whatever the list says and a range that seems to open them would mislead.
pub fn check_allowed_destinations(path: &str, ranges: &[SourceRange]) -> Result<(), ProviderError> {
    for (i, range) in ranges.iter().enumerate() {
        let metadata = METADATA_DESTINATIONS
            .iter()
            .filter_map(|m| m.parse::<SourceRange>().ok())
            .find(|m| range.contains(m.network()));
        if let Some(m) = metadata {
            return Err(config_error(
                &format!("{path}[{i}]"),
                &format!(
                    "{range} holds the cloud metadata address {}, which a proxy never reaches; list narrower ranges around it",
                    m.network()
                ),
            ));
        }
    }
    Ok(())
}

/// Where the Squid process runs, which decides only where it logs and keeps its pid file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// A container: logs to the container's streams (the runtime collects them), no pid file
    /// (the root filesystem is read-only and the runtime tracks the process).
    Container,
    /// The distribution's `squid` service on a VM: its log files (which its logrotate rules
    /// rotate) and the pid file its systemd unit watches.
    Service,
}

impl Layout {
    /// Where Squid reads the proxy's htpasswd.
    pub fn htpasswd_path(self) -> &'static str {
        match self {
            Layout::Container => CONTAINER_HTPASSWD_PATH,
            Layout::Service => VM_HTPASSWD_PATH,
        }
    }
}

/// The squid.conf for a proxy on `port` that accepts clients from `allowed` only, and of them
/// only those presenting a credential of the htpasswd at the layout's path; and that reaches
/// no [`REFUSED_DESTINATIONS`] but those in `allowed_destinations`, and no
/// [`METADATA_DESTINATIONS`] at all.
///
/// `allowed` is never empty in a validated config; should it be, the config still denies
/// every client rather than allowing any.
pub fn squid_conf(
    port: u16,
    allowed: &[SourceRange],
    allowed_destinations: &[SourceRange],
    layout: Layout,
) -> String {
    let mut s = String::new();
    s.push_str("# Generated by egress-proxies.\n");
    s.push_str(&format!("http_port {port}\n"));
    // Few helpers: a proxy authenticates a handful of crawlers, and Squid remembers a
    // verified credential for an hour, so the helper runs about once per client an hour.
    s.push_str(&format!(
        "auth_param basic program {NCSA_AUTH_HELPER} {}\n\
         auth_param basic children 5 startup=1 idle=1\n\
         auth_param basic realm {AUTH_REALM}\n\
         auth_param basic credentialsttl 1 hour\n\
         acl egress_users proxy_auth REQUIRED\n",
        layout.htpasswd_path()
    ));
    for range in allowed {
        s.push_str(&format!("acl egress_clients src {range}\n"));
    }
    s.push_str(
        "acl SSL_ports port 443\n\
         acl Safe_ports port 80 443\n\
         acl CONNECT method CONNECT\n\
         # Cloud metadata servers give the machine's user data and credentials to any local\n\
         # process: never to a client.\n",
    );
    s.push_str(&format!(
        "acl egress_metadata dst {}\n",
        METADATA_DESTINATIONS.join(" ")
    ));
    s.push_str(
        "# The proxy's own host and the networks beside it: loopback (:: too), private,\n\
         # shared, NAT64, link-local and unique-local.\n",
    );
    s.push_str(&format!(
        "acl egress_internal dst {}\n",
        REFUSED_DESTINATIONS.join(" ")
    ));
    for range in allowed_destinations {
        s.push_str(&format!("acl egress_opted_in dst {range}\n"));
    }
    s.push_str(
        "acl egress_client_cache_control req_header Cache-Control .\n\
         http_access deny !Safe_ports\n\
         http_access deny CONNECT !SSL_ports\n\
         http_access deny manager\n",
    );
    if !allowed.is_empty() {
        // The source first: a client outside the ranges is refused (403) without being asked
        // for a credential or the destination lookup `dst` may need; then the credential
        // (407 without a valid one), then the destination.
        s.push_str(
            "http_access deny !egress_clients\n\
             http_access deny !egress_users\n",
        );
        if !allowed_destinations.is_empty() {
            s.push_str("http_access allow egress_clients !egress_metadata egress_opted_in\n");
        }
        s.push_str("http_access allow egress_clients !egress_metadata !egress_internal\n");
    }
    s.push_str(
        "http_access deny all\n\
         # Announce nothing: no Via, no X-Forwarded-For, no version string.\n\
         via off\n\
         forwarded_for delete\n\
         httpd_suppress_version_string on\n\
         # Squid adds Cache-Control: max-age to what it forwards; pass only what the client sent.\n\
         request_header_access Cache-Control allow egress_client_cache_control\n\
         request_header_access Cache-Control deny all\n\
         cache deny all\n\
         # Nor name the host it runs on: no X-Cache (MISS from HOST), and error pages\n\
         # signed with a fixed name.\n\
         reply_header_access X-Cache deny all\n\
         reply_header_access X-Cache-Lookup deny all\n",
    );
    s.push_str(&format!("visible_hostname {VISIBLE_HOSTNAME}\n"));
    s.push_str(
        "# The ICMP pinger only informs cache-peer selection, and there are no peers.\n\
         pinger_enable off\n",
    );
    match layout {
        Layout::Container => s.push_str(
            "pid_filename none\n\
             access_log stdio:/dev/stdout\n\
             cache_log stdio:/dev/stderr\n",
        ),
        Layout::Service => s.push_str(
            "pid_filename /run/squid.pid\n\
             access_log daemon:/var/log/squid/access.log\n\
             cache_log /var/log/squid/cache.log\n",
        ),
    }
    s.push_str("coredump_dir /var/spool/squid\n");
    s
}

/// The cloud-init a VM gets when its Proxy has none: install the distribution's Squid, write
/// [`squid_conf`] for the port and ranges and the proxy's htpasswd, and (re)start the service.
///
/// The files are written after the package is installed (`defer`), so the package finds no
/// conffile of someone else's, the `proxy` group the htpasswd is readable by exists, and the
/// service is restarted on the final config.
pub fn cloud_init(
    port: u16,
    allowed: &[SourceRange],
    allowed_destinations: &[SourceRange],
    htpasswd: &Htpasswd,
) -> String {
    let conf = squid_conf(port, allowed, allowed_destinations, Layout::Service);
    let mut s = String::from(
        "#cloud-config\n\
         package_update: true\n\
         packages:\n  \
           - squid\n\
         write_files:\n",
    );
    s.push_str(&format!(
        "  - path: {VM_CONF_PATH}\n    owner: root:root\n    permissions: '0644'\n    defer: true\n    content: |\n"
    ));
    for line in conf.lines() {
        s.push_str("      ");
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(&format!(
        "  - path: {VM_HTPASSWD_PATH}\n    owner: root:proxy\n    permissions: '0640'\n    defer: true\n    content: |\n"
    ));
    for line in htpasswd.as_str().lines() {
        s.push_str("      ");
        s.push_str(line);
        s.push('\n');
    }
    s.push_str(
        "runcmd:\n  \
           - [systemctl, enable, squid]\n  \
           - [systemctl, restart, squid]\n",
    );
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn ranges(texts: &[&str]) -> Vec<SourceRange> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    #[test]
    fn parses_ipv4_and_ipv6_ranges_and_renders_them_canonically() {
        let r: SourceRange = "10.0.0.0/8".parse().unwrap();
        assert_eq!(r.to_string(), "10.0.0.0/8");
        assert_eq!(r.prefix(), 8);
        let r: SourceRange = "203.0.113.7/32".parse().unwrap();
        assert_eq!(r.to_string(), "203.0.113.7/32");
        let r: SourceRange = "FD00:0:0::/8".parse().unwrap();
        assert_eq!(r.to_string(), "fd00::/8");
        let r: SourceRange = "2001:db8::1/128".parse().unwrap();
        assert_eq!(r.to_string(), "2001:db8::1/128");
        assert_eq!(r.network(), "2001:db8::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn rejects_what_is_not_one_exact_range() {
        let err = |t: &str| t.parse::<SourceRange>().unwrap_err();
        assert_eq!(
            err("10.0.0.0"),
            SourceRangeError::MissingPrefix("10.0.0.0".into())
        );
        assert_eq!(
            err("10.0.0/8"),
            SourceRangeError::InvalidAddress("10.0.0/8".into())
        );
        assert_eq!(
            err("10.0.0.0/33"),
            SourceRangeError::InvalidPrefix("10.0.0.0/33".into())
        );
        assert_eq!(
            err("::/129"),
            SourceRangeError::InvalidPrefix("::/129".into())
        );
        assert_eq!(
            err("10.0.0.0/+8"),
            SourceRangeError::InvalidPrefix("10.0.0.0/+8".into())
        );
        assert_eq!(
            err("10.0.0.0/"),
            SourceRangeError::InvalidPrefix("10.0.0.0/".into())
        );
        assert_eq!(err("0.0.0.0/0"), SourceRangeError::Open("0.0.0.0/0".into()));
        assert_eq!(err("::/0"), SourceRangeError::Open("::/0".into()));
        assert_eq!(
            err("10.0.0.0/00"),
            SourceRangeError::Open("10.0.0.0/00".into())
        );
        assert_eq!(
            err("10.1.2.3/8"),
            SourceRangeError::HostBitsSet {
                text: "10.1.2.3/8".into(),
                network: "10.0.0.0/8".into()
            }
        );
        assert_eq!(
            err("fd00::1/8").to_string(),
            "\"fd00::1/8\" has address bits set beyond its prefix; the range it covers is fd00::/8"
        );
        assert!(
            err("fe80::1%eth0/64")
                .to_string()
                .contains("not an IPv4 or IPv6")
        );
    }

    /// Whatever a user writes, the only text that reaches the config is an address and a
    /// number: a newline, a `#`, quotes, spaces or a YAML indicator make the value invalid.
    #[test]
    fn no_value_can_carry_a_directive_or_a_yaml_key() {
        for text in [
            "10.0.0.0/8\nhttp_access allow all",
            "10.0.0.0/8\r\nvia on",
            "10.0.0.0/8 all",
            " 10.0.0.0/8",
            "10.0.0.0/8 ",
            "10.0.0.0/8#",
            "10.0.0.0/8 # comment",
            "'10.0.0.0/8'",
            "\"10.0.0.0/8\"",
            "10.0.0.0/8\n    runcmd: [reboot]",
            "10.0.0.0/8: x",
            "- 10.0.0.0/8",
            "10.0.0.0/8,0.0.0.0/0",
            "10.0.0.0/8\t",
            "\u{0}10.0.0.0/8",
            "10.0.0.0/８",
        ] {
            assert!(
                text.parse::<SourceRange>().is_err(),
                "{text:?} was accepted"
            );
        }
    }

    #[test]
    fn serde_keeps_the_text_and_reports_the_reason() {
        let v: Vec<SourceRange> = serde_json::from_str(r#"["10.0.0.0/8", "fd00::/8"]"#).unwrap();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"["10.0.0.0/8","fd00::/8"]"#
        );
        let e = serde_json::from_str::<Vec<SourceRange>>(r#"["0.0.0.0/0"]"#).unwrap_err();
        assert!(e.to_string().contains("open proxy"), "{e}");
        assert_eq!(
            private_ranges(),
            ranges(&["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"])
        );
    }

    #[test]
    fn an_empty_list_is_a_config_error_at_its_path() {
        let e = check_allowed_ranges("providers[0].kvm.allowedSourceCIDRs", &[]).unwrap_err();
        assert_eq!(e.reason, "InvalidConfig");
        assert_eq!(
            e.message,
            "providers[0].kvm.allowedSourceCIDRs: must list at least one range; an open proxy is not allowed"
        );
        assert!(check_allowed_ranges("p", &private_ranges()).is_ok());
    }

    #[test]
    fn the_config_announces_nothing_and_admits_only_the_ranges() {
        let conf = squid_conf(
            3128,
            &ranges(&["10.0.0.0/8", "fd00::/8"]),
            &[],
            Layout::Container,
        );
        let lines: Vec<&str> = conf.lines().collect();
        for wanted in [
            "http_port 3128",
            "acl egress_clients src 10.0.0.0/8",
            "acl egress_clients src fd00::/8",
            "via off",
            "forwarded_for delete",
            "httpd_suppress_version_string on",
            "request_header_access Cache-Control deny all",
            "cache deny all",
        ] {
            assert!(lines.contains(&wanted), "{wanted:?} missing from\n{conf}");
        }
        let access: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with("http_access "))
            .collect();
        assert_eq!(
            access,
            [
                "http_access deny !Safe_ports",
                "http_access deny CONNECT !SSL_ports",
                "http_access deny manager",
                "http_access deny !egress_clients",
                "http_access deny !egress_users",
                "http_access allow egress_clients !egress_metadata !egress_internal",
                "http_access deny all",
            ],
            "the refusals come before the only allow, and everything else is denied"
        );
        for wanted in [
            "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid-auth/htpasswd",
            "auth_param basic realm egress-proxies",
            "acl egress_users proxy_auth REQUIRED",
        ] {
            assert!(lines.contains(&wanted), "{wanted:?} missing from\n{conf}");
        }
        assert!(!conf.contains("allow all"));
        assert!(!conf.contains("forwarded_for on"));
        assert!(!conf.contains("egress_opted_in"), "{conf}");
    }

    #[test]
    fn internal_destinations_and_metadata_are_refused() {
        let conf = squid_conf(3128, &private_ranges(), &[], Layout::Container);
        let acl = |name: &str| -> Vec<String> {
            conf.lines()
                .filter_map(|l| l.strip_prefix(&format!("acl {name} dst ")))
                .flat_map(|r| r.split(' ').map(String::from))
                .collect()
        };
        for wanted in [
            "127.0.0.0/8",
            "::/96",
            "64:ff9b::/96",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "169.254.0.0/16",
            "fe80::/10",
            "fc00::/7",
            "0.0.0.0/8",
        ] {
            assert!(
                acl("egress_internal").contains(&wanted.to_string()),
                "{wanted}\n{conf}"
            );
        }
        assert_eq!(
            acl("egress_metadata"),
            [
                "169.254.169.254/32",
                "::ffff:169.254.169.254/128",
                "fd00:ec2::254/128",
                "fd20:ce::254/128"
            ]
        );
    }

    #[test]
    fn opted_in_destinations_are_reached_but_never_metadata() {
        let conf = squid_conf(
            3128,
            &private_ranges(),
            &ranges(&["10.20.0.0/16", "127.0.0.9/32"]),
            Layout::Container,
        );
        let access: Vec<&str> = conf
            .lines()
            .filter(|l| l.starts_with("http_access allow"))
            .collect();
        assert_eq!(
            access,
            [
                "http_access allow egress_clients !egress_metadata egress_opted_in",
                "http_access allow egress_clients !egress_metadata !egress_internal",
            ]
        );
        assert!(
            conf.contains("acl egress_opted_in dst 10.20.0.0/16\n"),
            "{conf}"
        );
        assert!(
            conf.contains("acl egress_opted_in dst 127.0.0.9/32\n"),
            "{conf}"
        );
        // A range holding a metadata address is refused at its element.
        let e = check_allowed_destinations(
            "providers[0].gcp.allowedDestinationCIDRs",
            &ranges(&["10.0.0.0/8", "169.254.0.0/16"]),
        )
        .unwrap_err();
        assert!(
            e.message
                .starts_with("providers[0].gcp.allowedDestinationCIDRs[1]: 169.254.0.0/16 holds"),
            "{}",
            e.message
        );
        for holding in ["fd00::/8", "fd20:ce::/32", "169.254.169.254/32"] {
            assert!(
                check_allowed_destinations("p", &ranges(&[holding])).is_err(),
                "{holding}"
            );
        }
        assert!(
            check_allowed_destinations(
                "p",
                &ranges(&["169.254.0.0/17", "fd30::/16", "127.0.0.0/8"])
            )
            .is_ok()
        );
    }

    /// Whether a generated config's `acl NAME dst` ranges hold `addr`.
    fn acl_holds(conf: &str, name: &str, addr: &str) -> bool {
        let addr: IpAddr = addr.parse().unwrap();
        conf.lines()
            .filter_map(|l| l.strip_prefix(&format!("acl {name} dst ")))
            .flat_map(|r| r.split(' '))
            .any(|r| r.parse::<SourceRange>().unwrap().contains(addr))
    }

    /// Linux connects the unspecified address `::` to the local host, and a URL can spell it
    /// many ways (`[::]`, `[0::0]`, `[::0.0.0.0]`, `[::%251]`); the IPv4-compatible range holds
    /// them and `::1`, and NAT64's prefixes put IPv4 (loopback included) behind IPv6 addresses.
    /// Public addresses, and IPv4-mapped ones (which Squid judges as the IPv4 address they
    /// carry), are not in the list.
    #[test]
    fn the_local_host_is_refused_in_every_ipv6_spelling() {
        let conf = squid_conf(3128, &private_ranges(), &[], Layout::Container);
        for refused in [
            "::",
            "::1",
            "::7f00:1",
            "::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "64:ff9b::a00:1",
            "64:ff9b:1::7f00:1",
        ] {
            assert!(
                acl_holds(&conf, "egress_internal", refused),
                "{refused}\n{conf}"
            );
        }
        for public in [
            "203.0.113.7",
            "2001:db8::7",
            "::ffff:203.0.113.7",
            "::1:0:0:0",
            "64:ff9b:2::1",
        ] {
            assert!(!acl_holds(&conf, "egress_internal", public), "{public}");
            assert!(!acl_holds(&conf, "egress_metadata", public), "{public}");
        }
        assert!(acl_holds(
            &conf,
            "egress_metadata",
            "::ffff:169.254.169.254"
        ));
        // NAT64 is a range a provider may opt back in (a v6-only network reaching v4 sites).
        let opted = squid_conf(
            3128,
            &private_ranges(),
            &ranges(&["64:ff9b::/96"]),
            Layout::Container,
        );
        assert!(acl_holds(&opted, "egress_opted_in", "64:ff9b::cb00:7107"));
        assert!(check_allowed_destinations("p", &ranges(&["64:ff9b::/96"])).is_ok());
    }

    /// `X-Cache: MISS from HOST` and `X-Cache-Lookup` tell the client the proxy's host name,
    /// and an error page signs itself with it: neither header is sent, and the pages name a
    /// fixed host.
    #[test]
    fn no_reply_names_the_host() {
        let conf = squid_conf(3128, &private_ranges(), &[], Layout::Service);
        let lines: Vec<&str> = conf.lines().collect();
        for wanted in [
            "reply_header_access X-Cache deny all",
            "reply_header_access X-Cache-Lookup deny all",
            &format!("visible_hostname {VISIBLE_HOSTNAME}"),
        ] {
            assert!(lines.contains(&wanted), "{wanted:?} missing from\n{conf}");
        }
    }

    /// An open proxy is refused however its ranges are cut: two halves, four quarters, or
    /// IPv4 as IPv4-mapped IPv6; a union that leaves any address out is not open.
    #[test]
    fn ranges_that_together_cover_a_family_are_an_open_proxy() {
        for open in [
            &["0.0.0.0/1", "128.0.0.0/1"][..],
            &["10.0.0.0/8", "128.0.0.0/1", "0.0.0.0/1"],
            &["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"],
            &["::/1", "8000::/1"],
            &["::ffff:0.0.0.0/96"],
            &["0.0.0.0/1", "::ffff:128.0.0.0/97"],
            &["::/2", "4000::/2", "8000::/1", "10.0.0.0/8"],
            // ::/1 holds ::ffff:0:0/96, so every IPv4 client.
            &["::/1"],
            &["::/80", "fd00::/8"],
        ] {
            let e = check_allowed_ranges("providers[0].kvm.allowedSourceCIDRs", &ranges(open))
                .unwrap_err();
            assert_eq!(e.reason, "InvalidConfig", "{open:?}");
            assert!(
                e.message
                    .starts_with("providers[0].kvm.allowedSourceCIDRs: ")
                    && e.message.contains("open proxy"),
                "{open:?}: {}",
                e.message
            );
        }
        for closed in [
            &["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/4"][..],
            &["0.0.0.0/1", "128.0.0.0/1"][..1],
            &["8000::/1", "4000::/2"],
            &["::ffff:0.0.0.0/97", "10.0.0.0/8"],
            &["0.0.0.0/1", "::ffff:128.0.0.0/98"],
        ] {
            assert!(
                check_allowed_ranges("p", &ranges(closed)).is_ok(),
                "{closed:?}"
            );
        }
    }

    /// Squid judges an IPv4-mapped IPv6 range as the IPv4 range it carries: one that holds
    /// `::ffff:169.254.169.254` opens the metadata service as 169.254.0.0/16 would.
    #[test]
    fn a_mapped_range_holding_the_metadata_address_is_refused() {
        for holding in [
            "::ffff:0.0.0.0/96",
            "::ffff:169.254.0.0/112",
            "::ffff:169.254.169.254/128",
            "::/80",
        ] {
            let e = check_allowed_destinations("p", &ranges(&["10.0.0.0/8", holding])).unwrap_err();
            assert!(e.message.starts_with("p[1]: "), "{holding}: {}", e.message);
        }
        assert!(check_allowed_destinations("p", &ranges(&["::ffff:10.0.0.0/104"])).is_ok());
    }

    #[test]
    fn without_ranges_every_client_is_denied() {
        let conf = squid_conf(3128, &[], &[], Layout::Container);
        assert!(!conf.contains("egress_clients"), "{conf}");
        assert!(!conf.contains("http_access allow"), "{conf}");
        assert!(conf.contains("http_access deny all\n"));
    }

    #[test]
    fn layouts_differ_only_in_logs_and_pid_file() {
        let allowed = ranges(&["192.168.0.0/16"]);
        let container = squid_conf(8080, &allowed, &[], Layout::Container);
        let service = squid_conf(8080, &allowed, &[], Layout::Service);
        let runtime = |l: &&str| {
            l.starts_with("pid_filename ")
                || l.starts_with("access_log ")
                || l.starts_with("cache_log ")
                || l.starts_with("auth_param basic program ")
        };
        let rest = |c: &str| -> Vec<String> {
            c.lines()
                .filter(|l| !runtime(l))
                .map(String::from)
                .collect()
        };
        assert_eq!(rest(&container), rest(&service));
        let only =
            |c: &str| -> Vec<String> { c.lines().filter(runtime).map(String::from).collect() };
        assert_eq!(
            only(&container),
            [
                "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid-auth/htpasswd",
                "pid_filename none",
                "access_log stdio:/dev/stdout",
                "cache_log stdio:/dev/stderr"
            ]
        );
        assert_eq!(
            only(&service),
            [
                "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/egress-proxies.htpasswd",
                "pid_filename /run/squid.pid",
                "access_log daemon:/var/log/squid/access.log",
                "cache_log /var/log/squid/cache.log"
            ]
        );
    }

    #[test]
    fn the_cloud_init_installs_writes_and_starts_squid() {
        let allowed = ranges(&["10.0.0.0/8", "2001:db8::/32"]);
        let text = cloud_init(3128, &allowed, &[], &htpasswd());
        assert!(text.starts_with("#cloud-config\n"), "{text}");
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let keys: Vec<&str> = doc
            .as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert_eq!(
            keys,
            ["package_update", "packages", "write_files", "runcmd"],
            "no key beyond the four it means to set"
        );
        assert_eq!(
            doc["packages"],
            serde_yaml::from_str::<serde_yaml::Value>("[squid]").unwrap()
        );
        let files = doc["write_files"].as_sequence().unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[1]["path"], VM_HTPASSWD_PATH);
        assert_eq!(files[1]["owner"], "root:proxy");
        assert_eq!(files[1]["permissions"], "0640");
        assert_eq!(files[1]["defer"], true);
        assert_eq!(files[1]["content"].as_str().unwrap(), htpasswd().as_str());
        assert_eq!(files[0]["path"], VM_CONF_PATH);
        assert_eq!(files[0]["defer"], true);
        assert_eq!(
            files[0]["content"].as_str().unwrap(),
            squid_conf(3128, &allowed, &[], Layout::Service),
            "the file is exactly the generated config"
        );
        assert_eq!(
            doc["runcmd"],
            serde_yaml::from_str::<serde_yaml::Value>(
                "[[systemctl, enable, squid], [systemctl, restart, squid]]"
            )
            .unwrap()
        );
    }

    #[test]
    fn the_cloud_init_is_pure() {
        let allowed = ranges(&["10.0.0.0/8"]);
        let h = htpasswd();
        assert_eq!(
            cloud_init(3128, &allowed, &[], &h),
            cloud_init(3128, &allowed, &[], &h)
        );
        assert_ne!(
            cloud_init(3128, &allowed, &[], &h),
            cloud_init(8080, &allowed, &[], &h)
        );
    }

    fn htpasswd() -> Htpasswd {
        crate::fakes::fake_htpasswd()
    }

    /// The host's htpasswd reaches a file or a YAML block only as `user:$id$…` lines: a
    /// newline, a YAML indicator or a directive in it is refused, without quoting it back.
    #[test]
    fn an_htpasswd_is_only_crypt_lines() {
        assert_eq!(htpasswd().as_str(), crate::fakes::FAKE_HTPASSWD);
        let two = "a:$6$x$y\nb-1.c_d:$5$rounds=1000$s$h/.\n";
        assert_eq!(Htpasswd::parse(two).unwrap().as_str(), two);
        assert_eq!(Htpasswd::parse("a:$6$x$y").unwrap().as_str(), "a:$6$x$y\n");
        for bad in [
            "",
            "\n",
            "nocolon",
            ":$6$x$y",
            "a:plain",
            "a:$6$x$y\n  runcmd: [reboot]",
            "a:$6$x y",
            "a b:$6$x$y",
            "a:$6$x$y#",
            "a:$6$x$y\r",
            "a:$6$x$y\n\nb:$6$x$y",
            "a:$6$x$y'",
        ] {
            let e = Htpasswd::parse(bad).unwrap_err();
            assert!(
                !bad.trim().is_empty() || e.contains("empty") || e.contains("line"),
                "{e}"
            );
            if bad.len() > 3 {
                assert!(!e.contains(bad), "the error quotes the text: {e}");
            }
        }
        assert!(!format!("{:?}", htpasswd()).contains("$6$"));
    }

    #[test]
    fn a_create_without_a_credential_fails_permanently() {
        let host = crate::fakes::FakeHost::new();
        assert!(require_htpasswd(&host).is_ok());
        *host.htpasswd.borrow_mut() = None;
        let e = require_htpasswd(&host).unwrap_err();
        assert_eq!(e.reason, "NoCredential");
        assert_eq!(e.class, crate::ErrorClass::Permanent);
        *host.htpasswd.borrow_mut() = Some("a:b\nc".into());
        assert_eq!(require_htpasswd(&host).unwrap_err().reason, "NoCredential");
    }
}
