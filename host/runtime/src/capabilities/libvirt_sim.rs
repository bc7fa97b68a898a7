//! The simulated hypervisor behind the `libvirt` capability (being built).

use crate::capabilities::clock::ClockBackend;
use crate::capabilities::libvirt::*;
use std::sync::Arc;

/// The world file's `libvirt` section.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimLibvirtSpec {}

pub struct SimLibvirt {
    inner: UnavailableLibvirt,
}

impl SimLibvirt {
    pub fn new(_spec: SimLibvirtSpec, _clock: Arc<dyn ClockBackend>) -> Self {
        Self {
            inner: UnavailableLibvirt,
        }
    }
}

macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        #[async_trait::async_trait]
        impl LibvirtBackend for SimLibvirt {
            $(async fn $name(&self, $($arg: $ty),*) -> $ret {
                self.inner.$name($($arg),*).await
            })*
        }
    };
}

delegate! {
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
    volume_upload_from_url(host: &str, pool: &str, name: &str, url: &str, sha256: Option<&str>, max_bytes: u64) -> R<Transfer>;
    url_size(url: &str) -> R<Option<u64>>;
    probe(targets: Vec<ProbeTarget>) -> Vec<ProbeResult>;
}
