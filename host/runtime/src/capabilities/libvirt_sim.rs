//! The simulated hypervisor behind the `libvirt` capability, for dry-runs, plan snapshots and
//! the conformance tests. It answers like libvirt on the contract: the same virErrorNumber
//! codes for a missing domain, volume or pool; starting a running domain is
//! VIR_ERR_OPERATION_INVALID; defining an existing name replaces its definition only when the
//! XML carries that domain's UUID (libvirt gives a UUID-less definition a fresh one, and then
//! refuses the name); creating an existing volume is VIR_ERR_STORAGE_VOL_EXIST. Pools account
//! capacity, allocation and available space; volume paths are `<pool path>/<name>`; backing
//! stores come from the volume XML; an upload overwrites from the start without truncating,
//! and a raw volume reads as zeros past what was written. Metadata is kept per namespace URI
//! from the defined XML's `<metadata>` and returned as libvirt 11.3 returns it: without prefix
//! or namespace declaration, re-indented. A started domain runs at once and its interface gets
//! an address `bootSeconds` of simulated time later, from the guest agent or ARP (the
//! DHCP-lease source only knows interfaces on a libvirt network; these domains sit on
//! bridges). Behaviours were checked against libvirt 11.3 (tests/libvirt-ssh, and
//! host/cli/tests/kvm_real.rs end to end). Image URLs come from a table (an unknown URL
//! answers like an HTTP 404). Faults can be injected per call and hosts
//! marked unreachable (dial stage tcp).

