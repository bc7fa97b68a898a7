//! One hypervisor's state: its configuration, pools with their volumes, and domains. Pool
//! allocation and the memory of active domains are running sums, kept by the only methods
//! that change them, so a call reads them without scanning.

use super::types::DomainState;
use crate::xml::{Element, escape};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// What a host is, as a world file or a test describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// The configured host name calls address it by.
    pub name: String,
    /// Reported by `probe`, and named in a refused dial.
    pub address: String,
    pub user: String,
    /// The hypervisor's own hostname; None: the configured name.
    pub hostname: Option<String>,
    /// major * 1000000 + minor * 1000 + micro.
    pub lib_version: u64,
    pub memory_mib: u64,
    /// Memory the host itself uses, never free for domains.
    pub reserved_memory_mib: u64,
    pub cpus: u32,
    /// Every call fails as a dial refused at the TCP stage.
    pub unreachable: bool,
    /// Seconds from start until a domain's interface has an address.
    pub boot_seconds: u64,
    /// Addresses handed out in order: `<prefix>.<first>`, `<prefix>.<first + 1>`, ...
    pub address_prefix: String,
    pub first_address: u8,
}

impl HostConfig {
    /// A host as one the world does not describe: libvirt 11.3, 16 GiB of memory (1 GiB of it
    /// the host's own), 8 CPUs, addresses from 192.168.50.100 twenty seconds after start.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            address: String::new(),
            user: String::new(),
            hostname: None,
            lib_version: 11_003_000,
            memory_mib: 16_384,
            reserved_memory_mib: 1024,
            cpus: 8,
            unreachable: false,
            boot_seconds: 20,
            address_prefix: "192.168.50".to_string(),
            first_address: 100,
        }
    }
}

/// Where libvirt's directory pools live by default.
pub const DEFAULT_POOL_PATH: &str = "/var/lib/libvirt/images";
/// The size of the pool a host has unless told otherwise.
pub const DEFAULT_POOL_CAPACITY: u64 = 100 * GIB;

/// The backing store of a volume: its path and format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backing {
    pub path: String,
    pub format: String,
}

/// Bytes streamed from a URL: their size and digest only, the bytes themselves are not kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Volume {
    pub capacity: u64,
    pub allocation: u64,
    pub format: String,
    pub backing: Option<Backing>,
    /// What uploads wrote (small volumes: markers, seed images).
    pub data: super::bytes::Bytes,
    pub streamed: Option<Streamed>,
}

impl Volume {
    /// A volume as a world file seeds it: at least as large as its contents, which also count
    /// as its allocation unless one is given.
    pub fn seeded(capacity: u64, allocation: u64, format: &str, content: Vec<u8>) -> Self {
        let len = content.len() as u64;
        Self {
            capacity: capacity.max(len),
            allocation: if allocation == 0 { len } else { allocation },
            format: format.to_string(),
            backing: None,
            data: super::bytes::Bytes::new(&content),
            streamed: None,
        }
    }

    /// The volume's XML as libvirt answers STORAGE_VOL_GET_XML_DESC for a directory pool.
    pub fn xml(&self, pool_path: &str, name: &str) -> String {
        let path = format!("{pool_path}/{name}");
        let backing = self
            .backing
            .as_ref()
            .map(|b| {
                format!(
                    "  <backingStore>\n    <path>{}</path>\n    <format type='{}'/>\n  </backingStore>\n",
                    b.path, b.format
                )
            })
            .unwrap_or_default();
        format!(
            "<volume type='file'>\n  <name>{name}</name>\n  <key>{path}</key>\n  <capacity unit='bytes'>{}</capacity>\n  <allocation unit='bytes'>{}</allocation>\n  <target>\n    <path>{path}</path>\n    <format type='{}'/>\n  </target>\n{backing}</volume>\n",
            self.capacity, self.allocation, self.format
        )
    }
}

