//! One provider's entry: its type, module, block and limits.

use super::grants::Grants;
use super::module_ref::{ModuleRef, parse_module_pin};
use super::text::ConfigError;
use super::text::parse_duration;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderEntry {
    /// The name Proxies refer to in `spec.provider`.
    pub name: String,
    /// The provider type: a built-in (`kubernetes`, `gcp`, `kvm`, `kvm2`) or the type a module
    /// named in `module` serves.
    #[serde(rename = "type")]
    pub type_: String,
    /// A provider module (`.wasm` component) instead of the built-in one: a path (relative to
    /// the providers config's directory), or an OCI reference,
    /// `oci://REGISTRY/REPOSITORY@sha256:DIGEST` or `oci://REGISTRY/REPOSITORY:TAG` (a tag is
    /// resolved at the first load and the digest it named serves until the entry changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// The SHA-256 the module's bytes must have (`sha256:` and 64 hex digits): a module whose
    /// digest differs is refused at load and at every reload, and the version serving keeps
    /// serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The config block of a module loaded with `module`.
    #[serde(
        default,
        deserialize_with = "super::finite::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub config: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "super::finite::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub kubernetes: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "super::finite::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub gcp: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "super::finite::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub kvm: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "super::finite::deserialize",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<BTreeMap<String, serde_json::Value>>")]
    pub kvm2: Option<serde_json::Value>,
    /// Capabilities this entry may use beyond what its type implies. Deny by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<Grants>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// What its instances cost (`super::Prices`): dry-run plans and usage reports price
    /// member-hours and bytes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<super::prices::Prices>,
}

impl ProviderEntry {
    /// The block key (`kubernetes`, ...) or `config`, and its value.
    pub fn block(&self) -> (&'static str, Option<&serde_json::Value>) {
        match self.type_.as_str() {
            "kubernetes" if self.module.is_none() => ("kubernetes", self.kubernetes.as_ref()),
            "gcp" if self.module.is_none() => ("gcp", self.gcp.as_ref()),
            "kvm" if self.module.is_none() => ("kvm", self.kvm.as_ref()),
            "kvm2" if self.module.is_none() => ("kvm2", self.kvm2.as_ref()),
            _ => ("config", self.config.as_ref()),
        }
    }

    /// Where the module comes from; None for a built-in. A malformed reference is refused by
    /// the config's check, so a checked config's entries parse.
    pub fn module_ref(&self) -> Option<Result<ModuleRef<'_>, String>> {
        self.module.as_deref().map(ModuleRef::parse)
    }

    /// Refuses module bytes whose SHA-256 is not the entry's pin (`at` names the entry, as
    /// `providers[1]`); an entry with no pin takes any.
    pub fn verify_module(&self, at: &str, bytes: &[u8]) -> Result<(), ConfigError> {
        self.verify_module_digest(at, Sha256::digest(bytes).into())
    }

    /// The same check of a module whose SHA-256 (`found`) is already known: a large module is
    /// hashed once for its pin, its signature and its compiled-module cache key.
    pub fn verify_module_digest(&self, at: &str, found: [u8; 32]) -> Result<(), ConfigError> {
        let Some(pin) = &self.sha256 else {
            return Ok(());
        };
        let expected =
            parse_module_pin(pin).map_err(|m| ConfigError::new(format!("{at}.sha256"), m))?;
        if found == expected {
            return Ok(());
        }
        Err(ConfigError::new(
            format!("{at}.sha256"),
            format!(
                "the module {} has sha256:{}, not the pinned sha256:{}",
                self.module.as_deref().unwrap_or("(built in)"),
                hex::encode(found),
                hex::encode(expected)
            ),
        ))
    }

    /// A digest of the whole entry: a change of it releases Proxies held on a permanent
    /// failure of this provider.
    pub fn revision(&self) -> String {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(&Sha256::digest(&bytes)[..8])
    }

    /// The wall-time bound of an operation.
    pub fn timeout(&self, operation: &str) -> Duration {
        self.limits
            .as_ref()
            .and_then(|l| l.timeouts.get(operation))
            .and_then(|s| parse_duration(s).ok())
            .unwrap_or_else(|| default_timeout(operation))
    }

    /// The bound the entry sets itself for `key` (an operation or imageTransfer), if any.
    pub fn explicit_timeout(&self, key: &str) -> Option<Duration> {
        self.limits
            .as_ref()
            .and_then(|l| l.timeouts.get(key))
            .and_then(|s| parse_duration(s).ok())
    }

    /// The budget of one url-to-volume image transfer.
    pub fn image_transfer_timeout(&self) -> Duration {
        self.explicit_timeout(IMAGE_TRANSFER)
            .unwrap_or(DEFAULT_IMAGE_TRANSFER)
    }

    /// Instances per page of a listing.
    pub fn list_page_size(&self) -> u32 {
        self.limits
            .as_ref()
            .and_then(|l| l.list_page_size)
            .unwrap_or(DEFAULT_LIST_PAGE_SIZE)
    }

    pub fn memory_bytes(&self) -> usize {
        let mib = self
            .limits
            .as_ref()
            .and_then(|l| l.memory_mib)
            .unwrap_or(64);
        (mib as usize) << 20
    }
}

/// Create blocks through an image download on libvirt hosts, hence the long default.
pub fn default_timeout(operation: &str) -> Duration {
    match operation {
        "create" => Duration::from_secs(600),
        "delete" => Duration::from_secs(120),
        "listByTag" | "check" => Duration::from_secs(60),
        _ => Duration::from_secs(30),
    }
}

/// Bounds on each provider call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Limits {
    /// Linear memory per call, in MiB (default 64).
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Wall time per operation, e.g. `{create: 10m, get: 30s}`. Keys: validateConfig, describe,
    /// create, get, delete, listByTag, check; and imageTransfer, the budget of one streamed
    /// url-to-volume transfer of the libvirt capability (default 60m), which a create of an
    /// entry granted libvirt must outlast (its create defaults to imageTransfer + 5m).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timeouts: BTreeMap<String, String>,
    /// Instances per page of a listing (default 500, at most 5000): each page is a call of its
    /// own, bounded by the listByTag timeout, so a module holds one page at a time in its
    /// memory however many instances the provider has. Modules built before contract 0.1.2
    /// answer a listing in one page whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_page_size: Option<u32>,
}

/// Instances per page of a listing when the entry does not say.
pub const DEFAULT_LIST_PAGE_SIZE: u32 = 500;

/// The largest page a listing may ask for.
pub const MAX_LIST_PAGE_SIZE: u32 = 5000;

/// The `limits.timeouts` key of the image transfer budget.
pub const IMAGE_TRANSFER: &str = "imageTransfer";

/// The image transfer budget when the entry does not set one.
pub const DEFAULT_IMAGE_TRANSFER: Duration = Duration::from_secs(3600);

pub const OPERATIONS: &[&str] = &[
    "validateConfig",
    "describe",
    "create",
    "get",
    "delete",
    "listByTag",
    "check",
];