use crate::bindings::egress::provider::libvirt::IpAddress;
use crate::capabilities::clock::ClockBackend;
use crate::capabilities::libvirt::*;
use sha2::Digest;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// virErrorNumber values (include/libvirt/virterror.h).
pub mod codes {
    pub const INTERNAL_ERROR: i32 = 1;
    pub const OPERATION_FAILED: i32 = 9;
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

/// virErrorDomain values.
mod from {
    pub const QEMU: i32 = 10;
    pub const STORAGE: i32 = 18;
    pub const DOMAIN: i32 = 20;
}

/// The world file's `libvirt` section.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimLibvirtSpec {
    /// Hypervisors by configured host name. A host the world does not describe exists with
    /// the defaults (one running pool `default`, 100 GiB, 16 GiB of memory).
    #[serde(default)]
    pub hosts: Vec<SimHostSpec>,
    /// What `volume-upload-from-url` and `url-size` find at each URL.
    #[serde(default)]
    pub urls: Vec<SimUrl>,
    /// Failures to inject: the call (`domain-create`, `volume-upload`, ...) fails `times`
    /// times with this error.
    #[serde(default)]
    pub faults: Vec<SimLibvirtFault>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimHostSpec {
    pub name: String,
    /// Reported by `probe`.
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub user: String,
    /// The hypervisor's own hostname (default: the configured name).
    #[serde(default)]
    pub hostname: Option<String>,
    /// libvirt's version number, major * 1000000 + minor * 1000 + micro.
    #[serde(default = "default_lib_version")]
    pub lib_version: u64,
    #[serde(default = "default_memory", rename = "memoryMiB")]
    pub memory_mib: u64,
    /// Memory the host itself uses, never free for domains.
    #[serde(default = "default_reserved", rename = "reservedMemoryMiB")]
    pub reserved_memory_mib: u64,
    #[serde(default = "default_cpus")]
    pub cpus: u32,
    /// Every call fails as a dial refused at the TCP stage.
    #[serde(default)]
    pub unreachable: bool,
    /// Seconds from start until a domain's interface has an address.
    #[serde(default = "default_boot")]
    pub boot_seconds: u64,
    /// Addresses handed out in order: `<prefix>.<first>`, `<prefix>.<first + 1>`, ...
    #[serde(default = "default_prefix")]
    pub address_prefix: String,
    #[serde(default = "default_first")]
    pub first_address: u8,
    #[serde(default = "default_pools")]
    pub pools: Vec<SimPoolSpec>,
    /// Domains defined at the start, as libvirt XML (parsed like a define).
    #[serde(default)]
    pub domains: Vec<SimDomainSpec>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimPoolSpec {
    pub name: String,
    /// The pool's directory; volume paths are `<path>/<name>`.
    #[serde(default = "default_pool_path")]
    pub path: String,
    #[serde(default = "default_capacity", rename = "capacityGiB")]
    pub capacity_gib: u64,
    /// Space used by files that are not volumes of the pool.
    #[serde(default, rename = "usedGiB")]
    pub used_gib: u64,
    /// `false`: the pool exists but is inactive.
    #[serde(default = "yes")]
    pub active: bool,
    #[serde(default)]
    pub volumes: Vec<SimVolumeSpec>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimVolumeSpec {
    pub name: String,
    #[serde(default)]
    pub capacity: u64,
    #[serde(default)]
    pub allocation: u64,
    #[serde(default = "default_format")]
    pub format: String,
    #[serde(default)]
    pub backing_store: Option<String>,
    /// Contents (small volumes such as markers).
    #[serde(default)]
    pub content: Option<String>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimDomainSpec {
    pub xml: String,
    /// running, paused, shutoff, crashed or pmsuspended.
    #[serde(default = "default_state")]
    pub state: String,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimUrl {
    pub url: String,
    pub bytes: u64,
    pub sha256: String,
    /// The image's virtual size (qcow2), default `bytes`.
    #[serde(default)]
    pub virtual_size: Option<u64>,
    /// Whether the server announces a Content-Length.
    #[serde(default = "yes")]
    pub content_length: bool,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimLibvirtFault {
    /// The WIT call name, e.g. `domain-create`.
    pub call: String,
    /// Only on this host (default: any).
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default = "one")]
    pub times: u32,
    /// virErrorNumber; 0 for a transport failure.
    #[serde(default)]
    pub code: i32,
    #[serde(default)]
    pub message: String,
    /// A dial failure at this stage (`tcp`, `auth`, ...).
    #[serde(default)]
    pub stage: Option<String>,
    #[serde(default)]
    pub timeout: bool,
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}
fn default_lib_version() -> u64 {
    11_003_000
}
fn default_memory() -> u64 {
    16_384
}
fn default_reserved() -> u64 {
    1024
}
fn default_cpus() -> u32 {
    8
}
fn default_boot() -> u64 {
    20
}
fn default_prefix() -> String {
    "192.168.50".to_string()
}
fn default_first() -> u8 {
    100
}
fn default_pool_path() -> String {
    "/var/lib/libvirt/images".to_string()
}
fn default_capacity() -> u64 {
    100
}
fn default_format() -> String {
    "raw".to_string()
}
fn default_state() -> String {
    "running".to_string()
}
fn default_pools() -> Vec<SimPoolSpec> {
    vec![SimPoolSpec {
        name: "default".into(),
        path: default_pool_path(),
        capacity_gib: default_capacity(),
        used_gib: 0,
        active: true,
        volumes: vec![],
    }]
}

fn default_host(name: &str) -> SimHostSpec {
    SimHostSpec {
        name: name.to_string(),
        address: String::new(),
        user: String::new(),
        hostname: None,
        lib_version: default_lib_version(),
        memory_mib: default_memory(),
        reserved_memory_mib: default_reserved(),
        cpus: default_cpus(),
        unreachable: false,
        boot_seconds: default_boot(),
        address_prefix: default_prefix(),
        first_address: default_first(),
        pools: default_pools(),
        domains: vec![],
    }
}

/// An element as libvirt 11.3's DOMAIN_GET_METADATA answers it: local names only, no namespace
/// declarations, blank text dropped and two spaces of indentation per level.
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

fn escape(s: &str, attr: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if attr => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// A small XML reader: enough of XML for domain and volume documents (elements, attributes,
// text, entities, comments, declarations).

#[derive(Debug, Clone, Default)]
pub(crate) struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<Element>,
    pub text: String,
}

impl Element {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }
    pub fn path(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |e, p| e.child(p))
    }
    fn local(&self) -> &str {
        self.name.rsplit(':').next().unwrap_or(&self.name)
    }
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let Some(end) = after.find(';') else {
            out.push_str(&rest[i..]);
            return out;
        };
        let ent = &after[..end];
        let c = match ent {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ if ent.starts_with("#x") => u32::from_str_radix(&ent[2..], 16)
                .ok()
                .and_then(char::from_u32),
            _ if ent.starts_with('#') => ent[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match c {
            Some(c) => out.push(c),
            None => out.push_str(&rest[i..i + end + 2]),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

pub(crate) fn parse_xml(doc: &str) -> Result<Element, String> {
    let b = doc.as_bytes();
    let mut i = 0;
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    while i < b.len() {
        if b[i] != b'<' {
            let end = doc[i..].find('<').map_or(b.len(), |n| i + n);
            let text = &doc[i..end];
            match stack.last_mut() {
                Some(top) => top.text.push_str(&unescape(text)),
                None if text.trim().is_empty() => {}
                None => return Err("text outside the root element".into()),
            }
            i = end;
            continue;
        }
        let rest = &doc[i..];
        if rest.starts_with("<?") {
            i += rest.find("?>").ok_or("unterminated declaration")? + 2;
        } else if rest.starts_with("<!--") {
            i += rest.find("-->").ok_or("unterminated comment")? + 3;
        } else if rest.starts_with("<![CDATA[") {
            let end = rest.find("]]>").ok_or("unterminated CDATA")?;
            if let Some(top) = stack.last_mut() {
                top.text.push_str(&rest[9..end]);
            }
            i += end + 3;
        } else if rest.starts_with("</") {
            let end = rest.find('>').ok_or("unterminated end tag")?;
            let name = rest[2..end].trim();
            let el = stack.pop().ok_or("end tag without start")?;
            if el.name != name {
                return Err(format!("</{name}> closes <{}>", el.name));
            }
            match stack.last_mut() {
                Some(parent) => parent.children.push(el),
                None => root = Some(el),
            }
            i += end + 1;
        } else {
            // A start tag: find its end outside quoted values.
            let mut j = 1;
            let mut quote: Option<u8> = None;
            let rb = rest.as_bytes();
            while j < rb.len() {
                match (quote, rb[j]) {
                    (None, b'"' | b'\'') => quote = Some(rb[j]),
                    (Some(q), c) if c == q => quote = None,
                    (None, b'>') => break,
                    _ => {}
                }
                j += 1;
            }
            if j >= rb.len() {
                return Err("unterminated start tag".into());
            }
            let self_closing = rb[j - 1] == b'/';
            let inner = &rest[1..if self_closing { j - 1 } else { j }];
            let name_end = inner
                .find(|c: char| c.is_whitespace())
                .unwrap_or(inner.len());
            let name = inner[..name_end].to_string();
            if name.is_empty() {
                return Err("empty element name".into());
            }
            let mut attrs = Vec::new();
            let mut a = inner[name_end..].trim_start();
            while !a.is_empty() {
                let eq = a.find('=').ok_or("attribute without value")?;
                let key = a[..eq].trim().to_string();
                let v = a[eq + 1..].trim_start();
                let q = v.chars().next().ok_or("attribute without value")?;
                if q != '"' && q != '\'' {
                    return Err("unquoted attribute".into());
                }
                let close = v[1..].find(q).ok_or("unterminated attribute")?;
                attrs.push((key, unescape(&v[1..1 + close])));
                a = v[close + 2..].trim_start();
            }
            if root.is_some() {
                return Err("content after the root element".into());
            }
            let el = Element {
                name,
                attrs,
                ..Default::default()
            };
            if self_closing {
                match stack.last_mut() {
                    Some(parent) => parent.children.push(el),
                    None => root = Some(el),
                }
            } else {
                stack.push(el);
            }
            i += j + 1;
        }
    }
    if !stack.is_empty() {
        return Err("unclosed element".into());
    }
    root.ok_or_else(|| "no root element".to_string())
}

fn size_of(e: &Element) -> Option<u64> {
    let n: u64 = e.text.trim().parse().ok()?;
    let f = match e.attr("unit").unwrap_or("bytes") {
        "b" | "bytes" => 1,
        "KB" => 1000,
        "k" | "K" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "M" | "MiB" => MIB,
        "GB" => 1_000_000_000,
        "G" | "GiB" => GIB,
        "TB" => 1_000_000_000_000,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(f)
}

// ---------------------------------------------------------------------------------------------
// The model.

#[derive(Debug, Clone)]
struct Volume {
    capacity: u64,
    allocation: u64,
    format: String,
    backing: Option<(String, String)>,
    data: Vec<u8>,
    /// For data streamed from a URL: size and digest only.
    streamed: Option<(u64, String)>,
}

struct Pool {
    path: String,
    capacity: u64,
    used: u64,
    active: bool,
    volumes: BTreeMap<String, Volume>,
}

impl Pool {
    fn allocation(&self) -> u64 {
        self.used + self.volumes.values().map(|v| v.allocation).sum::<u64>()
    }
    fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.allocation())
    }
}

struct Domain {
    uuid: String,
    xml: String,
    /// The definition the running instance was started from (live metadata reads it).
    live_xml: Option<String>,
    state: DomainState,
    persistent: bool,
    memory: u64,
    started_ms: u64,
    ip: Option<String>,
    mac: String,
}

struct Host {
    spec: SimHostSpec,
    pools: BTreeMap<String, Pool>,
    domains: BTreeMap<String, Domain>,
    next_ip: u32,
}

struct State {
    hosts: BTreeMap<String, Host>,
    faults: Vec<SimLibvirtFault>,
    next_uuid: u64,
}

pub struct SimLibvirt {
    clock: Arc<dyn ClockBackend>,
    urls: BTreeMap<String, SimUrl>,
    state: Mutex<State>,
}

fn lv_error(code: i32, domain: i32, message: impl Into<String>) -> LibvirtError {
    LibvirtError {
        code,
        domain,
        ..error(message)
    }
}

fn no_domain(name: &str) -> LibvirtError {
    lv_error(
        codes::NO_DOMAIN,
        from::QEMU,
        format!("Domain not found: no domain with matching name '{name}'"),
    )
}

fn no_pool(name: &str) -> LibvirtError {
    lv_error(
        codes::NO_STORAGE_POOL,
        from::STORAGE,
        format!("Storage pool not found: no storage pool with matching name '{name}'"),
    )
}

fn no_vol(name: &str) -> LibvirtError {
    lv_error(
        codes::NO_STORAGE_VOL,
        from::STORAGE,
        format!("Storage volume not found: no storage vol with matching name '{name}'"),
    )
}

fn parse_state(s: &str) -> Result<DomainState, String> {
    Ok(match s {
        "running" => DomainState::Running,
        "blocked" => DomainState::Blocked,
        "paused" => DomainState::Paused,
        "shutdown" => DomainState::Shutdown,
        "shutoff" => DomainState::Shutoff,
        "crashed" => DomainState::Crashed,
        "pmsuspended" => DomainState::PmSuspended,
        other => return Err(format!("unknown domain state {other:?}")),
    })
}

fn is_active(s: DomainState) -> bool {
    !matches!(s, DomainState::Shutoff | DomainState::NoState)
}

fn stage_of(s: &str) -> Option<DialStage> {
    Some(match s {
        "credentials" => DialStage::Credentials,
        "tcp" => DialStage::Tcp,
        "handshake" => DialStage::Handshake,
        "host-key" => DialStage::HostKey,
        "auth" => DialStage::Auth,
        "channel" => DialStage::Channel,
        "libvirt-open" => DialStage::LibvirtOpen,
        _ => return None,
    })
}

impl Pool {
    fn from_spec(p: &SimPoolSpec) -> Self {
        let volumes = p
            .volumes
            .iter()
            .map(|v| {
                let data = v.content.clone().unwrap_or_default().into_bytes();
                let capacity = v.capacity.max(data.len() as u64);
                let allocation = if v.allocation == 0 {
                    data.len() as u64
                } else {
                    v.allocation
                };
                (
                    v.name.clone(),
                    Volume {
                        capacity,
                        allocation,
                        format: v.format.clone(),
                        backing: v.backing_store.clone().map(|b| (b, "qcow2".to_string())),
                        data,
                        streamed: None,
                    },
                )
            })
            .collect();
        Self {
            path: p.path.trim_end_matches('/').to_string(),
            capacity: p.capacity_gib * GIB,
            used: p.used_gib * GIB,
            active: p.active,
            volumes,
        }
    }
}

impl SimLibvirt {
    pub fn new(spec: SimLibvirtSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let urls = spec
            .urls
            .iter()
            .map(|u| (u.url.clone(), u.clone()))
            .collect();
        let sim = Self {
            clock,
            urls,
            state: Mutex::new(State {
                hosts: BTreeMap::new(),
                faults: spec.faults.clone(),
                next_uuid: 0,
            }),
        };
        {
            let mut st = sim.lock();
            for h in &spec.hosts {
                st.hosts.insert(h.name.clone(), Self::host_from_spec(h));
            }
            let now = sim.clock.now_millis();
            for h in &spec.hosts {
                for d in &h.domains {
                    // A world that does not parse is the world file's mistake: the domain is
                    // left out, and the run shows its absence.
                    let Ok(state) = parse_state(&d.state) else {
                        continue;
                    };
                    if Self::define(&mut st, &h.name, &d.xml).is_err() {
                        continue;
                    }
                    if let Ok(name) = parse_xml(&d.xml).map(|e| {
                        e.child("name")
                            .map(|n| n.text.trim().to_string())
                            .unwrap_or_default()
                    }) && is_active(state)
                    {
                        let ip = Self::lease(&mut st, &h.name);
                        if let Some(host) = st.hosts.get_mut(&h.name)
                            && let Some(dom) = host.domains.get_mut(&name)
                        {
                            dom.state = state;
                            dom.live_xml = Some(dom.xml.clone());
                            // Domains of the world booted long ago.
                            dom.started_ms = now.saturating_sub(h.boot_seconds * 1000);
                            dom.ip = ip;
                        }
                    }
                }
            }
        }
        sim
    }

    fn host_from_spec(h: &SimHostSpec) -> Host {
        Host {
            pools: h
                .pools
                .iter()
                .map(|p| (p.name.clone(), Pool::from_spec(p)))
                .collect(),
            domains: BTreeMap::new(),
            next_ip: 0,
            spec: h.clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lease(st: &mut State, host: &str) -> Option<String> {
        let h = st.hosts.get_mut(host)?;
        let n = u32::from(h.spec.first_address) + h.next_ip;
        h.next_ip += 1;
        Some(format!("{}.{}", h.spec.address_prefix, n.min(254)))
    }

    /// Injected faults and unreachable hosts, checked before every call.
    fn enter(&self, st: &mut State, call: &str, host: Option<&str>) -> R<()> {
        if let Some(f) = st.faults.iter_mut().find(|f| {
            f.call == call && f.times > 0 && (f.host.is_none() || f.host.as_deref() == host)
        }) {
            f.times -= 1;
            return Err(LibvirtError {
                code: f.code,
                domain: 0,
                message: if f.message.is_empty() {
                    format!("injected failure of {call}")
                } else {
                    f.message.clone()
                },
                stage: f.stage.as_deref().and_then(stage_of),
                timeout: f.timeout,
                denied: false,
            });
        }
        if let Some(name) = host {
            let h = st
                .hosts
                .entry(name.to_string())
                .or_insert_with(|| Self::host_from_spec(&default_host(name)));
            if h.spec.unreachable {
                let at = if h.spec.address.is_empty() {
                    name.to_string()
                } else {
                    h.spec.address.clone()
                };
                return Err(LibvirtError {
                    stage: Some(DialStage::Tcp),
                    ..error(format!("dial tcp {at}: connect: connection refused"))
                });
            }
        }
        Ok(())
    }

    fn host<'a>(st: &'a mut State, name: &str) -> &'a mut Host {
        st.hosts
            .entry(name.to_string())
            .or_insert_with(|| Self::host_from_spec(&default_host(name)))
    }

    fn pool<'a>(st: &'a mut State, host: &str, pool: &str) -> R<&'a mut Pool> {
        let p = Self::host(st, host)
            .pools
            .get_mut(pool)
            .ok_or_else(|| no_pool(pool))?;
        if !p.active {
            return Err(lv_error(
                codes::OPERATION_INVALID,
                from::STORAGE,
                format!("Requested operation is not valid: storage pool '{pool}' is not active"),
            ));
        }
        Ok(p)
    }

    fn domain<'a>(st: &'a mut State, host: &str, name: &str) -> R<&'a mut Domain> {
        Self::host(st, host)
            .domains
            .get_mut(name)
            .ok_or_else(|| no_domain(name))
    }

    fn path_exists(h: &Host, path: &str) -> bool {
        h.pools.values().any(|p| {
            path.strip_prefix(&p.path)
                .and_then(|r| r.strip_prefix('/'))
                .is_some_and(|n| p.volumes.contains_key(n))
        })
    }

    fn define(st: &mut State, host: &str, xml: &str) -> R<()> {
        let doc = parse_xml(xml)
            .map_err(|e| lv_error(codes::XML_ERROR, from::DOMAIN, format!("XML error: {e}")))?;
        if doc.name != "domain" {
            return Err(lv_error(
                codes::XML_ERROR,
                from::DOMAIN,
                "XML error: expected <domain> root element",
            ));
        }
        let name = doc
            .child("name")
            .map(|n| n.text.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                lv_error(
                    27,
                    from::DOMAIN,
                    "XML error: missing domain name information",
                )
            })?;
        let memory = doc.child("memory").and_then(|m| {
            // libvirt's default unit for <memory> is KiB.
            let mut m = m.clone();
            if m.attr("unit").is_none() {
                m.attrs.push(("unit".into(), "KiB".into()));
            }
            size_of(&m)
        });
        let memory = memory.ok_or_else(|| {
            lv_error(
                codes::XML_ERROR,
                from::DOMAIN,
                "XML error: missing or invalid memory element",
            )
        })?;
        let given_uuid = doc.child("uuid").map(|u| u.text.trim().to_lowercase());
        let mac = doc
            .path(&["devices", "interface", "mac"])
            .and_then(|m| m.attr("address"))
            .map(str::to_string);
        st.next_uuid += 1;
        let fresh = format!("5e1f0000-0000-4000-8000-{:012x}", st.next_uuid);
        let h = Self::host(st, host);
        if let Some(existing) = h.domains.get_mut(&name) {
            // Without a <uuid> libvirt generates one, which then differs from the existing
            // domain's: a define by name alone never replaces a definition.
            if given_uuid.as_deref() != Some(existing.uuid.as_str()) {
                return Err(lv_error(
                    codes::OPERATION_FAILED,
                    from::DOMAIN,
                    format!(
                        "operation failed: domain '{name}' already exists with uuid {}",
                        existing.uuid
                    ),
                ));
            }
            existing.xml = xml.to_string();
            existing.memory = memory;
            existing.persistent = true;
            return Ok(());
        }
        let n = h.domains.len() as u64 + 1;
        h.domains.insert(
            name,
            Domain {
                uuid: given_uuid.unwrap_or(fresh),
                xml: xml.to_string(),
                live_xml: None,
                state: DomainState::Shutoff,
                persistent: true,
                memory,
                started_ms: 0,
                ip: None,
                mac: mac.unwrap_or_else(|| format!("52:54:00:00:{:02x}:{:02x}", n >> 8, n & 0xff)),
            },
        );
        Ok(())
    }

