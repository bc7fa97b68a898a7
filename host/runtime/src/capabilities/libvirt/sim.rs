//! The simulated hypervisor behind the `libvirt` capability, for dry-runs, plan snapshots and
//! the conformance tests: the hypervisor model of `egress_sim::libvirt` (the one the guest
//! SDK's test harness runs provider unit tests against) behind a mutex, seeded from the world
//! file's `libvirt` section and driven by the run's clock. This file holds the world's format
//! and the conversion between the contract's bindings and the model's types; what libvirt
//! answers, and how that was checked against libvirt 11.3, is the model's.

use crate::capabilities::clock::ClockBackend;
use crate::capabilities::libvirt::*;
use egress_sim::libvirt::{self as model, GIB, HostConfig};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

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
    /// URLs that answer 404, although the providers config names them (an image taken down):
    /// a world file adds to the world the config describes, and this takes a URL out of it.
    #[serde(default)]
    pub gone_urls: Vec<String>,
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
    #[serde(default = "once")]
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

/// A fault happens once unless it says how many times.
fn once() -> u32 {
    1
}
fn yes() -> bool {
    true
}
/// The defaults of a host the world does not describe, which the model also gives a host
/// nobody described.
fn host_defaults() -> HostConfig {
    HostConfig::new("")
}
fn default_lib_version() -> u64 {
    host_defaults().lib_version
}
fn default_memory() -> u64 {
    host_defaults().memory_mib
}
fn default_reserved() -> u64 {
    host_defaults().reserved_memory_mib
}
fn default_cpus() -> u32 {
    host_defaults().cpus
}
fn default_boot() -> u64 {
    host_defaults().boot_seconds
}
fn default_prefix() -> String {
    host_defaults().address_prefix
}
fn default_first() -> u8 {
    host_defaults().first_address
}
fn default_pool_path() -> String {
    model::DEFAULT_POOL_PATH.to_string()
}
fn default_capacity() -> u64 {
    model::DEFAULT_POOL_CAPACITY / GIB
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

impl SimHostSpec {
    fn to_model(&self) -> model::Host {
        let config = HostConfig {
            name: self.name.clone(),
            address: self.address.clone(),
            user: self.user.clone(),
            hostname: self.hostname.clone(),
            lib_version: self.lib_version,
            memory_mib: self.memory_mib,
            reserved_memory_mib: self.reserved_memory_mib,
            cpus: self.cpus,
            unreachable: self.unreachable,
            boot_seconds: self.boot_seconds,
            address_prefix: self.address_prefix.clone(),
            first_address: self.first_address,
        };
        let pools: BTreeMap<String, model::Pool> = self
            .pools
            .iter()
            .map(|p| (p.name.clone(), p.to_model()))
            .collect();
        model::Host::with_pools(config, pools)
    }
}

impl SimPoolSpec {
    fn to_model(&self) -> model::Pool {
        let mut pool = model::Pool::new(
            &self.path,
            self.capacity_gib * GIB,
            self.used_gib * GIB,
            self.active,
        );
        for v in &self.volumes {
            let content = v.content.clone().unwrap_or_default().into_bytes();
            let mut volume = model::Volume::seeded(v.capacity, v.allocation, &v.format, content);
            volume.backing = v.backing_store.clone().map(|path| model::Backing {
                path,
                format: "qcow2".to_string(),
            });
            pool.insert_volume(&v.name, volume);
        }
        pool
    }
}

impl SimLibvirtFault {
    fn to_model(&self) -> model::Fault {
        model::Fault {
            call: self.call.clone(),
            host: self.host.clone(),
            times: self.times,
            error: model::Error {
                code: self.code,
                domain: 0,
                message: if self.message.is_empty() {
                    format!("injected failure of {}", self.call)
                } else {
                    self.message.clone()
                },
                stage: self.stage.as_deref().and_then(model::DialStage::parse),
                timeout: self.timeout,
                denied: false,
            },
        }
    }
}

/// The simulated hypervisors. A provider entry reaches them through its own view
/// ([`LibvirtBackend::for_entry`]), which maps each host name it configures to a hypervisor
/// the way the real backend does by address: an entry whose host has the address of a world
/// host reaches that one; two entries that give one name to different addresses reach two
/// hypervisors, so a dry-run shows the same ownership as a real run.
pub struct SimLibvirt {
    clock: Arc<dyn ClockBackend>,
    model: Arc<Mutex<model::Libvirt>>,
    /// The world's hosts: (name, address).
    world_hosts: Arc<Vec<(String, String)>>,
    /// Which address each hypervisor (model key) was first reached at.
    claims: Arc<Mutex<BTreeMap<String, String>>>,
    /// This entry's host names to hypervisors; empty for the root, which uses names as they
    /// are.
    view: BTreeMap<String, String>,
}

impl SimLibvirt {
    pub fn new(spec: SimLibvirtSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let mut m = model::Libvirt::new();
        for h in &spec.hosts {
            m.add_host(h.to_model());
        }
        for u in &spec.urls {
            m.add_url(
                &u.url,
                model::Url {
                    bytes: u.bytes,
                    sha256: u.sha256.clone(),
                    virtual_size: u.virtual_size,
                    content_length: u.content_length,
                },
            );
        }
        for f in &spec.faults {
            m.add_fault(f.to_model());
        }
        let now = clock.now_millis();
        for h in &spec.hosts {
            for d in &h.domains {
                // A world domain that does not parse is the world file's mistake: it is left
                // out, and the run shows its absence.
                if let Some(state) = model::DomainState::parse(&d.state) {
                    let _ = m.insert_domain(&h.name, &d.xml, state, now);
                }
            }
        }
        Self {
            clock,
            model: Arc::new(Mutex::new(m)),
            world_hosts: Arc::new(
                spec.hosts
                    .iter()
                    .map(|h| (h.name.clone(), h.address.clone()))
                    .collect(),
            ),
            claims: Arc::default(),
            view: BTreeMap::new(),
        }
    }

    /// Draws every call of the model against `faults` (a world's `faults` section).
    pub fn with_rate_faults(self, faults: egress_sim::faults::RateFaults) -> Self {
        self.lock().set_rate_faults(faults);
        self
    }

    /// The model, for one call.
    fn lock(&self) -> Locked<'_> {
        Locked(self.model.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The hypervisor a host name of this view reaches.
    fn key<'a>(&'a self, host: &'a str) -> &'a str {
        self.view.get(host).map_or(host, String::as_str)
    }

    /// The hypervisor a configured host (name and address) reaches: the world host with that
    /// address; else the one of that name unless another address reached it first; else one
    /// of its own, `name@address`.
    fn hypervisor_for(&self, h: &LibvirtHost) -> String {
        let mut claims = self.claims.lock().unwrap_or_else(|p| p.into_inner());
        if !h.address.is_empty()
            && let Some((name, _)) = self.world_hosts.iter().find(|(_, a)| *a == h.address)
        {
            claims
                .entry(name.clone())
                .or_insert_with(|| h.address.clone());
            return name.clone();
        }
        let world_address = self
            .world_hosts
            .iter()
            .find(|(n, _)| *n == h.name)
            .map(|(_, a)| a.as_str());
        let free = match world_address {
            Some(a) if !a.is_empty() => a == h.address,
            _ => claims.get(&h.name).is_none_or(|a| *a == h.address),
        };
        if free {
            claims
                .entry(h.name.clone())
                .or_insert_with(|| h.address.clone());
            h.name.clone()
        } else {
            format!("{}@{}", h.name, h.address)
        }
    }
}

/// The model while one call uses it. When a `trap` draw answered the call, the provider call
/// ends as a trap once the call returns: the guard passes that on as it is let go.
struct Locked<'a>(std::sync::MutexGuard<'a, model::Libvirt>);

impl std::ops::Deref for Locked<'_> {
    type Target = model::Libvirt;
    fn deref(&self) -> &model::Libvirt {
        &self.0
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut model::Libvirt {
        &mut self.0
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(reason) = self.0.take_trap() {
            crate::trap::inject_trap(reason);
        }
    }
}

egress_sim::libvirt_bindings!(crate::bindings::egress::provider::libvirt);

#[async_trait::async_trait]
impl LibvirtBackend for SimLibvirt {
    fn for_entry(
        self: Arc<Self>,
        _entry: &str,
        hosts: &[LibvirtHost],
    ) -> Result<Arc<dyn LibvirtBackend>, String> {
        let view = hosts
            .iter()
            .map(|h| (h.name.clone(), self.hypervisor_for(h)))
            .collect();
        Ok(Arc::new(SimLibvirt {
            clock: self.clock.clone(),
            model: self.model.clone(),
            world_hosts: self.world_hosts.clone(),
            claims: self.claims.clone(),
            view,
        }))
    }
    async fn lib_version(&self, host: &str) -> R<u64> {
        Ok(self.lock().lib_version(self.key(host))?)
    }

    async fn hostname(&self, host: &str) -> R<String> {
        Ok(self.lock().hostname(self.key(host))?)
    }

    async fn node_get_info(&self, host: &str) -> R<NodeInfo> {
        Ok(self.lock().node_get_info(self.key(host))?.into())
    }

    async fn node_free_memory(&self, host: &str) -> R<u64> {
        Ok(self.lock().node_free_memory(self.key(host))?)
    }

    async fn list_domains(&self, host: &str) -> R<Vec<String>> {
        Ok(self.lock().list_domains(self.key(host))?)
    }

    async fn domain_lookup(&self, host: &str, name: &str) -> R<String> {
        Ok(self.lock().domain_lookup(self.key(host), name)?)
    }

    async fn domain_define_xml(&self, host: &str, xml: &str) -> R<()> {
        Ok(self.lock().domain_define_xml(self.key(host), xml)?)
    }

    async fn domain_create(&self, host: &str, name: &str) -> R<()> {
        let now = self.clock.now_millis();
        Ok(self.lock().domain_create(self.key(host), name, now)?)
    }

    async fn domain_resume(&self, host: &str, name: &str) -> R<()> {
        Ok(self.lock().domain_resume(self.key(host), name)?)
    }

    async fn domain_destroy(&self, host: &str, name: &str) -> R<()> {
        Ok(self.lock().domain_destroy(self.key(host), name)?)
    }

    async fn domain_undefine(&self, host: &str, name: &str) -> R<()> {
        Ok(self.lock().domain_undefine(self.key(host), name)?)
    }

    async fn domain_get_state(&self, host: &str, name: &str) -> R<DomainState> {
        Ok(self.lock().domain_get_state(self.key(host), name)?.into())
    }

    async fn domain_get_metadata(&self, host: &str, name: &str, uri: &str) -> R<String> {
        Ok(self.lock().domain_get_metadata(self.key(host), name, uri)?)
    }

    async fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> R<Vec<InterfaceAddresses>> {
        let now = self.clock.now_millis();
        let ifaces =
            self.lock()
                .domain_interface_addresses(self.key(host), name, source.into(), now)?;
        Ok(ifaces.into_iter().map(Into::into).collect())
    }

    async fn pool_get_info(&self, host: &str, pool: &str) -> R<PoolInfo> {
        Ok(self.lock().pool_get_info(self.key(host), pool)?.into())
    }

    async fn pool_refresh(&self, host: &str, pool: &str) -> R<()> {
        Ok(self.lock().pool_refresh(self.key(host), pool)?)
    }

    async fn pool_list_volumes(&self, host: &str, pool: &str) -> R<Vec<String>> {
        Ok(self.lock().pool_list_volumes(self.key(host), pool)?)
    }

    async fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> R<String> {
        Ok(self.lock().volume_lookup(self.key(host), pool, name)?)
    }

    async fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> R<()> {
        Ok(self.lock().volume_create_xml(self.key(host), pool, xml)?)
    }

    async fn volume_delete(&self, host: &str, pool: &str, name: &str) -> R<()> {
        Ok(self.lock().volume_delete(self.key(host), pool, name)?)
    }

    async fn volume_get_info(&self, host: &str, pool: &str, name: &str) -> R<VolumeInfo> {
        Ok(self
            .lock()
            .volume_get_info(self.key(host), pool, name)?
            .into())
    }

    async fn volume_xml(&self, host: &str, pool: &str, name: &str) -> R<String> {
        Ok(self.lock().volume_xml(self.key(host), pool, name)?)
    }

    async fn volume_upload(&self, host: &str, pool: &str, name: &str, data: Vec<u8>) -> R<()> {
        Ok(self
            .lock()
            .volume_upload(self.key(host), pool, name, data)?)
    }

    async fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> R<Vec<u8>> {
        Ok(self
            .lock()
            .volume_download(self.key(host), pool, name, max_bytes)?)
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
        Ok(self
            .lock()
            .volume_upload_from_url(self.key(host), pool, name, url, sha256, max_bytes)?
            .into())
    }

    async fn url_size(&self, url: &str, _images: &UrlGrant) -> R<Option<u64>> {
        Ok(self.lock().url_size(url)?)
    }

    async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
        let names: Vec<String> = targets.iter().map(|t| t.host.clone()).collect();
        let targets: Vec<model::ProbeTarget> = targets
            .into_iter()
            .map(|mut t| {
                t.host = self.key(&t.host).to_string();
                t.into()
            })
            .collect();
        // Answers name the host as this view calls it.
        self.lock()
            .probe(&targets)
            .into_iter()
            .zip(names)
            .map(|(r, name)| {
                let mut r: ProbeResult = r.into();
                r.host = name;
                r
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::capabilities::clock::VirtualClock;

    const URL: &str = "https://images.example.com/x.qcow2";

    const DOMAIN: &str = "<domain type='kvm'><name>d</name><metadata><e:instance xmlns:e='urn:x'><e:uid>u</e:uid></e:instance></metadata><memory unit='MiB'>512</memory><devices><disk type='file'><source file='/var/lib/libvirt/images/o.qcow2'/></disk><channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>";

    fn world(yaml: &str) -> SimLibvirtSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    /// The world's hosts, pools, volumes, domains, URLs and faults reach the model, and the
    /// answers reach the bindings.
    #[tokio::test]
    async fn a_world_seeds_the_model() {
        let clock = Arc::new(VirtualClock::new(1_000_000, 1));
        let spec = world(&format!(
            r#"
hosts:
  - name: rack1
    address: 192.0.2.10:22
    hostname: rack1.lab
    memoryMiB: 4096
    reservedMemoryMiB: 512
    pools:
      - name: images
        path: /srv/images/
        capacityGiB: 10
        usedGiB: 1
        volumes:
          - name: o.qcow2
            capacity: 1000
            format: qcow2
            backingStore: /srv/images/base.qcow2
          - name: m
            content: hello
    domains:
      - xml: "{}"
        state: paused
  - name: down
    unreachable: true
urls:
  - url: {URL}
    bytes: 1000
    sha256: {}
    contentLength: false
faults:
  - call: domain-resume
    code: 1
  - call: lib-version
    stage: auth
"#,
            DOMAIN.replace("/var/lib/libvirt/images", "/srv/images"),
            "ab".repeat(32)
        ));
        let s = SimLibvirt::new(spec, clock);
        assert_eq!(s.hostname("rack1").await.unwrap(), "rack1.lab");
        assert_eq!(
            s.domain_get_state("rack1", "d").await.unwrap(),
            DomainState::Paused
        );
        assert_eq!(
            s.node_free_memory("rack1").await.unwrap(),
            (4096 - 512 - 512) << 20
        );
        let info = s.pool_get_info("rack1", "images").await.unwrap();
        assert_eq!((info.capacity, info.allocation), (10 * GIB, GIB + 5));
        assert_eq!(
            s.volume_lookup("rack1", "images", "m").await.unwrap(),
            "/srv/images/m"
        );
        assert_eq!(
            s.volume_download("rack1", "images", "m", 10).await.unwrap(),
            b"hello"
        );
        assert!(
            s.volume_xml("rack1", "images", "o.qcow2")
                .await
                .unwrap()
                .contains("<path>/srv/images/base.qcow2</path>")
        );
        let e = s.domain_resume("rack1", "d").await.unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (1, "injected failure of domain-resume")
        );
        s.domain_resume("rack1", "d").await.unwrap();
        // Booted long ago: the address is there.
        let arp = s
            .domain_interface_addresses("rack1", "d", AddressSource::Arp)
            .await
            .unwrap();
        assert_eq!(arp[0].addrs[0].addr, "192.168.50.100");
        assert_eq!(
            s.lib_version("rack1").await.unwrap_err().stage,
            Some(DialStage::Auth)
        );
        // The simulation ignores the grant: the host function checks it before calling here.
        let unchecked = UrlGrant::default();
        assert_eq!(s.url_size(URL, &unchecked).await.unwrap(), None);
        let e = s.list_domains("down").await.unwrap_err();
        assert_eq!(
            (e.stage, e.message.as_str()),
            (
                Some(DialStage::Tcp),
                "dial tcp down: connect: connection refused"
            )
        );
        let probes = s
            .probe(vec![ProbeTarget {
                host: "rack1".into(),
                pool: "images".into(),
            }])
            .await;
        assert_eq!(probes[0].address, "192.0.2.10:22");
        assert_eq!(probes[0].pool.unwrap().state, 2);
    }

    /// Time is the run's clock: the address comes `bootSeconds` after start.
    #[tokio::test]
    async fn a_started_domain_gets_its_address_on_the_clock() {
        let clock = Arc::new(VirtualClock::new(1_000_000, 1));
        let s = SimLibvirt::new(SimLibvirtSpec::default(), clock.clone());
        s.volume_create_xml(
            "h",
            "default",
            "<volume><name>o.qcow2</name><capacity unit='GiB'>1</capacity><target><format type='qcow2'/></target></volume>",
        )
        .await
        .unwrap();
        s.domain_define_xml("h", DOMAIN).await.unwrap();
        s.domain_create("h", "d").await.unwrap();
        let early = s
            .domain_interface_addresses("h", "d", AddressSource::Arp)
            .await
            .unwrap();
        assert!(early.is_empty());
        clock.advance(std::time::Duration::from_secs(21));
        let agent = s
            .domain_interface_addresses("h", "d", AddressSource::Agent)
            .await
            .unwrap();
        assert_eq!(agent[1].addrs[0].addr, "192.168.50.100");
        assert_eq!(s.domain_lookup("h", "nope").await.unwrap_err().domain, 10);
    }

    fn configured(name: &str, address: &str) -> LibvirtHost {
        LibvirtHost {
            name: name.into(),
            address: address.into(),
            user: "u".into(),
            socket: String::new(),
            ssh_key_file: String::new(),
            known_hosts_file: None,
            insecure_ignore_host_key: true,
            transfer_timeout: std::time::Duration::from_secs(60),
        }
    }

    /// Two entries that give one host name to different addresses reach two hypervisors;
    /// entries naming one address by different names share one, as the real backend does.
    #[tokio::test]
    async fn each_entry_reaches_the_hypervisor_at_its_address() {
        let clock = Arc::new(VirtualClock::new(1_000_000, 1));
        let root = Arc::new(SimLibvirt::new(
            world("hosts: [{name: node1, address: '10.0.0.1:22'}]\n"),
            clock,
        ));
        let site_a = root
            .clone()
            .for_entry("a", &[configured("node1", "10.0.0.1:22")])
            .unwrap();
        let site_b = root
            .clone()
            .for_entry("b", &[configured("node1", "10.9.9.9:22")])
            .unwrap();
        let alias = root
            .clone()
            .for_entry("c", &[configured("rack", "10.0.0.1:22")])
            .unwrap();
        site_a.domain_define_xml("node1", DOMAIN).await.unwrap();
        assert_eq!(
            site_a.list_domains("node1").await.unwrap(),
            vec!["d".to_string()]
        );
        assert!(
            site_b.list_domains("node1").await.unwrap().is_empty(),
            "another site's node1 is another hypervisor"
        );
        assert_eq!(
            alias.list_domains("rack").await.unwrap(),
            vec!["d".to_string()],
            "the same address under another name is the same hypervisor"
        );
        let probed = site_b
            .probe(vec![ProbeTarget {
                host: "node1".into(),
                pool: "default".into(),
            }])
            .await;
        assert_eq!(
            probed[0].host, "node1",
            "answers name the host as the entry does"
        );
        // Whichever loads first, an unnamed world host goes to the first address that
        // reaches it and a second address gets a hypervisor of its own.
        let root = Arc::new(SimLibvirt::new(
            world("hosts: [{name: lab1}]\n"),
            Arc::new(VirtualClock::new(1_000_000, 1)),
        ));
        let first = root
            .clone()
            .for_entry("x", &[configured("lab1", "10.1.1.1:22")])
            .unwrap();
        let second = root
            .clone()
            .for_entry("y", &[configured("lab1", "10.2.2.2:22")])
            .unwrap();
        first.domain_define_xml("lab1", DOMAIN).await.unwrap();
        assert!(second.list_domains("lab1").await.unwrap().is_empty());
    }
}
