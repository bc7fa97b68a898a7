#![doc = include_str!("../README.md")]

pub mod credential_store;
pub mod egress;
pub mod private_file;
pub mod reconciler;
pub mod world;
