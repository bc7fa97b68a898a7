//! A Compute instance to a contract instance: the seeds' state table, the address the config
//! asks for (external NAT IP, or the NIC's internal one), the marks, and the creation time.

use crate::id::format_id;
use crate::insert::{LABEL_INSTALLATION, LABEL_UID};
use guest_sdk::{Host, Instance, InstanceState, Level};
use serde_json::Value;

/// The seeds' mapState: an instance serves once RUNNING with an address.
pub fn map_state(status: &str, has_ip: bool) -> InstanceState {
    match status {
        "PROVISIONING" | "STAGING" | "REPAIRING" => InstanceState::Provisioning,
        "RUNNING" if has_ip => InstanceState::Running,
        "RUNNING" => InstanceState::Provisioning,
        "TERMINATED" => InstanceState::Terminated,
        // STOPPING, STOPPED, SUSPENDING, SUSPENDED, and anything newer the API adds.
        _ => InstanceState::Stopped,
    }
}

/// The proxy's address: the first NIC's external NAT IP, or its internal IP in internal mode.
pub fn address(instance: &Value, internal_ip: bool) -> Option<String> {
    let nic = &instance["networkInterfaces"][0];
    let ip = if internal_ip {
        nic["networkIP"].as_str()
    } else {
        nic["accessConfigs"][0]["natIP"].as_str()
    };
    ip.filter(|s| !s.is_empty()).map(str::to_string)
}

/// The last segment of a resource URL (`.../zones/europe-west1-b` gives `europe-west1-b`).
pub fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

pub fn to_instance(host: &dyn Host, instance: &Value, internal_ip: bool) -> Instance {
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let name = text(&instance["name"]);
    let zone = last_segment(instance["zone"].as_str().unwrap_or("")).to_string();
    let ip = address(instance, internal_ip);
    let state = map_state(instance["status"].as_str().unwrap_or(""), ip.is_some());
    let created_at = match instance["creationTimestamp"].as_str() {
        None | Some("") => String::new(),
        Some(ts) => match normalize_timestamp(ts) {
            Some(t) => t,
            None => {
                // The contract's zero time; said out loud, because GC treats an unknown
                // creation time as old.
                host.log(
                    Level::Warn,
                    "instance creationTimestamp does not parse; reporting no creation time",
                    &[("name", &name), ("zone", &zone), ("creationTimestamp", ts)],
                );
                String::new()
            }
        },
    };
    Instance {
        provider_id: format_id(&zone, &name),
        name,
        uid: text(&instance["labels"][LABEL_UID]),
        installation: text(&instance["labels"][LABEL_INSTALLATION]),
        state,
        ip: match state {
            InstanceState::Running => ip,
            _ => None,
        },
        created_at,
    }
}

/// RFC 3339 with any offset and fraction (the API writes `2026-01-01T04:05:06.789-08:00`)
/// to UTC seconds (`2026-01-01T12:05:06Z`). None when it does not parse.
pub fn normalize_timestamp(s: &str) -> Option<String> {
    let secs = parse_rfc3339(s)?;
    Some(format_rfc3339(secs))
}

pub use guest_sdk::time::{format_rfc3339, parse_rfc3339};