/// A storage pool. Capacity, foreign use and activity are plain fields; volumes change only
/// through methods, which keep the pool's allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The pool's directory, without a trailing slash.
    pub path: String,
    pub capacity: u64,
    /// Space used by files that are not volumes of the pool.
    pub used: u64,
    pub active: bool,
    volumes: BTreeMap<String, Volume>,
    /// The sum of the volumes' allocations.
    allocated: u64,
}

impl Pool {
    pub fn new(path: &str, capacity: u64, used: u64, active: bool) -> Self {
        Self {
            path: path.trim_end_matches('/').to_string(),
            capacity,
            used,
            active,
            volumes: BTreeMap::new(),
            allocated: 0,
        }
    }

    /// The pool `default` a host has unless told otherwise: 100 GiB, running.
    pub fn default_pool() -> Self {
        Self::new(DEFAULT_POOL_PATH, DEFAULT_POOL_CAPACITY, 0, true)
    }

    pub fn allocation(&self) -> u64 {
        self.used.saturating_add(self.allocated)
    }

    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.allocation())
    }

    pub fn volumes(&self) -> &BTreeMap<String, Volume> {
        &self.volumes
    }

    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.volumes.get(name)
    }

    /// The path of volume `name` in this pool.
    pub fn volume_path(&self, name: &str) -> String {
        format!("{}/{name}", self.path)
    }

    /// Puts a volume in place (replacing one of the name), returning the one replaced.
    pub fn insert_volume(&mut self, name: &str, volume: Volume) -> Option<Volume> {
        self.allocated = self.allocated.saturating_add(volume.allocation);
        let old = self.volumes.insert(name.to_string(), volume);
        if let Some(old) = &old {
            self.allocated = self.allocated.saturating_sub(old.allocation);
        }
        old
    }

    pub fn remove_volume(&mut self, name: &str) -> Option<Volume> {
        let old = self.volumes.remove(name)?;
        self.allocated = self.allocated.saturating_sub(old.allocation);
        Some(old)
    }

    /// Changes volume `name` in place, keeping the pool's allocation.
    pub(crate) fn update_volume<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Volume) -> T,
    ) -> Option<T> {
        let v = self.volumes.get_mut(name)?;
        let before = v.allocation;
        let out = f(v);
        self.allocated = self
            .allocated
            .saturating_sub(before)
            .saturating_add(v.allocation);
        Some(out)
    }

    fn holds_path(&self, path: &str) -> bool {
        path.strip_prefix(&self.path)
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|n| self.volumes.contains_key(n))
    }
}

/// What a domain's XML says that the model needs, read once when it is defined.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Definition {
    pub xml: String,
    pub memory: u64,
    /// Each `<metadata>` child's namespace URI and the element as DOMAIN_GET_METADATA
    /// answers it, in document order.
    pub metadata: Vec<(String, String)>,
    /// Paths of file-backed disks.
    pub disks: Vec<String>,
    /// An interface on a libvirt network (DHCP leases exist only for those).
    pub on_network: bool,
    /// The guest agent's virtio channel.
    pub agent_channel: bool,
}

