//! What the hypervisor's calls take and answer, shaped like the `libvirt` interface of the
//! provider contract, so each adapter converts field for field.

use std::fmt;

/// virDomainState.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// libvirt counts every state but shut off (and no state) as active: such a domain holds
    /// its memory and must be destroyed before it starts again.
    pub fn is_active(self) -> bool {
        !matches!(self, Self::Shutoff | Self::NoState)
    }

    /// A state by the name world files give it: running, blocked, paused, shutdown, shutoff,
    /// crashed or pmsuspended.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => Self::Running,
            "blocked" => Self::Blocked,
            "paused" => Self::Paused,
            "shutdown" => Self::Shutdown,
            "shutoff" => Self::Shutoff,
            "crashed" => Self::Crashed,
            "pmsuspended" => Self::PmSuspended,
            _ => return None,
        })
    }
}

/// Where `domain-interface-addresses` reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressSource {
    Lease,
    Agent,
    Arp,
}

/// Where a connection attempt failed, in dial order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DialStage {
    Credentials,
    Tcp,
    Handshake,
    HostKey,
    Auth,
    Channel,
    LibvirtOpen,
}

impl DialStage {
    /// The stage's name as world files and messages write it.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "credentials" => Self::Credentials,
            "tcp" => Self::Tcp,
            "handshake" => Self::Handshake,
            "host-key" => Self::HostKey,
            "auth" => Self::Auth,
            "channel" => Self::Channel,
            "libvirt-open" => Self::LibvirtOpen,
            _ => return None,
        })
    }
}

/// A failed call, as the host reports it: libvirt's own code and domain, or a failure to
/// reach the host (dial stage, timeout) or to be allowed to (denied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Error {
    /// virErrorNumber; 0 when the failure is not a libvirt error.
    pub code: i32,
    /// virErrorDomain; 0 when none.
    pub domain: i32,
    pub message: String,
    pub stage: Option<DialStage>,
    pub timeout: bool,
    pub denied: bool,
}

impl Error {
    /// A failure that is not libvirt's (HTTP, checksum, size limit): code 0.
    pub fn other(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            ..Self::default()
        }
    }

    /// libvirt's error `code` raised by `domain` (a `codes::from` value).
    pub fn libvirt(code: i32, domain: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            domain,
            ..Self::other(message)
        }
    }

    /// Connecting failed at `stage`.
    pub fn dial(stage: DialStage, message: impl Into<String>) -> Self {
        Self {
            stage: Some(stage),
            ..Self::other(message)
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(stage) = self.stage {
            write!(f, " (dial stage {stage:?})")?;
        }
        if self.code != 0 {
            write!(f, " [libvirt code {}, domain {}]", self.code, self.domain)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// virNodeInfo, as far as the contract carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub model: String,
    pub memory_kib: u64,
    pub cpus: u32,
    pub mhz: u32,
}

/// virStoragePoolInfo: state 0 inactive, 2 running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInfo {
    pub state: i32,
    pub capacity: u64,
    pub allocation: u64,
    pub available: u64,
}

/// virStorageVolInfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeInfo {
    pub kind: i32,
    pub capacity: u64,
    pub allocation: u64,
}

/// One address of an interface: kind 0 IPv4, 1 IPv6.
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

/// What a url -> volume transfer wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub bytes: u64,
    pub sha256: String,
}

/// One host to probe, with the pool to report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub host: String,
    pub pool: String,
}

/// A probe's answer, filled as far as it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub host: String,
    pub address: String,
    pub user: String,
    pub lib_version: Option<u64>,
    pub hostname: Option<String>,
    pub pool: Option<PoolInfo>,
    pub error: Option<Error>,
}
