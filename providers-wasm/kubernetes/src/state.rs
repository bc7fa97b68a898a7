//! Pod to instance: the seeds' state table, with a Pod being deleted reported Terminated so it
//! never reads as Running.

use crate::id::format_id;
use guest_sdk::{Instance, InstanceState, LABEL_INSTALLATION, LABEL_UID};
use serde_json::Value;

pub fn state_from_pod(pod: &Value) -> InstanceState {
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return InstanceState::Terminated;
    }
    let has_ip = pod["status"]["podIP"]
        .as_str()
        .is_some_and(|s| !s.is_empty());
    match pod["status"]["phase"].as_str() {
        Some("Running") if has_ip => InstanceState::Running,
        Some("Running") | Some("Pending") | None => InstanceState::Provisioning,
        // Succeeded, Failed, Unknown.
        Some(_) => InstanceState::Terminated,
    }
}

pub fn instance_from_pod(pod: &Value) -> Instance {
    let meta = &pod["metadata"];
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let state = state_from_pod(pod);
    Instance {
        provider_id: format_id(
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap_or(""),
        ),
        name: text(&meta["name"]),
        uid: text(&meta["labels"][LABEL_UID]),
        installation: text(&meta["labels"][LABEL_INSTALLATION]),
        state,
        ip: match state {
            InstanceState::Running => pod["status"]["podIP"].as_str().map(str::to_string),
            _ => None,
        },
        created_at: text(&meta["creationTimestamp"]),
    }
}
