//! `proxies`: what a crawler may use now, from a state file with its leases and credentials.

use super::failed;
use crate::cli::{ProxiesArgs, ProxiesFormat};
use egress_control::credential_store::FileCredentials;
use std::process::ExitCode;

/// Prints the usable proxies as text or JSON: exit code 1 when the files cannot be read.
pub fn command(a: ProxiesArgs) -> ExitCode {
    match crate::state::StateFile::read(&a.state).and_then(|state| {
        let path = FileCredentials::path_for(&a.state);
        let leases = crate::state::LeaseFile::read(&crate::state::LeaseFile::path_for(&a.state))?;
        FileCredentials::open(path)
            .map(|c| (state, c, leases))
            .map_err(crate::error::CliError::Runtime)
    }) {
        Ok((state, credentials, leases)) => {
            let filter = egress_core::discovery::Filter {
                provider: a.provider,
                namespace: a.namespace,
                pool: a.pool,
                ..Default::default()
            };
            let list = state.discover(&credentials, &leases, &filter);
            match a.output {
                ProxiesFormat::Text => print!("{}", egress_core::discovery::text(&list)),
                ProxiesFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&egress_core::discovery::json(&list))
                        .unwrap_or_default()
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed(e),
    }
}
