//! The `kvm` / `kvm2` block (the seeds' KVMConfig): SSH material, the image and machine-type
//! catalogues and the hypervisor hosts, with the seeds' defaults. Identifiers that become
//! volume names or provider-ID segments are restricted, so nothing later has to escape them.

use guest_sdk::json::{config_error, parse_config};
use guest_sdk::squid::{
    SourceRange, check_allowed_destinations, check_allowed_ranges, private_ranges,
};
use guest_sdk::{Placement, ProviderError, permanent};
use libvirt_rpc::image_hosts::is_host_entry;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const DEFAULT_SSH_KEY_FILE: &str = "/etc/egress-proxies/kvm/id_ed25519";
pub const DEFAULT_KNOWN_HOSTS_FILE: &str = "/etc/egress-proxies/kvm/known_hosts";
pub const DEFAULT_SOCKET: &str = "/var/run/libvirt/libvirt-sock";
pub const DEFAULT_POOL: &str = "default";
pub const DEFAULT_BRIDGE: &str = "br0";
pub const DEFAULT_DISK_SIZE_GB: u32 = 10;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KvmConfig {
    /// The SSH private key the host dials with (read by the host, never by the module).
    #[serde(default = "default_key_file")]
    pub ssh_key_file: String,
    /// known_hosts checked on every dial; defaulted unless `insecureIgnoreHostKey` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts_file: Option<String>,
    #[serde(default)]
    pub insecure_ignore_host_key: bool,
    #[serde(default = "default_disk_size")]
    pub disk_size_gb: u32,
    /// Extra vendor-data for cloud-init, merged with the guest-agent script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_data: Option<String>,
    #[serde(default = "yes")]
    pub install_guest_agent: bool,
    /// Source ranges the generated Squid (a Proxy without cloudInit) accepts clients from.
    /// Default: the private ranges, where a hypervisor's LAN puts its crawlers; a VM bridged
    /// onto a public network is then still no open proxy (a /0 does not parse).
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
    /// `kvm` on real hypervisors; `qemu` (TCG) only where /dev/kvm is not usable, e.g. tests.
    #[serde(default)]
    pub domain_type: DomainType,
    #[serde(default)]
    pub images: BTreeMap<String, ImageSpec>,
    /// Hosts (`host` for any port, or `host:port`) image URLs may come from beyond the
    /// catalogue's own: a `placement.image` URL, a mirror a catalogue URL redirects to. The host
    /// enforces it; a link-local or metadata address is reached only when named here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_hosts: Vec<String>,
    #[serde(default)]
    pub machine_types: BTreeMap<String, MachineType>,
    #[serde(default)]
    pub hosts: Vec<HostSpec>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainType {
    #[default]
    Kvm,
    Qemu,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    #[default]
    Qcow2,
    Raw,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qcow2 => "qcow2",
            Self::Raw => "raw",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    #[default]
    Uefi,
    Bios,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageSpec {
    pub url: String,
    /// Hex sha256 the download must match; without it the digest is recorded, not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default)]
    pub format: ImageFormat,
    #[serde(default)]
    pub firmware: Firmware,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MachineType {
    pub vcpus: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostSpec {
    pub name: String,
    /// `host:port` of the SSH server (port 22 when omitted).
    pub address: String,
    pub user: String,
    #[serde(default = "default_socket")]
    pub socket: String,
    #[serde(default = "default_pool")]
    pub pool: String,
    #[serde(default = "default_bridge")]
    pub bridge: String,
}

fn default_key_file() -> String {
    DEFAULT_SSH_KEY_FILE.to_string()
}
fn default_disk_size() -> u32 {
    DEFAULT_DISK_SIZE_GB
}
fn yes() -> bool {
    true
}
fn default_socket() -> String {
    DEFAULT_SOCKET.to_string()
}
fn default_pool() -> String {
    DEFAULT_POOL.to_string()
}
fn default_bridge() -> String {
    DEFAULT_BRIDGE.to_string()
}

/// Lowercase DNS-label style, at most 32 characters: safe as a volume-name part and as a
/// provider-ID segment.
pub fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A domain name as the reconciler derives it (`proxy-<hex>`): it becomes volume names too.
pub fn is_domain_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

pub fn is_http_url(s: &str) -> bool {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"));
    matches!(rest, Some(r) if !r.is_empty() && !r.starts_with('/') && !s.chars().any(char::is_whitespace))
}

fn is_path(s: &str) -> bool {
    s.starts_with('/') && !s.chars().any(|c| c.is_control())
}

/// Parses, defaults and checks the block; errors name the field under `path`.
pub fn validate(path: &str, text: &str) -> Result<KvmConfig, ProviderError> {
    let mut cfg: KvmConfig = parse_config(path, text)?;
    let at = |field: &str| format!("{path}.{field}");
    if !is_path(&cfg.ssh_key_file) {
        return Err(config_error(&at("sshKeyFile"), "must be an absolute path"));
    }
    match (&cfg.known_hosts_file, cfg.insecure_ignore_host_key) {
        (Some(_), true) => {
            return Err(config_error(
                &at("insecureIgnoreHostKey"),
                "cannot be combined with knownHostsFile",
            ));
        }
        (Some(f), false) if !is_path(f) => {
            return Err(config_error(
                &at("knownHostsFile"),
                "must be an absolute path",
            ));
        }
        (None, false) => cfg.known_hosts_file = Some(DEFAULT_KNOWN_HOSTS_FILE.to_string()),
        _ => {}
    }
    if cfg.disk_size_gb == 0 || cfg.disk_size_gb > 16_384 {
        return Err(config_error(
            &at("diskSizeGb"),
            "must be between 1 and 16384",
        ));
    }
    check_allowed_ranges(&at("allowedSourceCIDRs"), &cfg.allowed_source_cidrs)?;
    check_allowed_destinations(
        &at("allowedDestinationCIDRs"),
        &cfg.allowed_destination_cidrs,
    )?;
    for (key, image) in &cfg.images {
        let here = format!("{path}.images.{key}");
        if !is_identifier(key) {
            return Err(config_error(
                &here,
                "image keys become volume names: 1-32 of [a-z0-9-], alphanumeric at both ends",
            ));
        }
        if !is_http_url(&image.url) {
            return Err(config_error(
                &format!("{here}.url"),
                "must be an http(s) URL",
            ));
        }
        if let Some(sum) = &image.sha256
            && !is_sha256_hex(sum)
        {
            return Err(config_error(
                &format!("{here}.sha256"),
                "must be 64 hex characters",
            ));
        }
    }
    for (i, h) in cfg.image_hosts.iter_mut().enumerate() {
        if !is_host_entry(h) {
            return Err(config_error(
                &format!("{path}.imageHosts[{i}]"),
                "must be host, host:port or [ipv6]:port (no scheme, no path)",
            ));
        }
        *h = h.to_ascii_lowercase();
    }
    if cfg.machine_types.is_empty() {
        return Err(config_error(
            &at("machineTypes"),
            "must define at least one machine type",
        ));
    }
    for (key, m) in &cfg.machine_types {
        let here = format!("{path}.machineTypes.{key}");
        if !is_identifier(key) {
            return Err(config_error(&here, "keys are 1-32 of [a-z0-9-]"));
        }
        if m.vcpus == 0 || m.vcpus > 256 {
            return Err(config_error(
                &format!("{here}.vcpus"),
                "must be between 1 and 256",
            ));
        }
        if m.memory_mib < 128 {
            return Err(config_error(
                &format!("{here}.memoryMiB"),
                "must be at least 128",
            ));
        }
    }
    if cfg.hosts.is_empty() {
        return Err(config_error(&at("hosts"), "must list at least one host"));
    }
    for (i, h) in cfg.hosts.iter().enumerate() {
        let here = format!("{path}.hosts[{i}]");
        if !is_identifier(&h.name) {
            return Err(config_error(
                &format!("{here}.name"),
                "host names become provider-ID segments: 1-32 of [a-z0-9-]",
            ));
        }
        if cfg.hosts[..i].iter().any(|o| o.name == h.name) {
            return Err(config_error(
                &format!("{here}.name"),
                &format!("duplicate host {:?}", h.name),
            ));
        }
        if h.address.is_empty() || h.address.chars().any(char::is_whitespace) {
            return Err(config_error(
                &format!("{here}.address"),
                "must be host or host:port",
            ));
        }
        if h.user.is_empty() || h.user.chars().any(|c| c.is_whitespace() || c == '@') {
            return Err(config_error(&format!("{here}.user"), "must be a user name"));
        }
        if !is_path(&h.socket) {
            return Err(config_error(
                &format!("{here}.socket"),
                "must be an absolute path",
            ));
        }
        if !is_identifier(&h.pool) {
            return Err(config_error(
                &format!("{here}.pool"),
                "must be a pool name of [a-z0-9-]",
            ));
        }
        if h.bridge.is_empty()
            || h.bridge.len() > 15
            || !h
                .bridge
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(config_error(
                &format!("{here}.bridge"),
                "must be an interface name",
            ));
        }
    }
    Ok(cfg)
}

/// An image resolved from the placement: a catalogue entry or an ad-hoc URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// The catalogue key, or `url` for an ad-hoc URL.
    pub key: String,
    pub url: String,
    pub sha256: Option<String>,
    pub format: ImageFormat,
    pub firmware: Firmware,
}

/// What a create needs from the placement, checked before any libvirt call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved<'a> {
    pub host: &'a HostSpec,
    pub machine_type: String,
    pub machine: &'a MachineType,
    pub image: ResolvedImage,
}

fn placement_error(message: String) -> ProviderError {
    permanent("InvalidPlacement", message)
}

impl KvmConfig {
    pub fn host(&self, name: &str) -> Option<&HostSpec> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// zone = host (optional with one host), machineType a catalogue key, image a catalogue
    /// key or an http(s) URL (qcow2, UEFI).
    pub fn resolve(&self, placement: &Placement) -> Result<Resolved<'_>, ProviderError> {
        let host = match placement.zone.as_deref() {
            Some(zone) => self.host(zone).ok_or_else(|| {
                placement_error(format!(
                    "placement.zone {zone:?} is not a configured host ({})",
                    self.hosts
                        .iter()
                        .map(|h| h.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?,
            None => match self.hosts.as_slice() {
                [only] => only,
                _ => {
                    return Err(placement_error(
                        "placement.zone is required: more than one host is configured".into(),
                    ));
                }
            },
        };
        let machine_type = placement
            .machine_type
            .as_deref()
            .ok_or_else(|| placement_error("placement.machineType is required".to_string()))?;
        let machine = self.machine_types.get(machine_type).ok_or_else(|| {
            placement_error(format!(
                "placement.machineType {machine_type:?} is not in machineTypes"
            ))
        })?;
        let image = placement
            .image
            .as_deref()
            .ok_or_else(|| placement_error("placement.image is required".to_string()))?;
        let image = if let Some(spec) = self.images.get(image) {
            ResolvedImage {
                key: image.to_string(),
                url: spec.url.clone(),
                sha256: spec.sha256.clone(),
                format: spec.format,
                firmware: spec.firmware,
            }
        } else if is_http_url(image) {
            ResolvedImage {
                key: "url".to_string(),
                url: image.to_string(),
                sha256: None,
                format: ImageFormat::Qcow2,
                firmware: Firmware::Uefi,
            }
        } else {
            return Err(placement_error(format!(
                "placement.image {image:?} is neither an images key nor an http(s) URL"
            )));
        };
        Ok(Resolved {
            host,
            machine_type: machine_type.to_string(),
            machine,
            image,
        })
    }
}
