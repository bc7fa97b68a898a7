//! Provider IDs: `namespace/name`.

use guest_sdk::{ProviderError, permanent};

pub fn format_id(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Accepts exactly two non-empty segments.
pub fn parse_id(id: &str) -> Result<(&str, &str), ProviderError> {
    match id.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => Err(permanent(
            "InvalidProviderID",
            format!("provider ID {id:?} is not namespace/name"),
        )),
    }
}