impl Definition {
    pub fn read(xml: &str, doc: &Element, memory: u64) -> Self {
        let devices = doc.child("devices");
        let device =
            |pred: &dyn Fn(&Element) -> bool| devices.is_some_and(|d| d.children.iter().any(pred));
        Self {
            xml: xml.to_string(),
            memory,
            metadata: doc
                .child("metadata")
                .map(|m| {
                    m.children
                        .iter()
                        .filter_map(|c| Some((namespace_of(c)?.to_string(), metadata_answer(c))))
                        .collect()
                })
                .unwrap_or_default(),
            disks: devices
                .map(|d| {
                    d.children
                        .iter()
                        .filter(|c| c.name == "disk")
                        .filter_map(|disk| disk.child("source")?.attr("file"))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            on_network: device(&|c| c.local() == "interface" && c.attr("type") == Some("network")),
            agent_channel: device(&|c| {
                c.local() == "channel"
                    && c.child("target").and_then(|t| t.attr("name"))
                        == Some("org.qemu.guest_agent.0")
            }),
        }
    }
}

/// The namespace URI an element declares for its own prefix (or the default namespace).
fn namespace_of(e: &Element) -> Option<&str> {
    match e.name.split_once(':') {
        Some((prefix, _)) => e.attr(&format!("xmlns:{prefix}")),
        None => e.attr("xmlns"),
    }
}

/// An element as libvirt 11.3's DOMAIN_GET_METADATA answers it: local names only, no namespace
/// declarations, blank text dropped and two spaces of indentation per level.
fn metadata_answer(e: &Element) -> String {
    let mut out = String::new();
    write_metadata_element(e, 0, &mut out);
    out
}

fn write_metadata_element(e: &Element, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    out.push_str(&indent);
    out.push('<');
    out.push_str(e.local());
    for (k, v) in &e.attrs {
        if k == "xmlns" || k.starts_with("xmlns:") {
            continue;
        }
        out.push_str(&format!(
            " {}=\"{}\"",
            k.rsplit(':').next().unwrap_or(k),
            escape(v, true)
        ));
    }
    if e.children.is_empty() {
        if e.text.trim().is_empty() {
            out.push_str("/>");
        } else {
            out.push('>');
            out.push_str(&escape(&e.text, false));
            out.push_str(&format!("</{}>", e.local()));
        }
        return;
    }
    out.push_str(">\n");
    for c in &e.children {
        write_metadata_element(c, depth + 1, out);
        out.push('\n');
    }
    out.push_str(&format!("{indent}</{}>", e.local()));
}

/// A defined (or transient, running) domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub(crate) uuid: String,
    /// The persistent definition.
    pub(crate) def: Arc<Definition>,
    /// The definition the running instance was started from (live metadata reads it).
    pub(crate) live: Option<Arc<Definition>>,
    pub(crate) state: DomainState,
    pub(crate) persistent: bool,
    pub(crate) started_ms: u64,
    pub(crate) ip: Option<String>,
    pub(crate) mac: String,
}

impl Domain {
    pub fn uuid(&self) -> &str {
        &self.uuid
    }
    /// The persistent definition's XML, as defined.
    pub fn xml(&self) -> &str {
        &self.def.xml
    }
    pub fn state(&self) -> DomainState {
        self.state
    }
    /// Bytes of memory the definition asks for.
    pub fn memory(&self) -> u64 {
        self.def.memory
    }
    /// The address its interface gets once booted.
    pub fn ip(&self) -> Option<&str> {
        self.ip.as_deref()
    }
    pub fn is_persistent(&self) -> bool {
        self.persistent
    }
    /// The definition in effect: the live one while running.
    pub(crate) fn current(&self) -> &Definition {
        self.live.as_deref().unwrap_or(&self.def)
    }
    /// Memory held while active: what the running instance started with.
    fn held_memory(&self) -> u64 {
        if self.state.is_active() {
            self.current().memory
        } else {
            0
        }
    }
}

/// One hypervisor. Pools are a plain map (each pool keeps its own sums); domains change only
/// through methods, which keep the memory the active ones hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub config: HostConfig,
    pub pools: BTreeMap<String, Pool>,
    domains: BTreeMap<String, Domain>,
    /// Memory held by active domains.
    active_memory: u64,
    /// Addresses handed out so far.
    pub(crate) leases: u32,
}

impl Host {
    /// A host with the pool `default`.
    pub fn new(config: HostConfig) -> Self {
        let mut pools = BTreeMap::new();
        pools.insert("default".to_string(), Pool::default_pool());
        Self::with_pools(config, pools)
    }

    pub fn with_pools(config: HostConfig, pools: BTreeMap<String, Pool>) -> Self {
        Self {
            config,
            pools,
            domains: BTreeMap::new(),
            active_memory: 0,
            leases: 0,
        }
    }

