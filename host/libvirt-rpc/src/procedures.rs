//! libvirt's remote procedures as typed methods of [`Client`], and what they answer: one
//! method per procedure the providers and the doctor use (the stream procedures, volume upload
//! and download, are in [`crate::client`] with the streams).

use crate::client::Client;
use crate::error::Error;
use crate::proto::{self, Domain, StoragePool, StorageVol, procedure};

/// libvirt's virDomainState.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainState {
    NoState,
    Running,
    Blocked,
    Paused,
    Shutdown,
    Shutoff,
    Crashed,
    PmSuspended,
}

impl DomainState {
    pub fn from_wire(v: i32) -> Option<Self> {
        Some(match v {
            0 => Self::NoState,
            1 => Self::Running,
            2 => Self::Blocked,
            3 => Self::Paused,
            4 => Self::Shutdown,
            5 => Self::Shutoff,
            6 => Self::Crashed,
            7 => Self::PmSuspended,
            _ => return None,
        })
    }
}

/// Where DOMAIN_INTERFACE_ADDRESSES looks (virDomainInterfaceAddressesSource).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressSource {
    Lease = 0,
    Agent = 1,
    Arp = 2,
}

/// NODE_GET_INFO's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub model: String,
    pub memory_kib: u64,
    pub cpus: u32,
    pub mhz: u32,
    pub nodes: u32,
    pub sockets: u32,
    pub cores: u32,
    pub threads: u32,
}

/// STORAGE_POOL_GET_INFO's answer; `state` is virStoragePoolState (2 = running).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInfo {
    pub state: i32,
    pub capacity: u64,
    pub allocation: u64,
    pub available: u64,
}

/// STORAGE_VOL_GET_INFO's answer; `kind` is virStorageVolType.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeInfo {
    pub kind: i32,
    pub capacity: u64,
    pub allocation: u64,
}

/// One address of a guest interface; `kind` is virIPAddrType (0 IPv4, 1 IPv6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpAddress {
    pub kind: i32,
    pub addr: String,
    pub prefix: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddresses {
    pub name: String,
    pub hwaddr: String,
    pub addrs: Vec<IpAddress>,
}

/// Flags for DOMAIN_UNDEFINE_FLAGS: managed save, snapshot metadata and NVRAM go too.
pub const UNDEFINE_ALL: u32 = 1 | 2 | 4;
/// virDomainMetadataType ELEMENT: custom XML under a namespace URI.
const METADATA_ELEMENT: i32 = 2;

impl Client {
    // ------------------------------------------------------------ connection procedures

    /// AUTH_LIST: the authentication types the daemon accepts on this connection.
    pub async fn auth_list(&self) -> Result<Vec<i32>, Error> {
        let r: proto::AuthListRet = self.call(procedure::AUTH_LIST, &()).await?;
        Ok(r.types)
    }

    pub async fn connect_open(&self, uri: Option<&str>, flags: u32) -> Result<(), Error> {
        self.call(
            procedure::CONNECT_OPEN,
            &proto::ConnectOpenArgs {
                name: uri.map(str::to_owned),
                flags,
            },
        )
        .await
    }

    /// CONNECT_CLOSE; the connection is unusable afterwards.
    pub async fn connect_close(&self) -> Result<(), Error> {
        self.call(procedure::CONNECT_CLOSE, &()).await
    }

    /// libvirt's version as major * 1_000_000 + minor * 1000 + release.
    pub async fn connect_get_lib_version(&self) -> Result<u64, Error> {
        let r: proto::LibVersionRet = self.call(procedure::CONNECT_GET_LIB_VERSION, &()).await?;
        Ok(r.lib_ver)
    }

    pub async fn connect_get_hostname(&self) -> Result<String, Error> {
        let r: proto::HostnameRet = self.call(procedure::CONNECT_GET_HOSTNAME, &()).await?;
        Ok(r.hostname)
    }

    /// Every domain, active and inactive.
    pub async fn connect_list_all_domains(&self) -> Result<Vec<Domain>, Error> {
        let r: proto::ListAllDomainsRet = self
            .call(
                procedure::CONNECT_LIST_ALL_DOMAINS,
                &proto::ListAllArgs {
                    need_results: 1,
                    flags: 0,
                },
            )
            .await?;
        Ok(r.domains)
    }

