//! Provider IDs: `hosts/<host>/domains/<name>`.

use guest_sdk::{ProviderError, permanent};

pub fn format_id(host: &str, name: &str) -> String {
    format!("hosts/{host}/domains/{name}")
}

/// Accepts exactly four segments with the literals `hosts` and `domains` and non-empty names.
pub fn parse_id(id: &str) -> Result<(&str, &str), ProviderError> {
    let parts: Vec<&str> = id.split('/').collect();
    match parts.as_slice() {
        ["hosts", host, "domains", name] if !host.is_empty() && !name.is_empty() => {
            Ok((host, name))
        }
        _ => Err(permanent(
            "InvalidProviderID",
            format!("provider ID {id:?} is not hosts/<host>/domains/<name>"),
        )),
    }
}
