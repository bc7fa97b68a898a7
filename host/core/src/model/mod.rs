//! The types, below everything: what a Proxy, an instance, a ProxyPool and a lease are, the
//! names put on them and the conditions they carry. Nothing here decides; the decisions in
//! [`crate::decide`] read and write these types.

pub mod autoscale;
pub mod conditions;
pub mod credential;
pub mod instance;
pub mod labels;
pub mod lease;
pub mod name;
pub mod politeness;
pub mod pool;
pub mod proxy;
pub mod quota;
pub mod target;
