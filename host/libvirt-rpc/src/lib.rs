#![doc = include_str!("../README.md")]

#[cfg(feature = "client")]
pub mod client;
pub mod codes;
#[cfg(feature = "client")]
pub mod doctor;
#[cfg(feature = "client")]
pub mod error;
pub mod image_hosts;
#[cfg(feature = "client")]
pub mod pool;
#[cfg(feature = "client")]
pub mod procedures;
#[cfg(feature = "client")]
pub mod proto;
#[cfg(feature = "client")]
pub mod ssh;
#[cfg(feature = "client")]
pub mod transfer;
#[cfg(feature = "client")]
pub mod xdr;

#[cfg(feature = "client")]
pub use client::{Client, Download, Upload};
#[cfg(feature = "client")]
pub use doctor::{DoctorOptions, DoctorReport, doctor};
#[cfg(feature = "client")]
pub use error::{DialStage, Error, ErrorRecord};
#[cfg(feature = "client")]
pub use pool::{HostConfig, Pool, PoolOptions, ProbeResult, ProbeTarget};
#[cfg(feature = "client")]
pub use procedures::{
    AddressSource, DomainState, InterfaceAddresses, IpAddress, NodeInfo, PoolInfo, UNDEFINE_ALL,
    VolumeInfo,
};
#[cfg(feature = "client")]
pub use proto::{Domain, RemoteError, StoragePool, StorageVol};
#[cfg(feature = "client")]
pub use ssh::{DialTrace, HostKeyPolicy, SshTarget, StageRecord, dial, dial_traced};
#[cfg(feature = "client")]
pub use transfer::{Transfer, UrlGrant};
