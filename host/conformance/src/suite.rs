//! What one run of the suite is given: the module, the block file, the world, the runtime.

use egress_control::world::World;
use egress_core::Placement;
use egress_core::config::{ConfigError, Grants};
use egress_runtime::RuntimeOptions;
use serde::Deserialize;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// The `conformance` key of a block file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Settings {
    /// The placement of every create request.
    #[serde(default)]
    pub placement: Placement,
    /// Grants for a module loaded from a file; built-in types get what their block implies.
    /// Default for a module: kube cluster-wide on Pods, http to the hosts of every URL in the
    /// block, libvirt to the block's `hosts[].name`.
    #[serde(default)]
    pub grants: Option<Grants>,
    /// The namespace of every create request (default `conformance`).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Top-level fields the block must not do without. Empty: the suite validates `{}`.
    #[serde(default)]
    pub required: Vec<String>,
}

/// A config block for the suite: the provider's block and the suite's own settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BlockFile {
    pub block: Value,
    pub settings: Settings,
}

#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("block file: {0}")]
    Block(ConfigError),
    #[error("world: {0}")]
    World(ConfigError),
    #[error("module {path}: {message}")]
    Module { path: String, message: String },
    #[error("wasm runtime: {0}")]
    Runtime(String),
}

impl BlockFile {
    /// Parses a block file (YAML). The block must be a mapping; `conformance` is taken out.
    pub fn from_yaml(text: &str) -> Result<Self, SuiteError> {
        let mut block: Value = serde_yaml::from_str(text)
            .map_err(|e| SuiteError::Block(ConfigError::new("", e.to_string())))?;
        if block.is_null() {
            block = Value::Object(Default::default());
        }
        let Some(map) = block.as_object_mut() else {
            return Err(SuiteError::Block(ConfigError::new(
                "",
                "the block must be a mapping of the provider's fields",
            )));
        };
        let settings = match map.remove("conformance") {
            None => Settings::default(),
            Some(v) => serde_path_to_error::deserialize(v).map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." {
                    "conformance".to_string()
                } else {
                    format!("conformance.{path}")
                };
                SuiteError::Block(ConfigError::new(path, e.into_inner().to_string()))
            })?,
        };
        Ok(Self { block, settings })
    }
}

/// Where the module comes from.
#[derive(Debug, Clone)]
pub enum ModuleSource {
    /// A module built into the binary (the built-in types).
    Embedded(&'static [u8]),
    /// A `.wasm` component on disk, loaded as a providers config's `module:` would load it.
    File(PathBuf),
}

/// One run of the suite.
pub struct Suite {
    pub module: ModuleSource,
    /// The type to configure; default: the type the module describes.
    pub type_name: Option<String>,
    pub block: BlockFile,
    /// The simulations' starting state; default: empty (hosts and images from the block).
    pub world: Option<World>,
    pub runtime: RuntimeOptions,
    /// The create timeout: how long a hung backend call holds a create before the runtime
    /// cancels it (the "timeout mid-create" case).
    pub create_timeout: Duration,
}

impl Suite {
    pub fn new(module: ModuleSource, block: BlockFile) -> Self {
        Self {
            module,
            type_name: None,
            block,
            world: None,
            runtime: RuntimeOptions {
                cache_dir: None,
                pooling: false,
                max_concurrent_calls: 8,
                registry: Default::default(),
            },
            create_timeout: Duration::from_secs(3),
        }
    }
}
