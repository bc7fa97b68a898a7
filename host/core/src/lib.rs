//! The domain core of egress-proxies: Proxy and instance types, the providers config, the pure
//! reconcile and garbage-collection decisions. No I/O happens here: the CLI and the operator feed
//! observations in and carry the decisions out.

pub mod config;
pub mod discovery;
pub mod egress;
pub mod gc;
pub mod lease;
pub mod model;
pub mod pool;
pub mod reconcile;
pub mod settle;

pub use model::{credential, instance, name, proxy};

pub use model::instance::{
    CreateRequest, ErrorClass, Instance, InstanceState, OwnerReference, ProviderError, TargetStatus,
};
pub use model::proxy::{Condition, InstanceSpec, Placement, Proxy, ProxySpec, ProxyStatus};
