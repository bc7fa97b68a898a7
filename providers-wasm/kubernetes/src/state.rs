//! Pod to instance: the seeds' state table, with a Pod being deleted reported Terminated so it
//! never reads as Running.

use crate::id::format_id;
use guest_sdk::view::{Obj, Text};
use guest_sdk::{Instance, InstanceState};
use serde::Deserialize;
use serde::de::IgnoredAny;

/// The fields of a Pod a provider reads, parsed straight from the API's answer (see
/// `guest_sdk::view`): a field of another type reads as absent, as indexing a `Value` does.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PodView {
    pub metadata: Obj<PodMeta>,
    pub status: Obj<PodStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodMeta {
    pub name: Text,
    pub namespace: Text,
    pub uid: Text,
    pub creation_timestamp: Text,
    /// Anything but null: the Pod is being deleted.
    pub deletion_timestamp: Option<IgnoredAny>,
    pub labels: Obj<Marks>,
}

/// The two labels that mark a proxy's Pod. The names are `guest_sdk::LABEL_UID` and
/// `LABEL_INSTALLATION`, spelled out because an attribute takes no constant; a test holds
/// them equal.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Marks {
    #[serde(rename = "egress-proxies.crawl.example.com/uid")]
    pub uid: Text,
    #[serde(rename = "egress-proxies.crawl.example.com/installation")]
    pub installation: Text,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: Text,
    #[serde(rename = "podIP")]
    pub pod_ip: Text,
}

pub fn state_from_pod(pod: &PodView) -> InstanceState {
    if pod.metadata.0.deletion_timestamp.is_some() {
        return InstanceState::Terminated;
    }
    let status = &pod.status.0;
    let has_ip = status.pod_ip.as_deref().is_some_and(|s| !s.is_empty());
    match status.phase.as_deref() {
        Some("Running") if has_ip => InstanceState::Running,
        Some("Running") | Some("Pending") | None => InstanceState::Provisioning,
        // Succeeded, Failed, Unknown.
        Some(_) => InstanceState::Terminated,
    }
}

pub fn instance_from_pod(pod: &PodView) -> Instance {
    let meta = &pod.metadata.0;
    let state = state_from_pod(pod);
    Instance {
        provider_id: format_id(meta.namespace.or_empty(), meta.name.or_empty()),
        name: meta.name.or_empty().to_string(),
        uid: meta.labels.0.uid.or_empty().to_string(),
        installation: meta.labels.0.installation.or_empty().to_string(),
        state,
        ip: match state {
            InstanceState::Running => pod.status.0.pod_ip.0.clone(),
            _ => None,
        },
        created_at: meta.creation_timestamp.or_empty().to_string(),
    }
}
