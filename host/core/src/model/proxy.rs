//! The Proxy object: what a user asks for, and the status the reconciler reports.

pub use crate::model::instance::Placement;

use crate::model::instance::{CreateRequest, InstanceState, OwnerReference};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const API_VERSION: &str = "crawl.example.com/v1alpha1";
pub const KIND: &str = "Proxy";
pub const DEFAULT_PORT: u16 = 3128;

/// A Proxy manifest as written in a proxies file or stored in the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Proxy {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ProxySpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ProxyStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Derived from namespace/name when absent, so plans are stable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

fn default_namespace() -> String {
    "default".to_string()
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxySpec {
    /// The name of a provider entry in the providers config.
    pub provider: String,
    /// The port Squid listens on.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Where the instance runs; what each field means is the provider's (a kubernetes
    /// provider ignores machineType and image).
    #[serde(default)]
    pub placement: Placement,
    /// Inline cloud-init user data. Secret: never logged. With neither this nor
    /// `cloudInitSecretRef`, kvm, kvm2 and gcp instances get a generated cloud-init that
    /// installs Squid on `port` for the provider's allowedSourceCIDRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<String>,
    /// Cloud-init user data read from a Secret in the Proxy's namespace at create time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_secret_ref: Option<SecretKeyRef>,
}

fn default_port() -> u16 {
    DEFAULT_PORT
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name, in the Proxy's namespace.
    pub name: String,
    /// The key of the Secret's data that holds the user data.
    pub key: String,
}

/// What the reconciler reports. Also the record the CLI keeps in its state file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyStatus {
    /// The instance's identity at its provider, in the provider's own form (a kubernetes
    /// Pod's `namespace/name`, a VM's zone and name, a domain's host and name).
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// The instance's name at its backend (a Pod, a VM, a libvirt domain), derived from the
    /// Proxy's UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_name: Option<String>,
    /// The instance's state as the provider last reported it: Provisioning, Running,
    /// Stopped or Terminated (a stopped or terminated instance is replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<InstanceState>,
    /// The address crawlers reach the proxy at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// The generation of the spec this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The revision of the provider entry the last permanent failure was seen with, so a
    /// change of the providers config releases the hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_revision: Option<String>,
    /// Ready (verified where the egress check runs), EgressVerified and the provider's
    /// conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The address the echo saw the last verified check come from.
    #[serde(default, rename = "egressIP", skip_serializing_if = "Option::is_none")]
    pub egress_ip: Option<String>,
    /// RFC 3339: the last egress check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_checked_at: Option<String>,
    /// RFC 3339: the last check that verified the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_verified_at: Option<String>,
    /// The last check's round trip through the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_latency_ms: Option<u64>,
    /// Failed checks in a row.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_failures: u32,
    /// Other Ready Proxies (`namespace/name`, sorted, at most 10) whose last verified check
    /// came from the same egress address (Pods behind one NAT): a crawler that buys distinct
    /// IPs uses one of them. As of this Proxy's last step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_shared_with: Vec<String>,
    /// RFC 3339: when the instance was first seen running with its address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_since: Option<String>,
    /// The instance is to be replaced, and why (the egress check decided it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_requested: Option<String>,
    /// What the instance was created with: the port it serves and where it runs, whatever the
    /// spec says now. Discovery advertises this port; a spec that no longer matches it
    /// replaces the instance (a pool's member: through its pool's budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_spec: Option<InstanceSpec>,
    /// The leases holding this proxy (`crate::lease`). Written only by the lease API, each
    /// write on the condition that the Proxy is still the version it read, so two writers
    /// never hand it to two exclusive holders; the controllers never write it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<crate::model::lease::LeaseBinding>,
    /// How many holders reported that a target banned the proxy's address (each once); at the
    /// pool's `leases.cordonAfterBans` the proxy is cordoned. Written with the leases.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ban_reports: u32,
    /// Those reports: who (a digest of the holder, naming no one) and when, the newest 32. A
    /// holder's second report of the proxy is not counted again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ban_reporters: Vec<crate::model::lease::BanReport>,
    /// The targets that refused the proxy's address lately (`crate::target`): new traffic for
    /// each avoids it until the record's `until`, within its pool's cap per target. Written
    /// with the leases, by ban reports naming the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantines: Vec<crate::model::target::Quarantine>,
}

