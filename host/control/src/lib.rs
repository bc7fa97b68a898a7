#![doc = include_str!("../README.md")]

pub mod api;
pub mod audit;
pub mod crawl;
pub mod credential_store;
pub mod demand;
pub mod egress;
pub mod leases;
pub mod metrics;
pub mod private_file;
pub mod reconciler;
pub mod world;
