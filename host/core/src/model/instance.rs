//! What a provider reports about an instance, and how its failures are classified.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum InstanceState {
    Provisioning,
    Running,
    Stopped,
    Terminated,
}

impl InstanceState {
    /// Stopped and Terminated instances are replaced, like the seeds' reconciler does.
    pub fn needs_replacement(self) -> bool {
        matches!(self, Self::Stopped | Self::Terminated)
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Provisioning => "Provisioning",
            Self::Running => "Running",
            Self::Stopped => "Stopped",
            Self::Terminated => "Terminated",
        };
        f.write_str(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub provider_id: String,
    pub name: String,
    pub uid: String,
    pub installation: String,
    pub state: InstanceState,
    pub ip: Option<String>,
    /// RFC 3339; empty when the backend does not say.
    pub created_at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorClass {
    Transient,
    Permanent,
    NotFound,
    QuotaExceeded,
}

impl ErrorClass {
    /// The label used in metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::NotFound => "not_found",
            Self::QuotaExceeded => "quota_exceeded",
        }
    }
}

/// A classified failure of one provider operation, naming the provider and the operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider {provider:?} {operation}: {message}")]
pub struct ProviderError {
    pub provider: String,
    pub operation: String,
    pub class: ErrorClass,
    pub message: String,
    /// A short CamelCase reason from the provider or the host (`Timeout`, `MemoryLimit`, ...).
    pub reason: String,
}

impl ProviderError {
    pub fn new(
        provider: impl Into<String>,
        operation: impl Into<String>,
        class: ErrorClass,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            provider: provider.into(),
            operation: operation.into(),
            class,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// What a provider needs to create an instance for a Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub port: u16,
    pub placement: Placement,
    /// Secret: never logged, never in an error, event or plan.
    pub cloud_init: Option<String>,
    pub installation: String,
    pub owner: Option<OwnerReference>,
    /// The htpasswd line of the Proxy's credential (`crate::credential`), which the provider's
    /// Squid requires. Secret like the cloud-init: never logged, never in an error, event or plan.
    pub htpasswd: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// One health target as a provider's check reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    pub target: String,
    pub address: String,
    pub reason: String,
    pub message: String,
    pub details: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Placement {
    /// The zone (gcp: `europe-west1-b`; kvm/kvm2: a host's zone label; kubernetes: the
    /// node zone the Pod is pinned to). Empty: the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The region, where the provider has regions (gcp); derived from the zone when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The machine type or size (gcp: `e2-small`; kvm/kvm2: a size the provider entry
    /// defines). Empty: the provider entry's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// The image (gcp: an image or family URL; kvm2: a cloud image URL; kubernetes: the
    /// Squid container image). Empty: the provider entry's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

impl Placement {
    pub fn is_empty(&self) -> bool {
        *self == Placement::default()
    }
}
