//! The `libvirt` capability: typed calls by configured host name. The grant lists the hosts a
//! provider may reach; mutating calls are plan steps. The backend owns the SSH transport, the
//! pooled connection per host, budgets and streaming.
//!
//! Here the backend trait, the types it speaks, a hypervisor's connection details and the
//! unavailable backend; `host.rs` the host functions, `real.rs` libvirt's RPC protocol over
//! SSH and `sim.rs` the simulated hypervisors.

mod host;
pub mod real;
pub mod sim;

use crate::bindings::egress::provider::libvirt as wit;
pub use libvirt_rpc::UrlGrant;
use serde_json::Value;

pub use wit::{
    AddressSource, DialStage, DomainState, InterfaceAddresses, LibvirtError, NodeInfo, PoolInfo,
    ProbeResult, ProbeTarget, Transfer, VolumeInfo,
};

pub type R<T> = Result<T, LibvirtError>;

/// How the host reaches one configured hypervisor: from a provider entry's block (the seeds'
/// KVMConfig: `hosts[].{name, address, user, socket}`, `sshKeyFile`, `knownHostsFile` or
/// `insecureIgnoreHostKey`). Keys and known_hosts are read on every dial, never kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LibvirtHost {
    pub name: String,
    /// `host:port`, or `host` for port 22.
    pub address: String,
    pub user: String,
    /// libvirt's socket on the host; empty for the default.
    pub socket: String,
    pub ssh_key_file: String,
    pub known_hosts_file: Option<String>,
    pub insecure_ignore_host_key: bool,
    /// The budget of one url-to-volume transfer to this host (the entry's
    /// `limits.timeouts.imageTransfer`).
    pub transfer_timeout: std::time::Duration,
}

impl LibvirtHost {
    /// Reads the hosts of a normalized config block. Errors name the field.
    pub fn from_block(block: &Value) -> Result<Vec<Self>, (String, String)> {
        let text = |v: &Value| v.as_str().unwrap_or("").to_string();
        let key = text(&block["sshKeyFile"]);
        let known = block["knownHostsFile"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let insecure = block["insecureIgnoreHostKey"].as_bool().unwrap_or(false);
        if known.is_none() && !insecure {
            return Err((
                "knownHostsFile".into(),
                "required unless insecureIgnoreHostKey is true".into(),
            ));
        }
        let Some(hosts) = block["hosts"].as_array() else {
            return Err(("hosts".into(), "must list at least one host".into()));
        };
        hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let name = text(&h["name"]);
                let address = text(&h["address"]);
                if name.is_empty() || address.is_empty() {
                    return Err((
                        format!("hosts[{i}]"),
                        "name and address are required".into(),
                    ));
                }
                Ok(Self {
                    name,
                    address,
                    user: h["user"].as_str().unwrap_or("root").to_string(),
                    socket: text(&h["socket"]),
                    ssh_key_file: key.clone(),
                    known_hosts_file: known.clone(),
                    insecure_ignore_host_key: insecure,
                    transfer_timeout: egress_core::config::DEFAULT_IMAGE_TRANSFER,
                })
            })
            .collect()
    }
}

/// The calls of the WIT interface, host-side. Implemented by the native RPC client over SSH
/// and by the simulated hypervisor.
#[async_trait::async_trait]
pub trait LibvirtBackend: Send + Sync {
    /// The backend one provider entry calls through: its hosts, dialled with its own
    /// connection details only. Two entries may give the same host name to different
    /// hypervisors, or the same hypervisor different host-key policies; each entry's calls
    /// reach exactly the hosts it configured, so neither can use the other's settings.
    fn for_entry(
        self: std::sync::Arc<Self>,
        entry: &str,
        hosts: &[LibvirtHost],
    ) -> Result<std::sync::Arc<dyn LibvirtBackend>, String>;
    async fn lib_version(&self, host: &str) -> R<u64>;
    async fn hostname(&self, host: &str) -> R<String>;
    async fn node_get_info(&self, host: &str) -> R<NodeInfo>;
    async fn node_free_memory(&self, host: &str) -> R<u64>;
    async fn list_domains(&self, host: &str) -> R<Vec<String>>;
    async fn domain_lookup(&self, host: &str, name: &str) -> R<String>;
    async fn domain_define_xml(&self, host: &str, xml: &str) -> R<()>;
    async fn domain_create(&self, host: &str, name: &str) -> R<()>;
    async fn domain_resume(&self, host: &str, name: &str) -> R<()>;
    async fn domain_destroy(&self, host: &str, name: &str) -> R<()>;
    async fn domain_undefine(&self, host: &str, name: &str) -> R<()>;
    async fn domain_get_state(&self, host: &str, name: &str) -> R<DomainState>;
    async fn domain_get_metadata(&self, host: &str, name: &str, uri: &str) -> R<String>;
    async fn domain_interface_addresses(
        &self,
        host: &str,
        name: &str,
        source: AddressSource,
    ) -> R<Vec<InterfaceAddresses>>;
    async fn pool_get_info(&self, host: &str, pool: &str) -> R<PoolInfo>;
    async fn pool_refresh(&self, host: &str, pool: &str) -> R<()>;
    async fn pool_list_volumes(&self, host: &str, pool: &str) -> R<Vec<String>>;
    async fn volume_lookup(&self, host: &str, pool: &str, name: &str) -> R<String>;
    async fn volume_create_xml(&self, host: &str, pool: &str, xml: &str) -> R<()>;
    async fn volume_delete(&self, host: &str, pool: &str, name: &str) -> R<()>;
    async fn volume_get_info(&self, host: &str, pool: &str, name: &str) -> R<VolumeInfo>;
    async fn volume_xml(&self, host: &str, pool: &str, name: &str) -> R<String>;
    async fn volume_upload(&self, host: &str, pool: &str, name: &str, data: Vec<u8>) -> R<()>;
    async fn volume_download(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        max_bytes: u64,
    ) -> R<Vec<u8>>;
    /// Streams `url` into a volume. The caller has checked `url` against `images`; the
    /// backend holds every redirect and resolved address to it too.
    // The WIT call's six arguments and the grant they are held to.
    #[allow(clippy::too_many_arguments)]
    async fn volume_upload_from_url(
        &self,
        host: &str,
        pool: &str,
        name: &str,
        url: &str,
        sha256: Option<&str>,
        max_bytes: u64,
        images: &UrlGrant,
    ) -> R<Transfer>;
    /// The size `url` announces, held to `images` as `volume_upload_from_url` is.
    async fn url_size(&self, url: &str, images: &UrlGrant) -> R<Option<u64>>;
    async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult>;
}