    fn free_memory(h: &Host) -> u64 {
        let used: u64 = h
            .domains
            .values()
            .filter(|d| is_active(d.state))
            .map(|d| d.memory)
            .sum();
        (h.spec.memory_mib.saturating_sub(h.spec.reserved_memory_mib) * MIB).saturating_sub(used)
    }

    fn volume_xml_of(pool: &Pool, name: &str, v: &Volume) -> String {
        let path = format!("{}/{name}", pool.path);
        let backing = v
            .backing
            .as_ref()
            .map(|(p, f)| {
                format!(
                    "  <backingStore>\n    <path>{p}</path>\n    <format type='{f}'/>\n  </backingStore>\n"
                )
            })
            .unwrap_or_default();
        format!(
            "<volume type='file'>\n  <name>{name}</name>\n  <key>{path}</key>\n  <capacity unit='bytes'>{}</capacity>\n  <allocation unit='bytes'>{}</allocation>\n  <target>\n    <path>{path}</path>\n    <format type='{}'/>\n  </target>\n{backing}</volume>\n",
            v.capacity, v.allocation, v.format
        )
    }

    fn metadata_of(xml: &str, uri: &str) -> Option<String> {
        let doc = parse_xml(xml).ok()?;
        let meta = doc.child("metadata")?;
        meta.children.iter().find_map(|c| {
            let prefix = c.name.split_once(':').map(|(p, _)| p);
            let declared = match prefix {
                Some(p) => c.attr(&format!("xmlns:{p}")),
                None => c.attr("xmlns"),
            };
            (declared == Some(uri)).then(|| {
                let mut out = String::new();
                write_metadata_element(c, 0, &mut out);
                out
            })
        })
    }

