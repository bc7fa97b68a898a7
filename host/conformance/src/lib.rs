#![doc = include_str!("../README.md")]

mod capture;
mod cases;
pub mod faults;
pub mod recorded;
pub mod report;
pub mod sim;
pub mod suite;
pub mod template;

pub use recorded::{Lifecycle, LifecycleError, LifecycleReport, TapeMode};
pub use report::{CaseResult, Outcome, Report};
pub use suite::{BlockFile, ModuleSource, Settings, Suite, SuiteError};
