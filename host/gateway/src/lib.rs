#![doc = include_str!("../README.md")]

pub mod admission;
pub mod ask;
pub mod authority;
pub mod cluster;
pub mod forward;
pub mod members;
pub mod metrics;
pub mod route;
pub mod server;
pub mod status;

pub use members::{Member, MemberKey, PoolKey, Table};
pub use server::{Gateway, Limits, listen, serve, serve_admin};