    fn has_network_interface(xml: &str) -> bool {
        parse_xml(xml).ok().is_some_and(|doc| {
            doc.child("devices").is_some_and(|d| {
                d.children
                    .iter()
                    .any(|c| c.local() == "interface" && c.attr("type") == Some("network"))
            })
        })
    }

    fn has_agent_channel(xml: &str) -> bool {
        parse_xml(xml).ok().is_some_and(|doc| {
            doc.child("devices").is_some_and(|d| {
                d.children.iter().any(|c| {
                    c.local() == "channel"
                        && c.child("target").and_then(|t| t.attr("name"))
                            == Some("org.qemu.guest_agent.0")
                })
            })
        })
    }
}

/// Runs `$body` with the state locked after the fault and reachability checks.
macro_rules! with_state {
    ($self:ident, $call:literal, $host:expr, |$st:ident| $body:expr) => {{
        let mut guard = $self.lock();
        $self.enter(&mut guard, $call, $host)?;
        let $st: &mut State = &mut guard;
        $body
    }};
}

#[async_trait::async_trait]
impl LibvirtBackend for SimLibvirt {
    fn for_entry(
        self: Arc<Self>,
        _entry: &str,
        _hosts: &[LibvirtHost],
    ) -> Result<Arc<dyn LibvirtBackend>, String> {
        Ok(self)
    }
    async fn lib_version(&self, host: &str) -> R<u64> {
        with_state!(self, "lib-version", Some(host), |st| Ok(Self::host(
            st, host
        )
        .spec
        .lib_version))
    }

