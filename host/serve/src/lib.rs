#![doc = include_str!("../README.md")]

pub mod audit;
pub mod auth;
pub mod body;
pub mod conn;
pub mod peer;
pub mod quota_file;
pub mod reload;
pub mod tls;

pub use conn::{
    BACKLOG, Counted, Limits, Slot, WriteDeadline, accept_bounded, listen, serve_connection,
};