/// The status fields the lease API owns: a controller's status write leaves them out, so it
/// can never put back a binding the lease API has just changed.
pub const LEASE_STATUS_FIELDS: [&str; 4] = ["leases", "banReports", "banReporters", "quarantines"];

/// The part of a Proxy's spec an instance cannot follow once created.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstanceSpec {
    /// The port the instance's Squid listens on.
    pub port: u16,
    /// Where the instance was placed.
    #[serde(default, skip_serializing_if = "Placement::is_empty")]
    pub placement: Placement,
}

impl InstanceSpec {
    pub fn of(spec: &ProxySpec) -> Self {
        Self {
            port: spec.port,
            placement: spec.placement.clone(),
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A condition following Kubernetes conventions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Condition {
    /// What the condition is about (Ready, EgressVerified, Available, Progressing, ...).
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    /// Why, in one CamelCase word.
    pub reason: String,
    /// Why, for a person.
    pub message: String,
    /// The generation of the spec the condition was set against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// RFC 3339; set when the status changes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_time: String,
}

impl Proxy {
    /// The UID, derived from namespace/name when the manifest has none.
    pub fn uid(&self) -> String {
        self.metadata.uid.clone().unwrap_or_else(|| {
            crate::model::name::derived_uid(&self.metadata.namespace, &self.metadata.name)
        })
    }

    pub fn generation(&self) -> i64 {
        self.metadata.generation.unwrap_or(1)
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The port its instance serves: what the instance was created with, else the spec's.
    pub fn served_port(&self, status: &ProxyStatus) -> u16 {
        status
            .instance_spec
            .as_ref()
            .map_or(self.spec.port, |i| i.port)
    }

    /// Owned by a ProxyPool (its label): the pool, not the Proxy, replaces its instance when
    /// the spec changes under it.
    pub fn pool(&self) -> Option<&str> {
        self.metadata
            .labels
            .get(crate::model::labels::POOL_LABEL)
            .map(String::as_str)
    }
}

impl ProxyStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Sets a condition, keeping its transition time when the status does not change.
    pub fn set_condition(&mut self, mut c: Condition, now: &str) {
        match self.conditions.iter_mut().find(|x| x.type_ == c.type_) {
            Some(existing) => {
                c.last_transition_time = if existing.status == c.status {
                    existing.last_transition_time.clone()
                } else {
                    now.to_string()
                };
                *existing = c;
            }
            None => {
                c.last_transition_time = now.to_string();
                self.conditions.push(c);
            }
        }
    }
}

/// Problems found in a Proxy manifest, each naming the field.
pub fn validate(proxy: &Proxy) -> Vec<String> {
    let mut problems = Vec::new();
    if proxy.api_version != API_VERSION {
        problems.push(format!(
            "apiVersion: expected {API_VERSION}, got {:?}",
            proxy.api_version
        ));
    }
    if proxy.kind != KIND {
        problems.push(format!("kind: expected {KIND}, got {:?}", proxy.kind));
    }
    if proxy.metadata.name.is_empty() {
        problems.push("metadata.name: must not be empty".to_string());
    }
    if proxy.spec.provider.is_empty() {
        problems.push("spec.provider: must not be empty".to_string());
    }
    if proxy.spec.port == 0 {
        problems.push("spec.port: must be between 1 and 65535".to_string());
    }
    if proxy.spec.cloud_init.is_some() && proxy.spec.cloud_init_secret_ref.is_some() {
        problems.push("spec: cloudInit and cloudInitSecretRef are exclusive".to_string());
    }
    problems
}

// Here rather than in instance.rs so that instance.rs, below the Proxy, names no Proxy.
impl CreateRequest {
    /// The request for a Proxy, with the cloud-init resolved by the caller.
    pub fn for_proxy(proxy: &Proxy, installation: &str, cloud_init: Option<String>) -> Self {
        let uid = proxy.uid();
        Self {
            name: crate::model::name::instance_name(&uid),
            namespace: proxy.metadata.namespace.clone(),
            uid: uid.clone(),
            port: proxy.spec.port,
            placement: proxy.spec.placement.clone(),
            cloud_init,
            installation: installation.to_string(),
            owner: Some(OwnerReference {
                api_version: API_VERSION.to_string(),
                kind: KIND.to_string(),
                name: proxy.metadata.name.clone(),
                uid,
            }),
            htpasswd: None,
        }
    }
}