    async fn hostname(&self, host: &str) -> R<String> {
        with_state!(self, "hostname", Some(host), |st| {
            let h = Self::host(st, host);
            Ok(h.spec
                .hostname
                .clone()
                .unwrap_or_else(|| h.spec.name.clone()))
        })
    }

    async fn node_get_info(&self, host: &str) -> R<NodeInfo> {
        with_state!(self, "node-get-info", Some(host), |st| {
            let h = Self::host(st, host);
            Ok(NodeInfo {
                model: "x86_64".into(),
                memory_kib: h.spec.memory_mib * 1024,
                cpus: h.spec.cpus,
                mhz: 2400,
            })
        })
    }

    async fn node_free_memory(&self, host: &str) -> R<u64> {
        with_state!(self, "node-free-memory", Some(host), |st| Ok(
            Self::free_memory(Self::host(st, host))
        ))
    }

    async fn list_domains(&self, host: &str) -> R<Vec<String>> {
        with_state!(self, "list-domains", Some(host), |st| Ok(Self::host(
            st, host
        )
        .domains
        .keys()
        .cloned()
        .collect()))
    }

    async fn domain_lookup(&self, host: &str, name: &str) -> R<String> {
        with_state!(self, "domain-lookup", Some(host), |st| Ok(Self::domain(
            st, host, name
        )?
        .uuid
        .replace('-', "")))
    }

    async fn domain_define_xml(&self, host: &str, xml: &str) -> R<()> {
        with_state!(self, "domain-define-xml", Some(host), |st| Self::define(
            st, host, xml
        ))
    }

