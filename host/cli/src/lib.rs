#![doc = include_str!("../README.md")]

pub mod check;
pub mod cli;
pub mod commands;
mod dry_run;
pub mod error;
pub mod examples;
pub mod html;
pub mod inputs;
pub mod leases;
pub mod output;
pub mod progress;
pub mod reconcile;
pub mod request;
pub mod serve;
pub mod signals;
pub mod state;
pub mod telemetry;
pub mod usage;
pub mod watch;
mod wiring;

pub use check::{CheckReport, run_check};
pub use commands::{echo, gateway, provider};
pub use error::CliError;
pub use inputs::{Inputs, Source, check_pools, parse_inputs, parse_proxies};
pub use request::{DEFAULT_MAX_ROUNDS, ReconcileRequest, run_reconcile};
pub use serve::{Serving, TOKENS_RELOAD};
pub use watch::{WATCH_RESYNC, run_reconcile_watch, run_reconcile_watch_serving};
