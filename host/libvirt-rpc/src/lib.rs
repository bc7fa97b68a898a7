#![doc = include_str!("../README.md")]

pub mod client;
pub mod doctor;
pub mod error;
pub mod pool;
pub mod proto;
pub mod ssh;
pub mod transfer;
pub mod xdr;

pub use client::{
    AddressSource, Client, DomainState, Download, InterfaceAddresses, IpAddress, NodeInfo,
    PoolInfo, Upload, VolumeInfo,
};
pub use doctor::{DoctorOptions, DoctorReport, doctor};
pub use error::{DialStage, Error, ErrorRecord};
pub use pool::{HostConfig, Pool, PoolOptions, ProbeResult, ProbeTarget};
pub use proto::{Domain, RemoteError, StoragePool, StorageVol};
pub use ssh::{DialTrace, HostKeyPolicy, SshTarget, StageRecord, dial, dial_traced};
pub use transfer::{Transfer, UrlGrant};
