#![doc = include_str!("../README.md")]

pub mod bindings;
pub mod capabilities;
pub mod engine;
pub mod grants;
pub mod plan;
pub mod provider;
pub mod redact;
pub mod reload;

mod call;
mod module;
mod trap;

pub use capabilities::Backends;
pub use engine::{CallObserver, Runtime, RuntimeOptions};
pub use plan::{PlanRecorder, PlanStep};
pub use provider::{
    ListPage, LoadError, LoadOptions, LoadedModule, Provider, Providers, Rejection,
};
pub use reload::{ReloadOutcome, Reloader};
