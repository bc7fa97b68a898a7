//! The real libvirt backend: libvirt's RPC protocol over SSH (libvirt-rpc), one pooled
//! connection per configured host, dialled lazily. Each provider entry with the libvirt
//! capability gets its own view when it loads: its host names mapped to pools built from its
//! own connection details, so an entry never dials with another's settings; a host whose
//! details change gets a fresh pool, so a reload needs no restart.

use crate::bindings::egress::provider::libvirt as wit;
use crate::capabilities::libvirt::{
    AddressSource, DialStage, DomainState, InterfaceAddresses, LibvirtBackend, LibvirtError,
    LibvirtHost, NodeInfo, PoolInfo, ProbeResult, ProbeTarget, R, Transfer, UrlGrant, VolumeInfo,
};
use libvirt_rpc as rpc;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// The real libvirt backend as one provider entry sees it: the hosts that entry configured,
/// each behind a connection pool dialled with that entry's details. The root (no entry) knows
/// no host. Pools are shared between entries only when every connection detail is the same
/// (name, address, user, socket, key, known_hosts, host-key policy), and kept across a reload
/// that changes nothing, so a reload needs no redial.
pub struct RealLibvirt {
    shared: Arc<Shared>,
    entry: String,
    hosts: HashMap<String, Arc<rpc::Pool>>,
}

struct Shared {
    options: rpc::PoolOptions,
    /// Pools by their full connection details; an entry of a pool no provider entry holds any
    /// more is dropped at the next registration.
    pools: Mutex<HashMap<LibvirtHost, Weak<rpc::Pool>>>,
}

impl Default for RealLibvirt {
    fn default() -> Self {
        Self::new(rpc::PoolOptions::default())
    }
}

impl RealLibvirt {
    pub fn new(options: rpc::PoolOptions) -> Self {
        Self {
            shared: Arc::new(Shared {
                options,
                pools: Mutex::new(HashMap::new()),
            }),
            entry: String::new(),
            hosts: HashMap::new(),
        }
    }

    fn pool(&self, host: &str) -> R<Arc<rpc::Pool>> {
        self.hosts.get(host).cloned().ok_or_else(|| LibvirtError {
            code: 0,
            domain: 0,
            message: format!(
                "libvirt host {host:?} is not configured in provider entry {:?}",
                self.entry
            ),
            stage: None,
            timeout: false,
            denied: true,
        })
    }
}

impl Shared {
    fn pool_for(&self, h: &LibvirtHost) -> Arc<rpc::Pool> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.retain(|_, w| w.strong_count() > 0);
        if let Some(p) = pools.get(h).and_then(Weak::upgrade) {
            return p;
        }
        let pool = Arc::new(rpc::Pool::new(
            [rpc::HostConfig {
                name: h.name.clone(),
                target: target(h),
            }],
            rpc::PoolOptions {
                transfer_timeout: h.transfer_timeout,
                ..self.options.clone()
            },
        ));
        pools.insert(h.clone(), Arc::downgrade(&pool));
        pool
    }
}

fn target(h: &LibvirtHost) -> rpc::SshTarget {
    let policy = match (&h.known_hosts_file, h.insecure_ignore_host_key) {
        (Some(path), _) => rpc::HostKeyPolicy::KnownHosts(path.into()),
        (None, _) => rpc::HostKeyPolicy::Insecure,
    };
    let mut t = rpc::SshTarget::new(
        h.address.clone(),
        h.user.clone(),
        h.ssh_key_file.clone(),
        policy,
    );
    if !h.socket.is_empty() {
        t.socket_path = h.socket.clone();
    }
    t
}

fn stage(s: rpc::DialStage) -> DialStage {
    match s {
        rpc::DialStage::Credentials => DialStage::Credentials,
        rpc::DialStage::Tcp => DialStage::Tcp,
        rpc::DialStage::Handshake => DialStage::Handshake,
        rpc::DialStage::HostKey => DialStage::HostKey,
        rpc::DialStage::Auth => DialStage::Auth,
        rpc::DialStage::Channel => DialStage::Channel,
        rpc::DialStage::LibvirtOpen => DialStage::LibvirtOpen,
    }
}

