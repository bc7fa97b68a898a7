//! One module per command (or family of commands): each turns its parsed arguments into a
//! run and the run's outcome into the process's exit code, writing what it reports to
//! stdout and its errors to stderr. `main.rs` only parses and hands each command here.

pub mod check;
pub mod doctor;
pub mod echo;
pub mod gateway;
pub mod operator;
pub mod provider;
pub mod proxies;
pub mod reconcile;
pub mod usage;

use std::process::ExitCode;

/// A command that failed with `e`: the error on stderr, exit code 1.
fn failed(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// Exit code 0 for a command that worked, 1 with the error on stderr for one that failed.
fn exit(outcome: Result<(), impl std::fmt::Display>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed(e),
    }
}

/// An input read from `path`, or the example embedded in the binary without one.
fn source(
    path: Option<std::path::PathBuf>,
    embedded: fn() -> crate::inputs::Source,
) -> crate::inputs::Source {
    path.map(crate::inputs::Source::File)
        .unwrap_or_else(embedded)
}

/// The world a dry-run plans against: the file given, else the embedded example's when every
/// other input is embedded too, else the one the providers config describes (none here).
fn world(path: Option<std::path::PathBuf>, all_embedded: bool) -> Option<crate::inputs::Source> {
    match path {
        Some(p) => Some(crate::inputs::Source::File(p)),
        None if all_embedded => Some(crate::examples::world()),
        None => None,
    }
}
