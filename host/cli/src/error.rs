//! The errors of the CLI's runs: what was wrong with an input (named), a config, an output,
//! or the run itself.

use egress_core::config::ConfigError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{what}: {message}")]
    Input { what: String, message: String },
    #[error("{what}: {source}")]
    Config {
        what: String,
        #[source]
        source: ConfigError,
    },
    #[error("writing {what}: {message}")]
    Output { what: String, message: String },
    #[error("{0}")]
    Runtime(String),
}
