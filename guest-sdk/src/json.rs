//! Config parsing with errors that name the field path.

use crate::{ProviderError, permanent};
use serde::de::DeserializeOwned;

/// Parses a config block, rejecting what the target type rejects (use
/// `#[serde(deny_unknown_fields)]`); the error names the path under `path`, e.g.
/// `providers[1].kubernetes.image: invalid type: integer, expected a string`.
pub fn parse_config<T: DeserializeOwned>(path: &str, config: &str) -> Result<T, ProviderError> {
    let text = if config.trim().is_empty() {
        "{}"
    } else {
        config
    };
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let inner = e.path().to_string();
        let at = if inner == "." || inner.is_empty() {
            path.to_string()
        } else {
            format!("{path}.{inner}")
        };
        // serde_json appends the position in the JSON text the host made; it means nothing to
        // the user, who wrote YAML.
        let message = e.inner().to_string();
        let message = message
            .split(" at line ")
            .next()
            .unwrap_or(&message)
            .to_string();
        config_error(&at, &message)
    })
}

/// The config a call's context carries, which the contract defines as `validate-config`'s own
/// output: parsed without the path tracking and the checks that validation already ran when
/// the providers config was loaded. Every call runs in a fresh instance and parses its
/// config again, so this is on the path of every Get; validating there cost a KVM Get about a
/// third of its guest time (BENCHMARKS.md, "A pool's day of ordinary weather"). Anything
/// else in the context is the host's fault, and said so: permanent, naming the type.
pub fn parse_normalized<T: DeserializeOwned>(
    type_name: &str,
    config: &str,
) -> Result<T, ProviderError> {
    serde_json::from_str(config).map_err(|e| {
        permanent(
            "InvalidConfig",
            format!("{type_name}: the call's config is not the normalized block validate-config returned: {e}"),
        )
    })
}

/// A config error at `path`.
pub fn config_error(path: &str, message: &str) -> ProviderError {
    permanent("InvalidConfig", format!("{path}: {message}"))
}