/// The sha256 (hex) of an upload's bytes with `redactor`'s secrets redacted: what a plan step
/// and a tape show of an upload.
pub fn upload_digest(redactor: &crate::redact::Redactor, data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(redactor.bytes(data)))
}

pub fn error(message: impl Into<String>) -> LibvirtError {
    LibvirtError {
        code: 0,
        domain: 0,
        message: message.into(),
        stage: None,
        timeout: false,
        denied: false,
    }
}

/// No libvirt backend in this build: every call fails at the credentials stage.
pub struct UnavailableLibvirt;

macro_rules! unavailable {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        #[async_trait::async_trait]
        impl LibvirtBackend for UnavailableLibvirt {
            fn for_entry(
                self: std::sync::Arc<Self>,
                _entry: &str,
                _hosts: &[LibvirtHost],
            ) -> Result<std::sync::Arc<dyn LibvirtBackend>, String> {
                Ok(self)
            }
            $(async fn $name(&self, $($arg: $ty),*) -> $ret {
                let _ = ($($arg,)*);
                Err(error("the libvirt capability has no backend in this build"))
            })*
            async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
                targets
                    .into_iter()
                    .map(|t| ProbeResult {
                        host: t.host,
                        address: String::new(),
                        user: String::new(),
                        lib_version: None,
                        hostname: None,
                        pool: None,
                        error: Some(error("the libvirt capability has no backend in this build")),
                    })
                    .collect()
            }
        }
    };
}

/// The libvirt backend's calls that answer a `Result`, for the macros that wrap each one
/// (`$m` gets the list; `probe` and `for_entry` each backend writes itself): the unavailable
/// backend here, the tape's recording and replaying ones.
macro_rules! libvirt_calls {
    ($m:ident) => {
        $m! {
            lib_version(host: &str) -> R<u64>;
            hostname(host: &str) -> R<String>;
            node_get_info(host: &str) -> R<NodeInfo>;
            node_free_memory(host: &str) -> R<u64>;
            list_domains(host: &str) -> R<Vec<String>>;
            domain_lookup(host: &str, name: &str) -> R<String>;
            domain_define_xml(host: &str, xml: &str) -> R<()>;
            domain_create(host: &str, name: &str) -> R<()>;
            domain_resume(host: &str, name: &str) -> R<()>;
            domain_destroy(host: &str, name: &str) -> R<()>;
            domain_undefine(host: &str, name: &str) -> R<()>;
            domain_get_state(host: &str, name: &str) -> R<DomainState>;
            domain_get_metadata(host: &str, name: &str, uri: &str) -> R<String>;
            domain_interface_addresses(host: &str, name: &str, source: AddressSource) -> R<Vec<InterfaceAddresses>>;
            pool_get_info(host: &str, pool: &str) -> R<PoolInfo>;
            pool_refresh(host: &str, pool: &str) -> R<()>;
            pool_list_volumes(host: &str, pool: &str) -> R<Vec<String>>;
            volume_lookup(host: &str, pool: &str, name: &str) -> R<String>;
            volume_create_xml(host: &str, pool: &str, xml: &str) -> R<()>;
            volume_delete(host: &str, pool: &str, name: &str) -> R<()>;
            volume_get_info(host: &str, pool: &str, name: &str) -> R<VolumeInfo>;
            volume_xml(host: &str, pool: &str, name: &str) -> R<String>;
            volume_upload(host: &str, pool: &str, name: &str, data: Vec<u8>) -> R<()>;
            volume_download(host: &str, pool: &str, name: &str, max_bytes: u64) -> R<Vec<u8>>;
            volume_upload_from_url(host: &str, pool: &str, name: &str, url: &str, sha256: Option<&str>, max_bytes: u64, images: &UrlGrant) -> R<Transfer>;
            url_size(url: &str, images: &UrlGrant) -> R<Option<u64>>;
        }
    };
}
pub(crate) use libvirt_calls;

libvirt_calls!(unavailable);