fn err(e: rpc::Error) -> LibvirtError {
    let r = e.to_record();
    LibvirtError {
        code: r.code,
        domain: r.domain,
        message: r.message,
        stage: r.stage.map(stage),
        timeout: r.timeout,
        denied: r.denied,
    }
}

fn pool_info(p: rpc::PoolInfo) -> PoolInfo {
    PoolInfo {
        state: p.state,
        capacity: p.capacity,
        allocation: p.allocation,
        available: p.available,
    }
}

fn domain_state(s: rpc::DomainState) -> DomainState {
    match s {
        rpc::DomainState::NoState => DomainState::NoState,
        rpc::DomainState::Running => DomainState::Running,
        rpc::DomainState::Blocked => DomainState::Blocked,
        rpc::DomainState::Paused => DomainState::Paused,
        rpc::DomainState::Shutdown => DomainState::Shutdown,
        rpc::DomainState::Shutoff => DomainState::Shutoff,
        rpc::DomainState::Crashed => DomainState::Crashed,
        rpc::DomainState::PmSuspended => DomainState::PmSuspended,
    }
}

#[async_trait::async_trait]
impl LibvirtBackend for RealLibvirt {
    fn for_entry(
        self: Arc<Self>,
        entry: &str,
        hosts: &[LibvirtHost],
    ) -> Result<Arc<dyn LibvirtBackend>, String> {
        let mut table = HashMap::new();
        for h in hosts {
            if table
                .insert(h.name.clone(), self.shared.pool_for(h))
                .is_some()
            {
                return Err(format!("host {:?} is configured twice", h.name));
            }
        }
        Ok(Arc::new(RealLibvirt {
            shared: self.shared.clone(),
            entry: entry.to_string(),
            hosts: table,
        }))
    }