    async fn domain_create(&self, host: &str, name: &str) -> R<()> {
        let now = self.clock.now_millis();
        with_state!(self, "domain-create", Some(host), |st| {
            let h = Self::host(st, host);
            let free = Self::free_memory(h);
            let missing: Vec<String> = {
                let d = h.domains.get(name).ok_or_else(|| no_domain(name))?;
                if is_active(d.state) {
                    return Err(lv_error(
                        codes::OPERATION_INVALID,
                        from::QEMU,
                        "Requested operation is not valid: domain is already running",
                    ));
                }
                if d.memory > free {
                    return Err(lv_error(
                        codes::INTERNAL_ERROR,
                        from::QEMU,
                        "internal error: process exited while connecting to monitor: cannot allocate memory",
                    ));
                }
                let doc = parse_xml(&d.xml).unwrap_or_default();
                doc.child("devices")
                    .map(|devs| {
                        devs.children
                            .iter()
                            .filter(|c| c.name == "disk")
                            .filter_map(|disk| disk.child("source")?.attr("file"))
                            .filter(|p| !Self::path_exists(h, p))
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            if let Some(p) = missing.first() {
                return Err(lv_error(
                    codes::SYSTEM_ERROR,
                    from::QEMU,
                    format!("Cannot access storage file '{p}': No such file or directory"),
                ));
            }
            let ip = Self::lease(st, host);
            let d = Self::domain(st, host, name)?;
            d.state = DomainState::Running;
            d.started_ms = now;
            d.live_xml = Some(d.xml.clone());
            if d.ip.is_none() {
                d.ip = ip;
            }
            Ok(())
        })
    }

    async fn domain_resume(&self, host: &str, name: &str) -> R<()> {
        with_state!(self, "domain-resume", Some(host), |st| {
            let d = Self::domain(st, host, name)?;
            match d.state {
                DomainState::Paused => {
                    d.state = DomainState::Running;
                    Ok(())
                }
                DomainState::Running | DomainState::Blocked => Err(lv_error(
                    codes::OPERATION_INVALID,
                    from::QEMU,
                    "Requested operation is not valid: domain is already running",
                )),
                DomainState::PmSuspended => Err(lv_error(
                    codes::OPERATION_INVALID,
                    from::QEMU,
                    "Requested operation is not valid: domain is pmsuspended",
                )),
                _ => Err(lv_error(
                    codes::OPERATION_INVALID,
                    from::DOMAIN,
                    "Requested operation is not valid: domain is not running",
                )),
            }
        })
    }

    async fn domain_destroy(&self, host: &str, name: &str) -> R<()> {
        with_state!(self, "domain-destroy", Some(host), |st| {
            let h = Self::host(st, host);
            let d = h.domains.get_mut(name).ok_or_else(|| no_domain(name))?;
            if !is_active(d.state) {
                return Err(lv_error(
                    codes::OPERATION_INVALID,
                    from::DOMAIN,
                    "Requested operation is not valid: domain is not running",
                ));
            }
            if !d.persistent {
                h.domains.remove(name);
                return Ok(());
            }
            d.state = DomainState::Shutoff;
            d.live_xml = None;
            Ok(())
        })
    }

    async fn domain_undefine(&self, host: &str, name: &str) -> R<()> {
        with_state!(self, "domain-undefine", Some(host), |st| {
            let h = Self::host(st, host);
            let d = h.domains.get_mut(name).ok_or_else(|| no_domain(name))?;
            if is_active(d.state) {
                // A running domain becomes transient and goes when it stops.
                d.persistent = false;
            } else {
                h.domains.remove(name);
            }
            Ok(())
        })
    }

    async fn domain_get_state(&self, host: &str, name: &str) -> R<DomainState> {
        with_state!(self, "domain-get-state", Some(host), |st| Ok(Self::domain(
            st, host, name
        )?
        .state))
    }

    async fn domain_get_metadata(&self, host: &str, name: &str, uri: &str) -> R<String> {
        with_state!(self, "domain-get-metadata", Some(host), |st| {
            let d = Self::domain(st, host, name)?;
            let xml = d.live_xml.as_ref().unwrap_or(&d.xml);
            Self::metadata_of(xml, uri).ok_or_else(|| {
                lv_error(
                    codes::NO_DOMAIN_METADATA,
                    from::DOMAIN,
                    "metadata not found: Requested metadata element is not present",
                )
            })
        })
    }

    async fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> R<Vec<InterfaceAddresses>> {
        let now = self.clock.now_millis();
        with_state!(self, "domain-interface-addresses", Some(host), |st| {
            let boot = Self::host(st, host).spec.boot_seconds * 1000;
            let d = Self::domain(st, host, name)?;
            if !is_active(d.state) {
                return Err(lv_error(
                    codes::OPERATION_INVALID,
                    from::DOMAIN,
                    "Requested operation is not valid: domain is not running",
                ));
            }
            // libvirt reads DHCP leases only for interfaces on one of its networks.
            if source == AddressSource::Lease && !Self::has_network_interface(&d.xml) {
                return Ok(vec![]);
            }
            let booted = now >= d.started_ms.saturating_add(boot);
            if source == AddressSource::Agent && (!booted || !Self::has_agent_channel(&d.xml)) {
                return Err(lv_error(
                    codes::AGENT_UNRESPONSIVE,
                    from::QEMU,
                    "Guest agent is not responding: QEMU guest agent is not connected",
                ));
            }
            if !booted {
                return Ok(vec![]);
            }
            let Some(ip) = d.ip.clone() else {
                return Ok(vec![]);
            };
            let name = match source {
                AddressSource::Agent => "eth0",
                _ => "vnet0",
            };
            let mut out = vec![InterfaceAddresses {
                name: name.into(),
                hwaddr: d.mac.clone(),
                addrs: vec![IpAddress {
                    kind: 0,
                    addr: ip,
                    prefix: 24,
                }],
            }];
            if source == AddressSource::Agent {
                out.insert(
                    0,
                    InterfaceAddresses {
                        name: "lo".into(),
                        hwaddr: "00:00:00:00:00:00".into(),
                        addrs: vec![IpAddress {
                            kind: 0,
                            addr: "127.0.0.1".into(),
                            prefix: 8,
                        }],
                    },
                );
            }
            Ok(out)
        })
    }

    async fn pool_get_info(&self, host: &str, pool: &str) -> R<PoolInfo> {
        with_state!(self, "pool-get-info", Some(host), |st| {
            let p = Self::host(st, host)
                .pools
                .get(pool)
                .ok_or_else(|| no_pool(pool))?;
            Ok(if p.active {
                PoolInfo {
                    state: 2,
                    capacity: p.capacity,
                    allocation: p.allocation(),
                    available: p.available(),
                }
            } else {
                PoolInfo {
                    state: 0,
                    capacity: 0,
                    allocation: 0,
                    available: 0,
                }
            })
        })
    }

    async fn pool_refresh(&self, host: &str, pool: &str) -> R<()> {
        with_state!(self, "pool-refresh", Some(host), |st| Self::pool(
            st, host, pool
        )
        .map(|_| ()))
    }

    async fn pool_list_volumes(&self, host: &str, pool: &str) -> R<Vec<String>> {
        with_state!(self, "pool-list-volumes", Some(host), |st| Ok(Self::pool(
            st, host, pool
        )?
        .volumes
        .keys()
        .cloned()
        .collect()))
    }

    async fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> R<String> {
        with_state!(self, "volume-lookup", Some(host), |st| {
            let p = Self::pool(st, host, pool)?;
            if !p.volumes.contains_key(name) {
                return Err(no_vol(name));
            }
            Ok(format!("{}/{name}", p.path))
        })
    }

    async fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> R<()> {
        with_state!(self, "volume-create-xml", Some(host), |st| {
            let doc = parse_xml(xml).map_err(|e| {
                lv_error(codes::XML_ERROR, from::STORAGE, format!("XML error: {e}"))
            })?;
            let name = doc
                .child("name")
                .map(|n| n.text.trim().to_string())
                .filter(|n| !n.is_empty() && !n.contains('/'))
                .ok_or_else(|| {
                    lv_error(
                        codes::XML_ERROR,
                        from::STORAGE,
                        "XML error: missing volume name",
                    )
                })?;
            let capacity = doc.child("capacity").and_then(size_of).ok_or_else(|| {
                lv_error(
                    codes::XML_ERROR,
                    from::STORAGE,
                    "XML error: missing capacity element",
                )
            })?;
            let format = doc
                .path(&["target", "format"])
                .and_then(|f| f.attr("type"))
                .unwrap_or("raw")
                .to_string();
            let backing = doc.child("backingStore").and_then(|b| {
                let path = b.child("path")?.text.trim().to_string();
                let f = b
                    .path(&["format"])
                    .and_then(|f| f.attr("type"))
                    .unwrap_or("raw")
                    .to_string();
                Some((path, f))
            });
            // qcow2 files start with their metadata; raw files are as large as asked.
            let allocation = match doc.child("allocation").and_then(size_of) {
                Some(a) => a.min(capacity),
                None if format == "qcow2" => 196_608,
                None => capacity,
            };
            let h = Self::host(st, host);
            if let Some((path, _)) = &backing
                && !Self::path_exists(h, path)
            {
                return Err(lv_error(
                    codes::INTERNAL_ERROR,
                    from::STORAGE,
                    format!(
                        "internal error: Could not open backing file '{path}': No such file or directory"
                    ),
                ));
            }
            let p = Self::pool(st, host, pool)?;
            if p.volumes.contains_key(&name) {
                return Err(lv_error(
                    codes::STORAGE_VOL_EXIST,
                    from::STORAGE,
                    format!("storage volume '{name}' exists already"),
                ));
            }
            if allocation > p.available() {
                return Err(lv_error(
                    codes::INTERNAL_ERROR,
                    from::STORAGE,
                    format!(
                        "internal error: cannot allocate {allocation} bytes in pool '{pool}': No space left on device"
                    ),
                ));
            }
            p.volumes.insert(
                name,
                Volume {
                    capacity,
                    allocation,
                    format,
                    backing,
                    data: vec![],
                    streamed: None,
                },
            );
            Ok(())
        })
    }

    async fn volume_delete(&self, host: &str, pool: &str, name: &str) -> R<()> {
        with_state!(self, "volume-delete", Some(host), |st| Self::pool(
            st, host, pool
        )?
        .volumes
        .remove(name)
        .map(|_| ())
        .ok_or_else(|| no_vol(name)))
    }

    async fn volume_get_info(&self, host: &str, pool: &str, name: &str) -> R<VolumeInfo> {
        with_state!(self, "volume-get-info", Some(host), |st| {
            let v = Self::pool(st, host, pool)?
                .volumes
                .get(name)
                .ok_or_else(|| no_vol(name))?;
            Ok(VolumeInfo {
                kind: 0,
                capacity: v.capacity,
                allocation: v.allocation,
            })
        })
    }

    async fn volume_xml(&self, host: &str, pool: &str, name: &str) -> R<String> {
        with_state!(self, "volume-xml", Some(host), |st| {
            let p = Self::pool(st, host, pool)?;
            let v = p.volumes.get(name).ok_or_else(|| no_vol(name))?;
            Ok(Self::volume_xml_of(p, name, v))
        })
    }

    async fn volume_upload(&self, host: &str, pool: &str, name: &str, data: Vec<u8>) -> R<()> {
        with_state!(self, "volume-upload", Some(host), |st| {
            let p = Self::pool(st, host, pool)?;
            let available = p.available();
            let v = p.volumes.get_mut(name).ok_or_else(|| no_vol(name))?;
            let len = data.len() as u64;
            if len.saturating_sub(v.allocation) > available {
                return Err(lv_error(
                    codes::INTERNAL_ERROR,
                    from::STORAGE,
                    "internal error: write failed: No space left on device",
                ));
            }
            v.allocation = v.allocation.max(len);
            v.capacity = v.capacity.max(len);
            // libvirt writes the stream from offset 0 and never truncates: a shorter upload
            // leaves the old bytes (zeros, in a fresh raw volume) after its own.
            let mut data = data;
            let old = std::mem::take(&mut v.data);
            if old.len() > data.len() {
                data.extend_from_slice(&old[data.len()..]);
            }
            v.data = data;
            v.streamed = None;
            Ok(())
        })
    }

    async fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> R<Vec<u8>> {
        with_state!(self, "volume-download", Some(host), |st| {
            let v = Self::pool(st, host, pool)?
                .volumes
                .get(name)
                .ok_or_else(|| no_vol(name))?;
            // A raw volume reads as zeros past what was written, up to its capacity.
            let size = if v.format == "raw" && v.streamed.is_none() {
                v.capacity.max(v.data.len() as u64)
            } else {
                v.data.len() as u64
            };
            let n = max_bytes.min(size) as usize;
            let mut out = v.data[..n.min(v.data.len())].to_vec();
            out.resize(n, 0);
            Ok(out)
        })
    }

    async fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
        // The host function checked the URL; the simulation follows no redirects.
        _images: &UrlGrant,
    ) -> R<Transfer> {
        let found = self.urls.get(url).cloned();
        with_state!(self, "volume-upload-from-url", Some(host), |st| {
            let p = Self::pool(st, host, pool)?;
            let available = p.available();
            let v = p.volumes.get_mut(name).ok_or_else(|| no_vol(name))?;
            let Some(u) = found else {
                return Err(error(format!("http: GET {url}: status 404 Not Found")));
            };
            if u.bytes > max_bytes {
                return Err(error(format!(
                    "body exceeds the limit of {max_bytes} bytes"
                )));
            }
            if u.bytes.saturating_sub(v.allocation) > available {
                return Err(lv_error(
                    codes::INTERNAL_ERROR,
                    from::STORAGE,
                    "internal error: write failed: No space left on device",
                ));
            }
            // The bytes land before the digest is compared, as in a streamed transfer.
            v.allocation = u.bytes;
            v.capacity = u.virtual_size.unwrap_or(u.bytes);
            v.data.clear();
            v.streamed = Some((u.bytes, u.sha256.clone()));
            if let Some(want) = sha256
                && !want.eq_ignore_ascii_case(&u.sha256)
            {
                return Err(error(format!(
                    "sha256 mismatch: expected {want}, got {}",
                    u.sha256
                )));
            }
            Ok(Transfer {
                bytes: u.bytes,
                sha256: u.sha256.to_lowercase(),
            })
        })
    }

    async fn url_size(&self, url: &str, _images: &UrlGrant) -> R<Option<u64>> {
        let mut st = self.lock();
        self.enter(&mut st, "url-size", None)?;
        match self.urls.get(url) {
            Some(u) if u.content_length => Ok(Some(u.bytes)),
            Some(_) => Ok(None),
            None => Err(error(format!("http: HEAD {url}: status 404 Not Found"))),
        }
    }

    async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
        let mut out = Vec::with_capacity(targets.len());
        for t in targets {
            let mut st = self.lock();
            let (address, user) = {
                let h = Self::host(&mut st, &t.host);
                (h.spec.address.clone(), h.spec.user.clone())
            };
            let mut r = ProbeResult {
                host: t.host.clone(),
                address,
                user,
                lib_version: None,
                hostname: None,
                pool: None,
                error: None,
            };
            if let Err(e) = self.enter(&mut st, "probe", Some(&t.host)) {
                r.error = Some(e);
                out.push(r);
                continue;
            }
            let h = Self::host(&mut st, &t.host);
            r.lib_version = Some(h.spec.lib_version);
            r.hostname = Some(
                h.spec
                    .hostname
                    .clone()
                    .unwrap_or_else(|| h.spec.name.clone()),
            );
            match h.pools.get(&t.pool) {
                Some(p) => {
                    r.pool = Some(PoolInfo {
                        state: if p.active { 2 } else { 0 },
                        capacity: p.capacity,
                        allocation: p.allocation(),
                        available: p.available(),
                    })
                }
                None => r.error = Some(no_pool(&t.pool)),
            }
            out.push(r);
        }
        out
    }
}

/// The sha256 of bytes, as the host's transfer reports it.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::capabilities::clock::VirtualClock;