    pub async fn node_get_info(&self) -> Result<NodeInfo, Error> {
        let r: proto::NodeInfoRet = self.call(procedure::NODE_GET_INFO, &()).await?;
        let nonneg = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(NodeInfo {
            model: r.model,
            memory_kib: r.memory,
            cpus: nonneg(r.cpus),
            mhz: nonneg(r.mhz),
            nodes: nonneg(r.nodes),
            sockets: nonneg(r.sockets),
            cores: nonneg(r.cores),
            threads: nonneg(r.threads),
        })
    }

    /// Free memory of the host in bytes.
    pub async fn node_get_free_memory(&self) -> Result<u64, Error> {
        let r: proto::FreeMemoryRet = self.call(procedure::NODE_GET_FREE_MEMORY, &()).await?;
        Ok(r.free_mem)
    }

    // ------------------------------------------------------------ domains

    pub async fn domain_lookup_by_name(&self, name: &str) -> Result<Domain, Error> {
        let r: proto::DomainRet = self
            .call(
                procedure::DOMAIN_LOOKUP_BY_NAME,
                &proto::NameArgs { name: name.into() },
            )
            .await?;
        Ok(r.dom)
    }

    pub async fn domain_define_xml_flags(&self, xml: &str, flags: u32) -> Result<Domain, Error> {
        let r: proto::DomainRet = self
            .call(
                procedure::DOMAIN_DEFINE_XML_FLAGS,
                &proto::DefineXmlFlagsArgs {
                    xml: xml.into(),
                    flags,
                },
            )
            .await?;
        Ok(r.dom)
    }

    pub async fn domain_create_with_flags(
        &self,
        dom: &Domain,
        flags: u32,
    ) -> Result<Domain, Error> {
        let r: proto::DomainRet = self
            .call(
                procedure::DOMAIN_CREATE_WITH_FLAGS,
                &proto::DomainFlagsArgs {
                    dom: dom.clone(),
                    flags,
                },
            )
            .await?;
        Ok(r.dom)
    }

    pub async fn domain_resume(&self, dom: &Domain) -> Result<(), Error> {
        self.call(
            procedure::DOMAIN_RESUME,
            &proto::DomainArgs { dom: dom.clone() },
        )
        .await
    }

    pub async fn domain_destroy_flags(&self, dom: &Domain, flags: u32) -> Result<(), Error> {
        self.call(
            procedure::DOMAIN_DESTROY_FLAGS,
            &proto::DomainFlagsArgs {
                dom: dom.clone(),
                flags,
            },
        )
        .await
    }

    pub async fn domain_undefine_flags(&self, dom: &Domain, flags: u32) -> Result<(), Error> {
        self.call(
            procedure::DOMAIN_UNDEFINE_FLAGS,
            &proto::DomainFlagsArgs {
                dom: dom.clone(),
                flags,
            },
        )
        .await
    }

    /// The domain's state and libvirt's reason code for it.
    pub async fn domain_get_state(&self, dom: &Domain) -> Result<(DomainState, i32), Error> {
        let r: proto::DomainStateRet = self
            .call(
                procedure::DOMAIN_GET_STATE,
                &proto::DomainFlagsArgs {
                    dom: dom.clone(),
                    flags: 0,
                },
            )
            .await?;
        let state = DomainState::from_wire(r.state)
            .ok_or_else(|| Error::Protocol(format!("unknown domain state {}", r.state)))?;
        Ok((state, r.reason))
    }

    /// The custom metadata element under namespace `uri`, as XML.
    pub async fn domain_get_metadata(&self, dom: &Domain, uri: &str) -> Result<String, Error> {
        let r: proto::GetMetadataRet = self
            .call(
                procedure::DOMAIN_GET_METADATA,
                &proto::GetMetadataArgs {
                    dom: dom.clone(),
                    kind: METADATA_ELEMENT,
                    uri: Some(uri.into()),
                    flags: 0,
                },
            )
            .await?;
        Ok(r.metadata)
    }

    pub async fn domain_interface_addresses(
        &self,
        dom: &Domain,
        source: AddressSource,
    ) -> Result<Vec<InterfaceAddresses>, Error> {
        let r: proto::InterfaceAddressesRet = self
            .call(
                procedure::DOMAIN_INTERFACE_ADDRESSES,
                &proto::InterfaceAddressesArgs {
                    dom: dom.clone(),
                    source: source as u32,
                    flags: 0,
                },
            )
            .await?;
        Ok(r.ifaces
            .into_iter()
            .map(|i| InterfaceAddresses {
                name: i.name,
                hwaddr: i.hwaddr.unwrap_or_default(),
                addrs: i
                    .addrs
                    .into_iter()
                    .map(|a| IpAddress {
                        kind: a.kind,
                        addr: a.addr,
                        prefix: a.prefix,
                    })
                    .collect(),
            })
            .collect())
    }

