#![doc = include_str!("../README.md")]

pub mod crd;
pub mod members;
pub mod patch;
pub mod secrets;
pub mod watch;

pub use patch::api_error_summary;
