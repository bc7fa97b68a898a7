//! An in-memory hypervisor for native unit tests of libvirt providers: domains with states and
//! metadata per namespace, pools with capacity and volumes with paths and backing stores,
//! uploads, URL transfers from a table, host memory. It answers with libvirt's own error codes
//! (virErrorNumber) for the cases providers tell apart, records every call, and fails the calls
//! a test queues. Single-threaded: clones share one state, so a test keeps a handle while the
//! provider owns another through [`crate::fakes::FakeHost::with_libvirt`].

use crate::host::Libvirt;
use crate::libvirt::{
    AddressSource, DialStage, DomainState, InterfaceAddresses, IpAddress, LibvirtError, NodeInfo,
    PoolInfo, ProbeResult, ProbeTarget, Transfer, VolumeInfo,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

/// virErrorNumber values the fake answers with.
pub mod codes {
    pub const INTERNAL_ERROR: i32 = 1;
    pub const XML_ERROR: i32 = 27;
    pub const SYSTEM_ERROR: i32 = 38;
    pub const NO_DOMAIN: i32 = 42;
    pub const NO_STORAGE_POOL: i32 = 49;
    pub const NO_STORAGE_VOL: i32 = 50;
    pub const OPERATION_INVALID: i32 = 55;
    pub const NO_DOMAIN_METADATA: i32 = 80;
    pub const AGENT_UNRESPONSIVE: i32 = 86;
    pub const STORAGE_VOL_EXIST: i32 = 90;
}

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// A libvirt error with `code`, as the host reports it.
pub fn lv_error(code: i32, message: &str) -> LibvirtError {
    LibvirtError {
        code,
        domain: 0,
        message: message.to_string(),
        stage: None,
        timeout: false,
        denied: false,
    }
}

/// A dial failure at `stage`.
pub fn dial_error(stage: DialStage, message: &str) -> LibvirtError {
    LibvirtError {
        stage: Some(stage),
        ..lv_error(0, message)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeVolume {
    pub capacity: u64,
    pub allocation: u64,
    pub format: String,
    pub backing: Option<String>,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakePool {
    pub path: String,
    pub capacity: u64,
    pub active: bool,
    pub volumes: BTreeMap<String, FakeVolume>,
}

impl FakePool {
    pub fn allocation(&self) -> u64 {
        self.volumes.values().map(|v| v.allocation).sum()
    }
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.allocation())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDomain {
    pub uuid: String,
    pub xml: String,
    pub state: DomainState,
    pub memory: u64,
    /// Reported by every address source while the domain is active.
    pub ip: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeHypervisor {
    pub free_memory: u64,
    pub unreachable: bool,
    pub pools: BTreeMap<String, FakePool>,
    pub domains: BTreeMap<String, FakeDomain>,
}

impl Default for FakeHypervisor {
    fn default() -> Self {
        let mut pools = BTreeMap::new();
        pools.insert(
            "default".to_string(),
            FakePool {
                path: "/var/lib/libvirt/images".into(),
                capacity: 100 * GIB,
                active: true,
                volumes: BTreeMap::new(),
            },
        );
        Self {
            free_memory: 16 * GIB,
            unreachable: false,
            pools,
            domains: BTreeMap::new(),
        }
    }
}

#[derive(Default)]
struct State {
    hosts: BTreeMap<String, FakeHypervisor>,
    /// URL -> (bytes, sha256, announces its size).
    urls: BTreeMap<String, (u64, String, bool)>,
    faults: VecDeque<(String, LibvirtError)>,
    calls: Vec<String>,
    next: u64,
    /// What a started domain reports; Running unless a test wants a start that misbehaves.
    start_state: Option<DomainState>,
}

#[derive(Clone, Default)]
pub struct FakeLibvirt {
    state: Rc<RefCell<State>>,
}

fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = s.find(open)? + open.len();
    let end = s[start..].find(close)? + start;
    Some(&s[start..end])
}

/// The text of the first `<tag ...>text</tag>`.
fn element_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let at = xml.find(&format!("<{tag}"))?;
    let rest = &xml[at..];
    let gt = rest.find('>')?;
    if rest[..gt].ends_with('/') {
        return None;
    }
    let end = rest.find(&format!("</{tag}>"))?;
    Some(rest[gt + 1..end].trim())
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    for q in ['\'', '"'] {
        if let Some(v) = between(tag, &format!("{name}={q}"), &q.to_string()) {
            return Some(v);
        }
    }
    None
}

fn size(xml: &str, tag: &str) -> Option<u64> {
    let at = xml.find(&format!("<{tag}"))?;
    let open = &xml[at..at + xml[at..].find('>')?];
    let n: u64 = element_text(xml, tag)?.parse().ok()?;
    let f = match attr(open, "unit").unwrap_or("bytes") {
        "b" | "bytes" => 1,
        "KiB" | "k" | "K" => 1 << 10,
        "MiB" | "M" => MIB,
        "GiB" | "G" => GIB,
        _ => return None,
    };
    n.checked_mul(f)
}

impl FakeLibvirt {
    pub fn new() -> Self {
        Self::default()
    }

    /// Edits host `name` (created with the defaults on first use).
    pub fn with_host<T>(&self, name: &str, f: impl FnOnce(&mut FakeHypervisor) -> T) -> T {
        let mut st = self.state.borrow_mut();
        f(st.hosts.entry(name.to_string()).or_default())
    }

    /// A snapshot of host `name`.
    pub fn host(&self, name: &str) -> FakeHypervisor {
        self.with_host(name, |h| h.clone())
    }

    pub fn add_url(&self, url: &str, bytes: u64, sha256: &str, announces_size: bool) {
        self.state
            .borrow_mut()
            .urls
            .insert(url.to_string(), (bytes, sha256.to_string(), announces_size));
    }

    /// The next call named `call` (the WIT name, e.g. `domain-create`) fails with `err`.
    pub fn fail_next(&self, call: &str, err: LibvirtError) {
        self.state
            .borrow_mut()
            .faults
            .push_back((call.to_string(), err));
    }

    pub fn set_start_state(&self, state: DomainState) {
        self.state.borrow_mut().start_state = Some(state);
    }

    /// The calls made, as `call target`.
    pub fn calls(&self) -> Vec<String> {
        self.state.borrow().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.state.borrow_mut().calls.clear();
    }

    /// Defines a domain from XML in `state`, as a fixture.
    pub fn insert_domain(&self, host: &str, xml: &str, state: DomainState) {
        let _ = self.define(host, xml);
        if let Some(name) = element_text(xml, "name") {
            let ip = Some(format!("10.0.0.{}", self.state.borrow().next % 250 + 2));
            self.with_host(host, |h| {
                if let Some(d) = h.domains.get_mut(name) {
                    d.state = state;
                    d.ip = ip;
                }
            });
        }
    }

    fn enter(&self, call: &str, host: &str, target: &str) -> Result<(), LibvirtError> {
        let mut st = self.state.borrow_mut();
        st.calls.push(format!("{call} {host}/{target}"));
        if let Some(pos) = st.faults.iter().position(|(c, _)| c == call)
            && let Some((_, e)) = st.faults.remove(pos)
        {
            return Err(e);
        }
        if st.hosts.entry(host.to_string()).or_default().unreachable {
            return Err(dial_error(DialStage::Tcp, "connection refused"));
        }
        Ok(())
    }

    fn pool_mut<T>(
        &self,
        host: &str,
        pool: &str,
        f: impl FnOnce(&mut FakePool) -> Result<T, LibvirtError>,
    ) -> Result<T, LibvirtError> {
        self.with_host(host, |h| {
            let p = h
                .pools
                .get_mut(pool)
                .ok_or_else(|| lv_error(codes::NO_STORAGE_POOL, "storage pool not found"))?;
            if !p.active {
                return Err(lv_error(
                    codes::OPERATION_INVALID,
                    "storage pool is not active",
                ));
            }
            f(p)
        })
    }

    fn domain_mut<T>(
        &self,
        host: &str,
        name: &str,
        f: impl FnOnce(&mut FakeDomain) -> Result<T, LibvirtError>,
    ) -> Result<T, LibvirtError> {
        self.with_host(host, |h| {
            let d = h
                .domains
                .get_mut(name)
                .ok_or_else(|| lv_error(codes::NO_DOMAIN, &format!("no domain '{name}'")))?;
            f(d)
        })
    }

    fn define(&self, host: &str, xml: &str) -> Result<(), LibvirtError> {
        let name = element_text(xml, "name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| lv_error(codes::XML_ERROR, "missing domain name"))?
            .to_string();
        let memory =
            size(xml, "memory").ok_or_else(|| lv_error(codes::XML_ERROR, "missing memory"))?;
        let uuid = {
            let mut st = self.state.borrow_mut();
            st.next += 1;
            format!("{:032x}", st.next)
        };
        self.with_host(host, |h| {
            match h.domains.get_mut(&name) {
                Some(d) => {
                    d.xml = xml.to_string();
                    d.memory = memory;
                }
                None => {
                    h.domains.insert(
                        name,
                        FakeDomain {
                            uuid,
                            xml: xml.to_string(),
                            state: DomainState::Shutoff,
                            memory,
                            ip: None,
                        },
                    );
                }
            }
            Ok(())
        })
    }
}

fn active(s: DomainState) -> bool {
    !matches!(s, DomainState::Shutoff | DomainState::NoState)
}

fn path_exists(h: &FakeHypervisor, path: &str) -> bool {
    h.pools.values().any(|p| {
        path.strip_prefix(&p.path)
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|n| p.volumes.contains_key(n))
    })
}

impl Libvirt for FakeLibvirt {
    fn lib_version(&self, host: &str) -> Result<u64, LibvirtError> {
        self.enter("lib-version", host, "")?;
        Ok(11_003_000)
    }
    fn hostname(&self, host: &str) -> Result<String, LibvirtError> {
        self.enter("hostname", host, "")?;
        Ok(format!("{host}.example"))
    }
    fn node_info(&self, host: &str) -> Result<NodeInfo, LibvirtError> {
        self.enter("node-get-info", host, "")?;
        Ok(NodeInfo {
            model: "x86_64".into(),
            memory_kib: 16 << 20,
            cpus: 8,
            mhz: 2400,
        })
    }
    fn node_free_memory(&self, host: &str) -> Result<u64, LibvirtError> {
        self.enter("node-free-memory", host, "")?;
        Ok(self.with_host(host, |h| h.free_memory))
    }
    fn list_domains(&self, host: &str) -> Result<Vec<String>, LibvirtError> {
        self.enter("list-domains", host, "")?;
        Ok(self.with_host(host, |h| h.domains.keys().cloned().collect()))
    }
    fn domain_lookup(&self, host: &str, name: &str) -> Result<String, LibvirtError> {
        self.enter("domain-lookup", host, name)?;
        self.domain_mut(host, name, |d| Ok(d.uuid.clone()))
    }
    fn domain_define_xml(&self, host: &str, xml: &str) -> Result<(), LibvirtError> {
        self.enter(
            "domain-define-xml",
            host,
            element_text(xml, "name").unwrap_or(""),
        )?;
        self.define(host, xml)
    }
    fn domain_create(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        self.enter("domain-create", host, name)?;
        let start = self
            .state
            .borrow()
            .start_state
            .unwrap_or(DomainState::Running);
        let ip = format!("10.0.0.{}", self.state.borrow().next % 250 + 2);
        self.with_host(host, |h| {
            let d = h
                .domains
                .get(name)
                .ok_or_else(|| lv_error(codes::NO_DOMAIN, "no domain"))?;
            if active(d.state) {
                return Err(lv_error(
                    codes::OPERATION_INVALID,
                    "domain is already running",
                ));
            }
            let mut rest = d.xml.as_str();
            while let Some(at) = rest.find("<source file=") {
                let tag = &rest[at..at + rest[at..].find('>').unwrap_or(0)];
                if let Some(p) = attr(tag, "file")
                    && !path_exists(h, p)
                {
                    return Err(lv_error(
                        codes::SYSTEM_ERROR,
                        &format!("Cannot access storage file '{p}'"),
                    ));
                }
                rest = &rest[at + 1..];
            }
            if d.memory > h.free_memory {
                return Err(lv_error(codes::INTERNAL_ERROR, "cannot allocate memory"));
            }
            let memory = d.memory;
            h.free_memory -= memory;
            if let Some(d) = h.domains.get_mut(name) {
                d.state = start;
                d.ip.get_or_insert(ip);
            }
            Ok(())
        })
    }
    fn domain_resume(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        self.enter("domain-resume", host, name)?;
        self.domain_mut(host, name, |d| match d.state {
            DomainState::Paused => {
                d.state = DomainState::Running;
                Ok(())
            }
            DomainState::Running | DomainState::Blocked => Ok(()),
            _ => Err(lv_error(codes::OPERATION_INVALID, "domain is not running")),
        })
    }
    fn domain_destroy(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        self.enter("domain-destroy", host, name)?;
        self.with_host(host, |h| {
            let d = h
                .domains
                .get_mut(name)
                .ok_or_else(|| lv_error(codes::NO_DOMAIN, "no domain"))?;
            if !active(d.state) {
                return Err(lv_error(codes::OPERATION_INVALID, "domain is not running"));
            }
            d.state = DomainState::Shutoff;
            let memory = d.memory;
            h.free_memory += memory;
            Ok(())
        })
    }
    fn domain_undefine(&self, host: &str, name: &str) -> Result<(), LibvirtError> {
        self.enter("domain-undefine", host, name)?;
        self.with_host(host, |h| {
            h.domains
                .remove(name)
                .map(|_| ())
                .ok_or_else(|| lv_error(codes::NO_DOMAIN, "no domain"))
        })
    }
    fn domain_get_state(&self, host: &str, name: &str) -> Result<DomainState, LibvirtError> {
        self.enter("domain-get-state", host, name)?;
        self.domain_mut(host, name, |d| Ok(d.state))
    }
    fn domain_get_metadata(
        &self,
        host: &str,
        name: &str,
        uri: &str,
    ) -> Result<String, LibvirtError> {
        self.enter("domain-get-metadata", host, name)?;
        self.domain_mut(host, name, |d| {
            let missing = || lv_error(codes::NO_DOMAIN_METADATA, "metadata not found");
            let meta = between(&d.xml, "<metadata>", "</metadata>").ok_or_else(missing)?;
            for q in ['"', '\''] {
                let decl = format!("={q}{uri}{q}");
                let Some(at) = meta.find(&decl) else { continue };
                let open = meta[..at].rfind('<').ok_or_else(missing)?;
                let tag = meta[open + 1..].split_whitespace().next().unwrap_or("");
                let close = format!("</{tag}>");
                let end = meta[open..].find(&close).ok_or_else(missing)? + open + close.len();
                return Ok(meta[open..end].to_string());
            }
            Err(missing())
        })
    }
    fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> Result<Vec<InterfaceAddresses>, LibvirtError> {
        self.enter("domain-interface-addresses", host, name)?;
        self.domain_mut(host, name, |d| {
            if !active(d.state) {
                return Err(lv_error(codes::OPERATION_INVALID, "domain is not running"));
            }
            if source == AddressSource::Agent && !d.xml.contains("org.qemu.guest_agent.0") {
                return Err(lv_error(codes::AGENT_UNRESPONSIVE, "agent not connected"));
            }
            Ok(d.ip
                .iter()
                .map(|ip| InterfaceAddresses {
                    name: "eth0".into(),
                    hwaddr: "52:54:00:00:00:01".into(),
                    addrs: vec![IpAddress {
                        kind: 0,
                        addr: ip.clone(),
                        prefix: 24,
                    }],
                })
                .collect())
        })
    }
    fn pool_info(&self, host: &str, pool: &str) -> Result<PoolInfo, LibvirtError> {
        self.enter("pool-get-info", host, pool)?;
        self.with_host(host, |h| {
            let p = h
                .pools
                .get(pool)
                .ok_or_else(|| lv_error(codes::NO_STORAGE_POOL, "storage pool not found"))?;
            Ok(PoolInfo {
                state: if p.active { 2 } else { 0 },
                capacity: p.capacity,
                allocation: p.allocation(),
                available: p.available(),
            })
        })
    }
    fn pool_refresh(&self, host: &str, pool: &str) -> Result<(), LibvirtError> {
        self.enter("pool-refresh", host, pool)?;
        self.pool_mut(host, pool, |_| Ok(()))
    }
    fn pool_list_volumes(&self, host: &str, pool: &str) -> Result<Vec<String>, LibvirtError> {
        self.enter("pool-list-volumes", host, pool)?;
        self.pool_mut(host, pool, |p| Ok(p.volumes.keys().cloned().collect()))
    }
    fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> Result<String, LibvirtError> {
        self.enter("volume-lookup", host, name)?;
        self.pool_mut(host, pool, |p| {
            if p.volumes.contains_key(name) {
                Ok(format!("{}/{name}", p.path))
            } else {
                Err(lv_error(codes::NO_STORAGE_VOL, "storage vol not found"))
            }
        })
    }
    fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> Result<(), LibvirtError> {
        let name = element_text(xml, "name").unwrap_or("").to_string();
        self.enter("volume-create-xml", host, &name)?;
        if name.is_empty() {
            return Err(lv_error(codes::XML_ERROR, "missing volume name"));
        }
        let capacity =
            size(xml, "capacity").ok_or_else(|| lv_error(codes::XML_ERROR, "missing capacity"))?;
        let target = between(xml, "<target>", "</target>").unwrap_or("");
        let format = attr(target, "type").unwrap_or("raw").to_string();
        let backing = between(xml, "<backingStore>", "</backingStore>")
            .and_then(|b| element_text(b, "path"))
            .map(str::to_string);
        let allocation =
            size(xml, "allocation").unwrap_or(if format == "qcow2" { 196_608 } else { capacity });
        self.with_host(host, |h| {
            if let Some(b) = &backing
                && !path_exists(h, b)
            {
                return Err(lv_error(codes::INTERNAL_ERROR, "backing file missing"));
            }
            Ok(())
        })?;
        self.pool_mut(host, pool, |p| {
            if p.volumes.contains_key(&name) {
                return Err(lv_error(
                    codes::STORAGE_VOL_EXIST,
                    "storage volume exists already",
                ));
            }
            if allocation > p.available() {
                return Err(lv_error(codes::INTERNAL_ERROR, "No space left on device"));
            }
            p.volumes.insert(
                name,
                FakeVolume {
                    capacity,
                    allocation,
                    format,
                    backing,
                    data: vec![],
                },
            );
            Ok(())
        })
    }
    fn volume_delete(&self, host: &str, pool: &str, name: &str) -> Result<(), LibvirtError> {
        self.enter("volume-delete", host, name)?;
        self.pool_mut(host, pool, |p| {
            p.volumes
                .remove(name)
                .map(|_| ())
                .ok_or_else(|| lv_error(codes::NO_STORAGE_VOL, "storage vol not found"))
        })
    }
    fn volume_info(&self, host: &str, pool: &str, name: &str) -> Result<VolumeInfo, LibvirtError> {
        self.enter("volume-get-info", host, name)?;
        self.pool_mut(host, pool, |p| {
            let v = p
                .volumes
                .get(name)
                .ok_or_else(|| lv_error(codes::NO_STORAGE_VOL, "storage vol not found"))?;
            Ok(VolumeInfo {
                kind: 0,
                capacity: v.capacity,
                allocation: v.allocation,
            })
        })
    }
    fn volume_xml(&self, host: &str, pool: &str, name: &str) -> Result<String, LibvirtError> {
        self.enter("volume-xml", host, name)?;
        self.pool_mut(host, pool, |p| {
            let v = p
                .volumes
                .get(name)
                .ok_or_else(|| lv_error(codes::NO_STORAGE_VOL, "storage vol not found"))?;
            let path = format!("{}/{name}", p.path);
            let backing = v
                .backing
                .as_ref()
                .map(|b| format!("<backingStore><path>{b}</path><format type='qcow2'/></backingStore>"))
                .unwrap_or_default();
            Ok(format!(
                "<volume type='file'><name>{name}</name><key>{path}</key><capacity unit='bytes'>{}</capacity><allocation unit='bytes'>{}</allocation><target><path>{path}</path><format type='{}'/></target>{backing}</volume>",
                v.capacity, v.allocation, v.format
            ))
        })
    }
    fn volume_upload(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        data: &[u8],
    ) -> Result<(), LibvirtError> {
        self.enter("volume-upload", host, name)?;
        self.pool_mut(host, pool, |p| {
            let v = p
                .volumes
                .get_mut(name)
                .ok_or_else(|| lv_error(codes::NO_STORAGE_VOL, "storage vol not found"))?;
            v.data = data.to_vec();
            v.allocation = v.allocation.max(data.len() as u64);
            Ok(())
        })
    }
    fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> Result<Vec<u8>, LibvirtError> {
        self.enter("volume-download", host, name)?;
        self.pool_mut(host, pool, |p| {
            let v = p
                .volumes
                .get(name)
                .ok_or_else(|| lv_error(codes::NO_STORAGE_VOL, "storage vol not found"))?;
            Ok(v.data[..v.data.len().min(max_bytes as usize)].to_vec())
        })
    }
    fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
    ) -> Result<Transfer, LibvirtError> {
        self.enter("volume-upload-from-url", host, name)?;
        let found = self.state.borrow().urls.get(url).cloned();
        let (bytes, digest, _) =
            found.ok_or_else(|| lv_error(0, &format!("http: GET {url}: status 404 Not Found")))?;
        if bytes > max_bytes {
            return Err(lv_error(
                0,
                &format!("body exceeds the limit of {max_bytes} bytes"),
            ));
        }
        self.pool_mut(host, pool, |p| {
            let v = p
                .volumes
                .get_mut(name)
                .ok_or_else(|| lv_error(codes::NO_STORAGE_VOL, "storage vol not found"))?;
            v.allocation = bytes;
            Ok(())
        })?;
        if let Some(want) = sha256
            && !want.eq_ignore_ascii_case(&digest)
        {
            return Err(lv_error(
                0,
                &format!("sha256 mismatch: expected {want}, got {digest}"),
            ));
        }
        Ok(Transfer {
            bytes,
            sha256: digest,
        })
    }
    fn url_size(&self, url: &str) -> Result<Option<u64>, LibvirtError> {
        self.enter("url-size", "", url)?;
        match self.state.borrow().urls.get(url) {
            Some((n, _, true)) => Ok(Some(*n)),
            Some(_) => Ok(None),
            None => Err(lv_error(
                0,
                &format!("http: HEAD {url}: status 404 Not Found"),
            )),
        }
    }
    fn probe(&self, targets: &[ProbeTarget]) -> Vec<ProbeResult> {
        targets
            .iter()
            .map(|t| {
                let mut r = ProbeResult {
                    host: t.host.clone(),
                    address: String::new(),
                    user: String::new(),
                    lib_version: None,
                    hostname: None,
                    pool: None,
                    error: None,
                };
                if let Err(e) = self.enter("probe", &t.host, &t.pool) {
                    r.error = Some(e);
                    return r;
                }
                r.lib_version = Some(11_003_000);
                r.hostname = Some(format!("{}.example", t.host));
                match self.with_host(&t.host, |h| h.pools.get(&t.pool).cloned()) {
                    Some(p) => {
                        r.pool = Some(PoolInfo {
                            state: if p.active { 2 } else { 0 },
                            capacity: p.capacity,
                            allocation: p.allocation(),
                            available: p.available(),
                        })
                    }
                    None => {
                        r.error = Some(lv_error(codes::NO_STORAGE_POOL, "storage pool not found"))
                    }
                }
                r
            })
            .collect()
    }
}
