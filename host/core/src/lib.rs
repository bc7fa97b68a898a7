//! The domain core of egress-proxies: Proxy and instance types, the providers config, the pure
//! reconcile and garbage-collection decisions. No I/O happens here: the CLI and the operator feed
//! observations in and carry the decisions out.

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