    const URL: &str = "https://images.example.com/x.qcow2";

    fn sim() -> (SimLibvirt, Arc<VirtualClock>) {
        let clock = Arc::new(VirtualClock::new(1_000_000, 1));
        let spec = SimLibvirtSpec {
            urls: vec![SimUrl {
                url: URL.into(),
                bytes: 1000,
                sha256: "ab".repeat(32),
                virtual_size: None,
                content_length: true,
            }],
            ..Default::default()
        };
        (SimLibvirt::new(spec, clock.clone()), clock)
    }

    fn vol(name: &str, backing: Option<&str>) -> String {
        let b = backing
            .map(|p| format!("<backingStore><path>{p}</path><format type='qcow2'/></backingStore>"))
            .unwrap_or_default();
        format!(
            "<volume><name>{name}</name><capacity unit='GiB'>1</capacity><target><format type='qcow2'/></target>{b}</volume>"
        )
    }

    const DOMAIN: &str = "<domain type='kvm'><name>d</name><metadata><e:instance xmlns:e='urn:x'><e:uid>u</e:uid></e:instance></metadata><memory unit='MiB'>512</memory><devices><disk type='file'><source file='/var/lib/libvirt/images/o.qcow2'/></disk><channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>";

    #[tokio::test]
    async fn codes_match_libvirt() {
        let (s, _) = sim();
        assert_eq!(s.domain_lookup("h", "nope").await.unwrap_err().code, 42);
        assert_eq!(
            s.volume_lookup("h", "default", "nope")
                .await
                .unwrap_err()
                .code,
            50
        );
        assert_eq!(s.pool_get_info("h", "nope").await.unwrap_err().code, 49);
        s.volume_create_xml("h", "default", &vol("b.qcow2", None))
            .await
            .unwrap();
        let again = s
            .volume_create_xml("h", "default", &vol("b.qcow2", None))
            .await;
        assert_eq!(again.unwrap_err().code, 90);
        let orphan = s
            .volume_create_xml("h", "default", &vol("o2.qcow2", Some("/nowhere/x")))
            .await;
        assert_eq!(orphan.unwrap_err().code, 1);
        assert_eq!(
            s.domain_define_xml("h", "<domain>").await.unwrap_err().code,
            27
        );
    }

