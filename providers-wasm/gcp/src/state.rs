//! A Compute instance to a contract instance: the seeds' state table, the address the config
//! asks for (external NAT IP, or the NIC's internal one), the marks, and the creation time.

use crate::id::format_id;
use guest_sdk::view::{Arr, Obj, Text};
use guest_sdk::{Host, Instance, InstanceState, Level};
use serde::Deserialize;
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

/// The fields of a Compute instance a provider reads, parsed straight from the API's answer
/// (see `guest_sdk::view`): a field of another type reads as absent, as indexing a `Value`
/// does.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InstanceView {
    pub name: Text,
    pub zone: Text,
    pub status: Text,
    pub creation_timestamp: Text,
    pub labels: Obj<Marks>,
    pub network_interfaces: Arr<Obj<Nic>>,
}

/// The labels that mark a proxy's instance: `insert::LABEL_MANAGED`, `LABEL_UID` and
/// `LABEL_INSTALLATION`, spelled out because an attribute takes no constant; a test holds
/// them equal.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Marks {
    #[serde(rename = "egress-proxies-managed")]
    pub managed: Text,
    #[serde(rename = "egress-proxies-uid")]
    pub uid: Text,
    #[serde(rename = "egress-proxies-installation")]
    pub installation: Text,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Nic {
    #[serde(rename = "networkIP")]
    pub network_ip: Text,
    pub access_configs: Arr<Obj<AccessConfig>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AccessConfig {
    #[serde(rename = "natIP")]
    pub nat_ip: Text,
}

impl InstanceView {
    /// The view of an instance an answer already parsed as a `Value` holds (a list page, an
    /// adopted instance). A lenient view reads any value, so this cannot fail.
    pub fn of(v: &Value) -> Self {
        Self::deserialize(v).unwrap_or_default()
    }
}

/// The proxy's address: the first NIC's external NAT IP, or its internal IP in internal mode.
pub fn address(instance: &InstanceView, internal_ip: bool) -> Option<String> {
    let nic = instance.network_interfaces.first().map(|n| &n.0);
    let ip = if internal_ip {
        nic.and_then(|n| n.network_ip.as_deref())
    } else {
        nic.and_then(|n| n.access_configs.first())
            .and_then(|a| a.0.nat_ip.as_deref())
    };
    ip.filter(|s| !s.is_empty()).map(str::to_string)
}

/// The last segment of a resource URL (`.../zones/europe-west1-b` gives `europe-west1-b`).
pub fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

pub fn to_instance(host: &dyn Host, instance: &InstanceView, internal_ip: bool) -> Instance {
    let name = instance.name.or_empty().to_string();
    let zone = last_segment(instance.zone.or_empty()).to_string();
    let ip = address(instance, internal_ip);
    let state = map_state(instance.status.or_empty(), ip.is_some());
    let created_at = match instance.creation_timestamp.as_deref() {
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
    let marks = &instance.labels.0;
    Instance {
        provider_id: format_id(&zone, &name),
        name,
        uid: marks.uid.or_empty().to_string(),
        installation: marks.installation.or_empty().to_string(),
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