    async fn lib_version(&self, host: &str) -> R<u64> {
        self.pool(host)?.lib_version(host).await.map_err(err)
    }
    async fn hostname(&self, host: &str) -> R<String> {
        self.pool(host)?.hostname(host).await.map_err(err)
    }
    async fn node_get_info(&self, host: &str) -> R<NodeInfo> {
        let n = self.pool(host)?.node_info(host).await.map_err(err)?;
        Ok(NodeInfo {
            model: n.model,
            memory_kib: n.memory_kib,
            cpus: n.cpus,
            mhz: n.mhz,
        })
    }
    async fn node_free_memory(&self, host: &str) -> R<u64> {
        self.pool(host)?.node_free_memory(host).await.map_err(err)
    }
    async fn list_domains(&self, host: &str) -> R<Vec<String>> {
        self.pool(host)?.list_domains(host).await.map_err(err)
    }
    async fn domain_lookup(&self, host: &str, name: &str) -> R<String> {
        self.pool(host)?
            .domain_lookup(host, name)
            .await
            .map_err(err)
    }
    async fn domain_define_xml(&self, host: &str, xml: &str) -> R<()> {
        self.pool(host)?
            .domain_define_xml(host, xml)
            .await
            .map_err(err)
    }
    async fn domain_create(&self, host: &str, name: &str) -> R<()> {
        self.pool(host)?
            .domain_create(host, name)
            .await
            .map_err(err)
    }
    async fn domain_resume(&self, host: &str, name: &str) -> R<()> {
        self.pool(host)?
            .domain_resume(host, name)
            .await
            .map_err(err)
    }
    async fn domain_destroy(&self, host: &str, name: &str) -> R<()> {
        self.pool(host)?
            .domain_destroy(host, name)
            .await
            .map_err(err)
    }
    async fn domain_undefine(&self, host: &str, name: &str) -> R<()> {
        self.pool(host)?
            .domain_undefine(host, name)
            .await
            .map_err(err)
    }
    async fn domain_get_state(&self, host: &str, name: &str) -> R<DomainState> {
        self.pool(host)?
            .domain_get_state(host, name)
            .await
            .map(domain_state)
            .map_err(err)
    }
    async fn domain_get_metadata(&self, host: &str, name: &str, uri: &str) -> R<String> {
        self.pool(host)?
            .domain_get_metadata(host, name, uri)
            .await
            .map_err(err)
    }
    async fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> R<Vec<InterfaceAddresses>> {
        let src = match source {
            AddressSource::Lease => rpc::AddressSource::Lease,
            AddressSource::Agent => rpc::AddressSource::Agent,
            AddressSource::Arp => rpc::AddressSource::Arp,
        };
        let ifaces = self
            .pool(host)?
            .domain_interface_addresses(host, name, src)
            .await
            .map_err(err)?;
        Ok(ifaces
            .into_iter()
            .map(|i| InterfaceAddresses {
                name: i.name,
                hwaddr: i.hwaddr,
                addrs: i
                    .addrs
                    .into_iter()
                    .map(|a| wit::IpAddress {
                        kind: a.kind,
                        addr: a.addr,
                        prefix: a.prefix,
                    })
                    .collect(),
            })
            .collect())
    }
    async fn pool_get_info(&self, host: &str, pool: &str) -> R<PoolInfo> {
        self.pool(host)?
            .pool_info(host, pool)
            .await
            .map(pool_info)
            .map_err(err)
    }
    async fn pool_refresh(&self, host: &str, pool: &str) -> R<()> {
        self.pool(host)?.pool_refresh(host, pool).await.map_err(err)
    }
    async fn pool_list_volumes(&self, host: &str, pool: &str) -> R<Vec<String>> {
        self.pool(host)?
            .pool_list_volumes(host, pool)
            .await
            .map_err(err)
    }
    async fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> R<String> {
        self.pool(host)?
            .volume_lookup(host, pool, name)
            .await
            .map_err(err)
    }
    async fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> R<()> {
        self.pool(host)?
            .volume_create_xml(host, pool, xml)
            .await
            .map_err(err)
    }
    async fn volume_delete(&self, host: &str, pool: &str, name: &str) -> R<()> {
        self.pool(host)?
            .volume_delete(host, pool, name)
            .await
            .map_err(err)
    }
    async fn volume_get_info(&self, host: &str, pool: &str, name: &str) -> R<VolumeInfo> {
        let v = self
            .pool(host)?
            .volume_info(host, pool, name)
            .await
            .map_err(err)?;
        Ok(VolumeInfo {
            kind: v.kind,
            capacity: v.capacity,
            allocation: v.allocation,
        })
    }
    async fn volume_xml(&self, host: &str, pool: &str, name: &str) -> R<String> {
        self.pool(host)?
            .volume_xml(host, pool, name)
            .await
            .map_err(err)
    }
    async fn volume_upload(&self, host: &str, pool: &str, name: &str, data: Vec<u8>) -> R<()> {
        self.pool(host)?
            .volume_upload(host, pool, name, &data)
            .await
            .map_err(err)
    }
    async fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> R<Vec<u8>> {
        self.pool(host)?
            .volume_download(host, pool, name, max_bytes)
            .await
            .map_err(err)
    }
    async fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
        images: &UrlGrant,
    ) -> R<Transfer> {
        let t = self
            .pool(host)?
            .volume_upload_from_url(host, pool, name, url, sha256, max_bytes, images)
            .await
            .map_err(err)?;
        Ok(Transfer {
            bytes: t.bytes,
            sha256: t.sha256,
        })
    }
    async fn url_size(&self, url: &str, images: &UrlGrant) -> R<Option<u64>> {
        rpc::transfer::url_size(url, images).await.map_err(err)
    }
    async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
        let probes = targets.into_iter().map(|t| async move {
            let pool = match self.pool(&t.host) {
                Ok(p) => p,
                Err(e) => {
                    return ProbeResult {
                        host: t.host,
                        address: String::new(),
                        user: String::new(),
                        lib_version: None,
                        hostname: None,
                        pool: None,
                        error: Some(e),
                    };
                }
            };
            let target = rpc::ProbeTarget {
                host: t.host.clone(),
                pool: t.pool.clone(),
            };
            match pool.probe(&[target]).await.into_iter().next() {
                Some(r) => ProbeResult {
                    host: r.host,
                    address: r.address,
                    user: r.user,
                    lib_version: r.lib_version,
                    hostname: r.hostname,
                    pool: r.pool.map(pool_info),
                    error: r.error.map(err),
                },
                None => ProbeResult {
                    host: t.host,
                    address: String::new(),
                    user: String::new(),
                    lib_version: None,
                    hostname: None,
                    pool: None,
                    error: Some(crate::capabilities::libvirt::error(
                        "probe returned nothing",
                    )),
                },
            }
        });
        futures::future::join_all(probes).await
    }
}