    pub fn domains(&self) -> &BTreeMap<String, Domain> {
        &self.domains
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Memory free for domains: the host's, less its own, less what active domains hold.
    pub fn free_memory(&self) -> u64 {
        (self
            .config
            .memory_mib
            .saturating_sub(self.config.reserved_memory_mib)
            * MIB)
            .saturating_sub(self.active_memory)
    }

    /// The domain's state changes on its own (the guest paused, crashed or powered off): a
    /// domain that stops gives its memory back, and a transient one is gone. False when no
    /// domain has the name.
    pub fn set_domain_state(&mut self, name: &str, state: DomainState) -> bool {
        let Some(d) = self.domains.get_mut(name) else {
            return false;
        };
        let held = d.held_memory();
        if state.is_active() && !d.state.is_active() {
            d.live = Some(d.def.clone());
        } else if !state.is_active() {
            d.live = None;
        }
        d.state = state;
        let now_held = d.held_memory();
        let gone = !state.is_active() && !d.persistent;
        self.active_memory = self
            .active_memory
            .saturating_sub(held)
            .saturating_add(now_held);
        if gone {
            self.domains.remove(name);
        }
        true
    }

    /// Removes a domain whatever its state (as if its definition vanished with the host's
    /// files), giving back the memory it held.
    pub fn remove_domain(&mut self, name: &str) -> Option<Domain> {
        let d = self.domains.remove(name)?;
        self.active_memory = self.active_memory.saturating_sub(d.held_memory());
        Some(d)
    }

    pub(crate) fn domain_mut(&mut self, name: &str) -> Option<&mut Domain> {
        self.domains.get_mut(name)
    }

    /// Adds a domain (its state counted toward held memory).
    pub(crate) fn insert_domain(&mut self, name: String, d: Domain) {
        self.active_memory = self.active_memory.saturating_add(d.held_memory());
        self.domains.insert(name, d);
    }

    /// Starts a shut-off domain: it runs from its persistent definition from `now_ms`.
    pub(crate) fn start_domain(&mut self, name: &str, now_ms: u64, ip: Option<String>) {
        let Some(d) = self.domains.get_mut(name) else {
            return;
        };
        let held = d.held_memory();
        d.state = DomainState::Running;
        d.started_ms = now_ms;
        d.live = Some(d.def.clone());
        if d.ip.is_none() {
            d.ip = ip;
        }
        self.active_memory = self
            .active_memory
            .saturating_sub(held)
            .saturating_add(d.held_memory());
    }

    /// The next address of the host's range: `<prefix>.<first>` on; past `.254` of a
    /// three-octet prefix it carries into the third octet (`.1` on), so thousands of domains
    /// on one host still get distinct addresses.
    pub(crate) fn lease(&mut self) -> String {
        let n = u32::from(self.config.first_address) + self.leases;
        self.leases += 1;
        let octets: Vec<u32> = self
            .config
            .address_prefix
            .split('.')
            .filter_map(|o| o.parse().ok())
            .collect();
        match octets.as_slice() {
            [a, b, c] if n > 254 => {
                let past = n - 255;
                format!("{a}.{b}.{}.{}", (c + 1 + past / 254) % 256, 1 + past % 254)
            }
            _ => format!("{}.{}", self.config.address_prefix, n.min(254)),
        }
    }

    /// Whether a path is a volume of one of the host's pools.
    pub(crate) fn path_exists(&self, path: &str) -> bool {
        self.pools.values().any(|p| p.holds_path(path))
    }

    /// The hostname the hypervisor reports.
    pub fn hostname(&self) -> &str {
        self.config.hostname.as_deref().unwrap_or(&self.config.name)
    }
}

#[cfg(test)]
mod lease_tests {
    use super::*;

    #[test]
    fn thousands_of_leases_are_distinct_addresses() {
        let mut h = Host::new(HostConfig::new("h"));
        let first = h.lease();
        assert_eq!(first, "192.168.50.100");
        let all: std::collections::BTreeSet<String> = std::iter::once(first)
            .chain((0..3000).map(|_| h.lease()))
            .collect();
        assert_eq!(all.len(), 3001);
        assert!(
            all.iter().all(|a| a.parse::<std::net::Ipv4Addr>().is_ok()),
            "every lease is an IPv4 address"
        );
        assert!(all.contains("192.168.50.254") && all.contains("192.168.51.1"));
    }
}
