//! Provider IDs: `zones/<zone>/instances/<name>`. The project comes from the config.

use crate::config::is_resource_name;
use guest_sdk::{ProviderError, permanent};

pub fn format_id(zone: &str, name: &str) -> String {
    format!("zones/{zone}/instances/{name}")
}

/// Accepts exactly `zones/<zone>/instances/<name>` with valid resource names.
pub fn parse_id(id: &str) -> Result<(&str, &str), ProviderError> {
    let parts: Vec<&str> = id.split('/').collect();
    match parts.as_slice() {
        ["zones", zone, "instances", name] if is_resource_name(zone) && is_resource_name(name) => {
            Ok((zone, name))
        }
        _ => Err(permanent(
            "InvalidProviderID",
            format!("provider ID {id:?} is not zones/<zone>/instances/<name>"),
        )),
    }
}