    // ------------------------------------------------------------ storage

    pub async fn storage_pool_lookup_by_name(&self, name: &str) -> Result<StoragePool, Error> {
        let r: proto::PoolRet = self
            .call(
                procedure::STORAGE_POOL_LOOKUP_BY_NAME,
                &proto::NameArgs { name: name.into() },
            )
            .await?;
        Ok(r.pool)
    }

    pub async fn storage_pool_get_info(&self, pool: &StoragePool) -> Result<PoolInfo, Error> {
        let r: proto::PoolInfoRet = self
            .call(
                procedure::STORAGE_POOL_GET_INFO,
                &proto::PoolArgs { pool: pool.clone() },
            )
            .await?;
        Ok(PoolInfo {
            state: i32::try_from(r.state).unwrap_or(-1),
            capacity: r.capacity,
            allocation: r.allocation,
            available: r.available,
        })
    }

    pub async fn storage_pool_refresh(&self, pool: &StoragePool) -> Result<(), Error> {
        self.call(
            procedure::STORAGE_POOL_REFRESH,
            &proto::PoolFlagsArgs {
                pool: pool.clone(),
                flags: 0,
            },
        )
        .await
    }

    pub async fn storage_pool_list_all_volumes(
        &self,
        pool: &StoragePool,
    ) -> Result<Vec<StorageVol>, Error> {
        let r: proto::PoolListAllVolumesRet = self
            .call(
                procedure::STORAGE_POOL_LIST_ALL_VOLUMES,
                &proto::PoolListAllVolumesArgs {
                    pool: pool.clone(),
                    need_results: 1,
                    flags: 0,
                },
            )
            .await?;
        Ok(r.vols)
    }

    pub async fn storage_vol_lookup_by_name(
        &self,
        pool: &StoragePool,
        name: &str,
    ) -> Result<StorageVol, Error> {
        let r: proto::VolRet = self
            .call(
                procedure::STORAGE_VOL_LOOKUP_BY_NAME,
                &proto::VolLookupArgs {
                    pool: pool.clone(),
                    name: name.into(),
                },
            )
            .await?;
        Ok(r.vol)
    }

    pub async fn storage_vol_create_xml(
        &self,
        pool: &StoragePool,
        xml: &str,
        flags: u32,
    ) -> Result<StorageVol, Error> {
        let r: proto::VolRet = self
            .call(
                procedure::STORAGE_VOL_CREATE_XML,
                &proto::VolCreateXmlArgs {
                    pool: pool.clone(),
                    xml: xml.into(),
                    flags,
                },
            )
            .await?;
        Ok(r.vol)
    }

    pub async fn storage_vol_delete(&self, vol: &StorageVol) -> Result<(), Error> {
        self.call(
            procedure::STORAGE_VOL_DELETE,
            &proto::VolFlagsArgs {
                vol: vol.clone(),
                flags: 0,
            },
        )
        .await
    }

    pub async fn storage_vol_get_path(&self, vol: &StorageVol) -> Result<String, Error> {
        let r: proto::VolPathRet = self
            .call(
                procedure::STORAGE_VOL_GET_PATH,
                &proto::VolArgs { vol: vol.clone() },
            )
            .await?;
        Ok(r.name)
    }

    pub async fn storage_vol_get_info(&self, vol: &StorageVol) -> Result<VolumeInfo, Error> {
        let r: proto::VolInfoRet = self
            .call(
                procedure::STORAGE_VOL_GET_INFO,
                &proto::VolArgs { vol: vol.clone() },
            )
            .await?;
        Ok(VolumeInfo {
            kind: r.kind,
            capacity: r.capacity,
            allocation: r.allocation,
        })
    }

    pub async fn storage_vol_get_xml_desc(&self, vol: &StorageVol) -> Result<String, Error> {
        let r: proto::XmlRet = self
            .call(
                procedure::STORAGE_VOL_GET_XML_DESC,
                &proto::VolFlagsArgs {
                    vol: vol.clone(),
                    flags: 0,
                },
            )
            .await?;
        Ok(r.xml)
    }
}
