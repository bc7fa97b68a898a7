//! The `kube` capability: dynamic objects as JSON. The grant limits kinds and namespaces (or
//! allows cluster scope); every mutating call is a plan step.
//!
//! Here the backend trait and the types it speaks; `host.rs` the host functions the bindings
//! call (grant check, span, plan step, then the backend), `real.rs` the cluster through kube-rs
//! and `sim.rs` the simulated API server.

mod host;
pub mod real;
pub mod sim;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl KubeRef {
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {reason}: {message}")]
pub struct KubeError {
    pub status: u16,
    pub reason: String,
    pub message: String,
}

impl KubeError {
    pub fn new(status: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// One page of a list: the objects, and the token that continues after them (none on the
/// last page).
#[derive(Debug, Clone, Default)]
pub struct ObjectPage {
    pub items: Vec<Object>,
    pub continue_token: Option<String>,
}

/// An object as the API server answered it. Shared: the simulated cluster hands out the
/// version it stores, not a deep copy of it for every get, create and list.
pub type Object = std::sync::Arc<Value>;

#[async_trait::async_trait]
pub trait KubeBackend: Send + Sync {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError>;
    /// [`KubeBackend::get`] as the JSON text a guest receives. A backend that hands out the
    /// same stored version to many gets may keep its text rather than write it each time.
    async fn get_text(&self, target: &KubeRef) -> Result<String, KubeError> {
        self.get(target).await.map(|o| json_text(&o))
    }
    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError>;
    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError>;
    /// One page of a list, as the API server's `limit` and `continue` give it.
    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
        limit: Option<u32>,
        continue_token: Option<&str>,
    ) -> Result<ObjectPage, KubeError>;
    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError>;
    /// A merge patch of the status subresource (what a kubelet or another controller
    /// writes; no guest import reaches it).
    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError>;
    async fn server_version(&self) -> Result<(String, String), KubeError>;
}

/// An object as the guest receives it: the compact JSON of the Value's Display, written
/// straight into bytes rather than through the formatter (every resync of a kubernetes Proxy
/// reads its Pod here). A Value's keys are strings, so this cannot fail; should it, Display
/// says the same.
pub(crate) fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| v.to_string())
}
