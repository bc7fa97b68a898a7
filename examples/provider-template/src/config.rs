//! The provider's config block: where the API is and what to create. Unknown keys are
//! rejected and every error names its field path, e.g. `providers[0].config.project`.

use guest_sdk::ProviderError;
use guest_sdk::json::{config_error, parse_config};
use serde::{Deserialize, Serialize};

pub const DEFAULT_ENDPOINT: &str = "https://api.examplecloud.test/v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The project instances live in. Required.
    #[serde(default)]
    pub project: String,
    /// The API root. The providers config must grant its host (`grants.http.hosts`).
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The instance size.
    #[serde(default = "default_size")]
    pub size: String,
}

fn default_endpoint() -> String {
    DEFAULT_ENDPOINT.to_string()
}
fn default_size() -> String {
    "small".to_string()
}

impl Config {
    /// `<endpoint>/projects/<project>/instances`.
    pub fn instances_url(&self) -> String {
        format!(
            "{}/projects/{}/instances",
            self.endpoint.trim_end_matches('/'),
            self.project
        )
    }
}

/// Parses, defaults and checks the block. A required field is defaulted to empty and checked
/// here, so its error names the field (serde's "missing field" would name only the block).
pub fn validate(path: &str, text: &str) -> Result<Config, ProviderError> {
    let cfg: Config = parse_config(path, text)?;
    if cfg.project.is_empty() {
        return Err(config_error(&format!("{path}.project"), "is required"));
    }
    if !cfg
        .project
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        return Err(config_error(
            &format!("{path}.project"),
            "must be lowercase letters, digits and dashes",
        ));
    }
    if !cfg.endpoint.starts_with("https://") {
        return Err(config_error(
            &format!("{path}.endpoint"),
            "must be an https:// URL",
        ));
    }
    Ok(cfg)
}

/// The normalized block the host hands back on every call.
pub fn from_context(config: &str) -> Result<Config, ProviderError> {
    serde_json::from_str(config)
        .map_err(|e| guest_sdk::permanent("InvalidConfig", format!("normalized config: {e}")))
}
