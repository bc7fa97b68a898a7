//! The backends modelled once: a hypervisor (libvirt), a cluster (the Kubernetes API) and the
//! Compute Engine API, as plain Rust with no wasmtime and no wit-bindgen, so the guest SDK's
//! native test harness and the host's simulated capabilities are thin adapters over the same
//! model. A provider's unit tests and the dry-run then meet the same backend, and a difference
//! from the real one is fixed in one place.

pub mod codes;
pub mod faults;
pub mod gce;
pub mod kube;
pub mod libvirt;
pub mod xml;
