//! The native host of egress-proxies: one wasmtime Engine, provider modules compiled once and
//! instantiated into a fresh Store per call, bounded in time and memory, with capabilities
//! (log, clock, kube, http, libvirt) granted per provider entry, deny by default. Each
//! capability has a real backend and a simulated one behind one trait; a recorder turns every
//! mutating call into a plan step.

pub mod bindings;
pub mod capabilities;
pub mod credential_store;
pub mod egress;
pub mod engine;
pub mod grants;
pub mod plan;
pub mod private_file;
pub mod provider;
pub mod reconciler;
pub mod redact;
pub mod reload;
pub mod world;

mod call;

pub use capabilities::Backends;
pub use engine::{CallObserver, Runtime, RuntimeOptions};
pub use plan::{PlanRecorder, PlanStep};
pub use provider::{
    ListPage, LoadError, LoadOptions, LoadedModule, Provider, Providers, Rejection,
};
pub use reload::{ReloadOutcome, Reloader};
