#![doc = include_str!("../README.md")]

pub mod config;
pub mod credential;
pub mod discovery;
pub mod egress;
pub mod gc;
pub mod instance;
pub mod lease;
pub mod name;
pub mod pool;
pub mod proxy;
pub mod reconcile;
pub mod settle;

pub use instance::{
    CreateRequest, ErrorClass, Instance, InstanceState, OwnerReference, ProviderError, TargetStatus,
};
pub use proxy::{Condition, InstanceSpec, Placement, Proxy, ProxySpec, ProxyStatus};