    #[tokio::test]
    async fn a_domain_lifecycle() {
        let (s, clock) = sim();
        s.domain_define_xml("h", DOMAIN).await.unwrap();
        // What libvirt 11.3 answers: prefix and namespace declaration gone, re-indented.
        assert_eq!(
            s.domain_get_metadata("h", "d", "urn:x").await.unwrap(),
            "<instance>\n  <uid>u</uid>\n</instance>"
        );
        // A define by name alone gets a fresh UUID, so the existing name refuses it.
        assert_eq!(s.domain_define_xml("h", DOMAIN).await.unwrap_err().code, 9);
        assert_eq!(
            s.domain_get_metadata("h", "d", "urn:y")
                .await
                .unwrap_err()
                .code,
            80
        );
        // The disk does not exist yet: start fails like qemu would.
        assert_eq!(s.domain_create("h", "d").await.unwrap_err().code, 38);
        s.volume_create_xml("h", "default", &vol("o.qcow2", None))
            .await
            .unwrap();
        assert_eq!(s.domain_resume("h", "d").await.unwrap_err().code, 55);
        s.domain_create("h", "d").await.unwrap();
        assert_eq!(s.domain_create("h", "d").await.unwrap_err().code, 55);
        assert_eq!(s.domain_resume("h", "d").await.unwrap_err().code, 55);
        assert_eq!(
            s.domain_get_state("h", "d").await.unwrap(),
            DomainState::Running
        );
        let early = s
            .domain_interface_addresses("h", "d", AddressSource::Agent)
            .await;
        assert_eq!(early.unwrap_err().code, 86);
        clock.advance(std::time::Duration::from_secs(21));
        // No interface on a libvirt network: the lease source has nothing, ARP has the address.
        let leases = s
            .domain_interface_addresses("h", "d", AddressSource::Lease)
            .await
            .unwrap();
        assert!(leases.is_empty());
        let ifaces = s
            .domain_interface_addresses("h", "d", AddressSource::Arp)
            .await
            .unwrap();
        assert_eq!(ifaces[0].addrs[0].addr, "192.168.50.100");
        let free = s.node_free_memory("h").await.unwrap();
        assert_eq!(free, (16_384 - 1024 - 512) * MIB);
        s.domain_undefine("h", "d").await.unwrap();
        // Undefined while running: transient until destroyed.
        assert!(s.domain_lookup("h", "d").await.is_ok());
        s.domain_destroy("h", "d").await.unwrap();
        assert_eq!(s.domain_lookup("h", "d").await.unwrap_err().code, 42);
    }

    #[tokio::test]
    async fn uploads_overwrite_without_truncating() {
        let (s, _) = sim();
        let raw = "<volume><name>m</name><capacity unit='bytes'>10</capacity><target><format type='raw'/></target></volume>";
        s.volume_create_xml("h", "default", raw).await.unwrap();
        // As observed on libvirt 11.3: a fresh raw volume reads as zeros, a short upload keeps
        // the tail, a long one grows the volume.
        assert_eq!(
            s.volume_download("h", "default", "m", 100).await.unwrap(),
            vec![0; 10]
        );
        s.volume_upload("h", "default", "m", b"hello".to_vec())
            .await
            .unwrap();
        assert_eq!(
            s.volume_download("h", "default", "m", 100).await.unwrap(),
            b"hello\0\0\0\0\0"
        );
        s.volume_upload("h", "default", "m", b"0123456789ab".to_vec())
            .await
            .unwrap();
        s.volume_upload("h", "default", "m", b"xy".to_vec())
            .await
            .unwrap();
        assert_eq!(
            s.volume_download("h", "default", "m", 100).await.unwrap(),
            b"xy23456789ab"
        );
        assert_eq!(
            s.volume_get_info("h", "default", "m")
                .await
                .unwrap()
                .capacity,
            12
        );
    }

    #[tokio::test]
    async fn pools_account_space_and_transfers() {
        let (s, _) = sim();
        // The simulation ignores the grant: the host function checks it before calling here.
        let unchecked = UrlGrant::default();
        let before = s.pool_get_info("h", "default").await.unwrap();
        s.volume_create_xml("h", "default", &vol("b.qcow2", None))
            .await
            .unwrap();
        let t = s
            .volume_upload_from_url("h", "default", "b.qcow2", URL, None, 1 << 30, &unchecked)
            .await
            .unwrap();
        assert_eq!(t.bytes, 1000);
        let after = s.pool_get_info("h", "default").await.unwrap();
        assert_eq!(before.available - after.available, 1000);
        let missing = s
            .volume_upload_from_url(
                "h",
                "default",
                "b.qcow2",
                "https://x/none",
                None,
                1 << 30,
                &unchecked,
            )
            .await;
        assert!(missing.unwrap_err().message.contains("status 404"));
        let bad = s
            .volume_upload_from_url(
                "h",
                "default",
                "b.qcow2",
                URL,
                Some(&"cd".repeat(32)),
                1 << 30,
                &unchecked,
            )
            .await;
        assert!(bad.unwrap_err().message.contains("sha256 mismatch"));
        assert!(
            s.volume_upload_from_url("h", "default", "b.qcow2", URL, None, 10, &unchecked)
                .await
                .is_err()
        );
        assert_eq!(s.url_size(URL, &unchecked).await.unwrap(), Some(1000));
        let xml = s.volume_xml("h", "default", "b.qcow2").await.unwrap();
        assert!(xml.contains("<path>/var/lib/libvirt/images/b.qcow2</path>"));
    }

    #[tokio::test]
    async fn faults_and_unreachable_hosts() {
        let clock = Arc::new(VirtualClock::new(0, 1));
        let mut host = default_host("down");
        host.unreachable = true;
        let spec = SimLibvirtSpec {
            hosts: vec![host],
            faults: vec![SimLibvirtFault {
                call: "list-domains".into(),
                host: Some("up".into()),
                times: 1,
                code: 1,
                message: "boom".into(),
                stage: None,
                timeout: false,
            }],
            ..Default::default()
        };
        let s = SimLibvirt::new(spec, clock);
        let e = s.list_domains("down").await.unwrap_err();
        assert_eq!(e.stage, Some(DialStage::Tcp));
        assert_eq!(s.list_domains("up").await.unwrap_err().code, 1);
        assert!(s.list_domains("up").await.is_ok());
        let probes = s
            .probe(vec![
                ProbeTarget {
                    host: "down".into(),
                    pool: "default".into(),
                },
                ProbeTarget {
                    host: "up".into(),
                    pool: "nope".into(),
                },
            ])
            .await;
        assert!(probes[0].error.as_ref().unwrap().stage.is_some());
        assert_eq!(probes[1].error.as_ref().unwrap().code, 49);
        assert_eq!(probes[1].lib_version, Some(11_003_000));
    }
}
