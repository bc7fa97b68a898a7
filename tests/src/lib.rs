#![doc = include_str!("../README.md")]
//!
//! Cross-crate tests of egress-proxies live in `tests/`: the dry-run plans of every example,
//! the CLI's real-mode state handling, and (with the libvirt capability) runs against real
//! backends.

pub mod scale;
