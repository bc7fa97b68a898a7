#![doc = include_str!("../README.md")]

pub mod account;
pub mod admin;
pub mod admission;
pub mod answers;
pub mod ask;
pub mod audit;
pub mod authority;
pub mod body;
pub mod budgets;
pub mod cluster;
pub mod demand;
pub mod forward;
pub mod h2;
pub mod hash;
pub mod listener;
pub mod members;
pub mod metrics;
pub mod plain;
pub mod politeness;
pub mod quarantine;
pub mod quota;
pub mod reports;
pub mod route;
pub mod server;
pub mod socks;
pub mod status;
pub mod tries;
pub mod usage;
pub mod wake;

pub use admin::{serve_admin, serve_admin_over};
pub use listener::{serve, serve_over};
pub use members::{Member, MemberKey, MemberTable, PoolKey};
pub use server::{Gateway, Limits, listen};
pub use socks::serve_socks;
