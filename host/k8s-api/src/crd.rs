//! The custom resources: Proxy (group crawl.example.com, version v1alpha1, so manifests of the
//! seeds' operator keep working), ProxyPool and ProviderHealth. Generated into schemas/crds/ by a test
//! that fails when the checked-in files are stale.

use egress_core::pool::{PoolPlacement, PoolStatus, PoolTemplate, Rotation, Strategy};
use egress_core::{Placement, ProxyStatus};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use egress_core::proxy::SecretKeyRef;

/// A request for one egress proxy.
// kube's printcolumn(...) repeats `type_ = ...` per column, which clippy reads as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "Proxy",
    namespaced,
    status = "ProxyStatus",
    shortname = "px",
    category = "egress",
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "IP", type_ = "string", json_path = ".status.ip"),
    printcolumn(name = "Egress IP", type_ = "string", json_path = ".status.egressIP"),
    printcolumn(
        name = "Verified",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"EgressVerified\")].status"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
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
    /// Inline cloud-init user data. Prefer cloudInitSecretRef: a Proxy's spec is readable by
    /// anyone who can list Proxies. With neither, kvm, kvm2 and gcp instances get a generated
    /// cloud-init that installs Squid on `port` for the provider's allowedSourceCIDRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<String>,
    /// Cloud-init user data from a Secret in the Proxy's namespace, read at create time. The
    /// Secret must carry the label `egress-proxies.crawl.example.com/cloud-init: "true"`, so a
    /// Proxy can copy into user data only what its namespace marked for the purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_secret_ref: Option<SecretKeyRef>,
}

fn default_port() -> u16 {
    egress_core::proxy::DEFAULT_PORT
}

/// `replicas` Proxies spread over providers by weight, rolled on a template or provider change
/// and rotated by age without dropping below `replicas - maxUnavailable` Ready. Its Proxies
/// are named `<pool>-<suffix>`, labelled `crawl.example.com/pool=<pool>` and owned by it.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "ProxyPool",
    namespaced,
    status = "PoolStatus",
    // `kubectl scale proxypool` and a HorizontalPodAutoscaler: replicas through the scale
    // subresource, with the selector of the pool's Proxies (an autoscaler requires one).
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    shortname = "pxpool",
    category = "egress",
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Avail-replicas",
        type_ = "integer",
        json_path = ".status.availableReplicas"
    ),
    printcolumn(
        name = "Egress-IPs",
        type_ = "integer",
        json_path = ".status.distinctEgressIPs"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        json_path = ".status.updatedReplicas"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolSpec {
    /// How many proxies the pool keeps (at most the operator's `--max-replicas`, default
    /// 1000).
    #[schemars(range(max = egress_core::pool::MAX_REPLICAS_CEILING))]
    pub replicas: u32,
    /// What each of its Proxies is, but for the provider (from the placement).
    #[serde(default)]
    pub template: PoolTemplate,
    /// Where the proxies go, spread by weight (round robin over a placement's zones).
    #[schemars(length(max = egress_core::pool::MAX_PLACEMENTS))]
    pub placements: Vec<PoolPlacement>,
    /// Replace each proxy once it is this old (± jitter, fixed per proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<Rotation>,
    /// maxSurge (default 25%) and maxUnavailable (default 0), numbers or percentages.
    #[serde(default)]
    #[schemars(schema_with = "strategy_schema")]
    pub strategy: Strategy,
    /// Nothing is created or deleted while paused; the status is still written.
    #[serde(default)]
    pub paused: bool,
    /// How long a placement's creates may keep failing on quota or capacity before its share
    /// is lent to the other placements (a permanent failure lends it at once); default 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_after: Option<String>,
    /// Count only members with an egress address of their own: a member whose egress address
    /// an older member already has is not available and is replaced, and a placement that
    /// keeps giving shared addresses (Pods behind one NAT) is degraded and lends its share.
    /// Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distinct_egress: bool,
    /// How its proxies are leased (`POST /v1/leases`): maxShared (shared leases a proxy takes
    /// at once, default 4), maxTTL (default 1h), defaultTTL (default 10m), cordonAfterBans
    /// (holders reporting `banned` that cordon a proxy, default 3) and maxPerHolder (the most
    /// proxies one holder holds at once, default 50%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "leases_schema")]
    pub leases: Option<egress_core::lease::LeasePolicy>,
    /// How long a leased member that rotation, a rollout, a scale-down or a cordon retires may
    /// drain (out of discovery, no new leases, its replacement made first) before it goes
    /// although a lease still holds it; default 30m. A member that fails its check is not
    /// drained: it goes at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<String>,
    /// How a member a target bans is kept from that target, and from it only: `cooldown`
    /// (default 5m, doubling per quarantine in a row up to `maxCooldown`, default 6h),
    /// `maxQuarantinedPercent` (the most of the pool one target quarantines at once, default
    /// 50), `replaceAfterTargets` (distinct targets at once that replace a member, default 5;
    /// 0 never) and `signalStatuses` (a plain request's answers the gateway reads as a ban,
    /// default 403, 429, 503).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<egress_core::target::QuarantinePolicy>,
    /// How often and how many at once the pool's egress addresses start tunnels and requests
    /// to a target, enforced by the gateway: `maxWait` (how long a request may wait for budget
    /// before a 429, default 0s, at most 30s) and `targets`, rules of which the first whose
    /// `match` fits the request's host applies (`example.com`, `*.example.com`, `*`; at most
    /// 64), each with `perAddress` (per member and target) and optionally `perPool` (per pool
    /// and target) budgets: `every` (least time between two starts) and `concurrency` (most in
    /// flight at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub politeness: Option<egress_core::politeness::PolitenessPolicy>,
    /// Follow the crawlers' demand instead of `replicas`: `minReplicas` (may be 0),
    /// `maxReplicas`, `tunnelsPerMember` (tunnels in flight at the gateways one member is sized
    /// for, default 16), `leasesPerMember` (default 1), `idleAfter` (how long the demand stays
    /// below the size before members go, default 10m) and `coldStartWait` (how long the
    /// gateway holds a tunnel and the lease API a lease request while no member is free,
    /// default 2m, at most 10m). For an external autoscaler (KEDA, an HPA) leave it out and
    /// let it write `replicas` through the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<egress_core::autoscale::AutoscalePolicy>,
}

/// maxSurge and maxUnavailable as Kubernetes' IntOrString: a structural schema cannot hold
/// the untagged enum's anyOf of two types.
fn strategy_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let int_or_string = |what: &str| {
        serde_json::json!({
            "description": what,
            "x-kubernetes-int-or-string": true,
        })
    };
    schemars::json_schema!({
        "type": "object",
        "properties": {
            "maxSurge": int_or_string("Proxies above replicas while replacing (a number or a percentage, rounded up; default 25%)."),
            "maxUnavailable": int_or_string("Ready proxies below replicas a replacement may cost (rounded down; default 0)."),
        },
    })
}

/// `spec.leases` as the core types it, but `maxPerHolder` as Kubernetes' IntOrString, which a
/// structural schema can hold (the untagged enum's anyOf of two types it cannot).
fn leases_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <egress_core::lease::LeasePolicy as JsonSchema>::json_schema(generator);
    if let Some(per_holder) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("maxPerHolder"))
    {
        *per_holder = serde_json::json!({
            "description": "The most of the pool's proxies one holder holds at once, over all its leases, exclusive or shared (a number, or a percentage of replicas rounded up; at least 1; default 50%).",
            "default": "50%",
            "x-kubernetes-int-or-string": true,
        });
    }
    schema.insert("nullable".into(), true.into());
    schema
}

impl ProxyPool {
    /// The domain view the shared pool decisions work on.
    pub fn to_core(&self) -> egress_core::pool::ProxyPool {
        egress_core::pool::ProxyPool {
            api_version: egress_core::proxy::API_VERSION.into(),
            kind: egress_core::pool::KIND.into(),
            metadata: egress_core::proxy::ObjectMeta {
                name: self.metadata.name.clone().unwrap_or_default(),
                namespace: self.metadata.namespace.clone().unwrap_or_default(),
                uid: self.metadata.uid.clone(),
                generation: self.metadata.generation,
                ..Default::default()
            },
            spec: egress_core::pool::PoolSpec {
                replicas: self.spec.replicas,
                template: self.spec.template.clone(),
                placements: self.spec.placements.clone(),
                rotation: self.spec.rotation.clone(),
                strategy: self.spec.strategy.clone(),
                paused: self.spec.paused,
                spill_after: self.spec.spill_after.clone(),
                distinct_egress: self.spec.distinct_egress,
                leases: self.spec.leases.clone(),
                drain_timeout: self.spec.drain_timeout.clone(),
                quarantine: self.spec.quarantine.clone(),
                politeness: self.spec.politeness.clone(),
                autoscale: self.spec.autoscale.clone(),
            },
            status: None,
        }
    }
}

/// The health of one configured provider, refreshed by a periodic check.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "crawl.example.com",
    version = "v1alpha1",
    kind = "ProviderHealth",
    status = "ProviderHealthStatus",
    category = "egress",
    printcolumn(name = "Type", type_ = "string", json_path = ".status.type"),
    printcolumn(name = "Healthy", type_ = "string", json_path = ".status.healthy"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHealthSpec {}

/// Written by two hands: the monitor (type, module, health, targets, egress) and the sweeper
/// (the `Swept` condition), each with a merge patch of its own fields, so every field may be
/// absent until its writer has run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct ProviderHealthStatus {
    /// The provider's type (kubernetes, gcp, kvm, kvm2, or a module's).
    #[serde(rename = "type")]
    pub type_: String,
    /// sha256 of the module serving it.
    pub module: String,
    /// Where the module serving it came from, when that is a registry: the reference pinned to
    /// the manifest's digest (`oci://REGISTRY/REPO:TAG@sha256:…` for an entry naming a tag, as
    /// the tag was resolved at load).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_ref: Option<String>,
    /// "True" when every target is Healthy.
    pub healthy: String,
    /// Each endpoint the provider reaches (an API server, a Compute API, a hypervisor) and
    /// whether it answers.
    pub targets: Vec<TargetHealth>,
    /// The egress check of this provider's proxies, where the providers config has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<ProviderEgress>,
    /// `Swept`: whether the last sweep of this provider's instances listed them all; False
    /// with the reason (MemoryLimit, Trap, Timeout, the module's own) while it cannot, and the
    /// sweeper retries it with backoff.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<egress_core::proxy::Condition>,
}

/// What the egress check saw of one provider's proxies, as the leader last checked them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderEgress {
    /// Proxies whose last check ran (a checker that could not reach the echo is not counted).
    pub checked: u32,
    /// Of those, verified by their last check.
    pub verified: u32,
    /// Of those, failing their last check.
    pub failing: u32,
    /// "True" while failing proxies are replaced; "False" when more than maxUnhealthy of them
    /// fail at once (an outage: replacement stops until they recover).
    pub replacing: String,
    /// Why, for a person.
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetHealth {
    /// The endpoint's name, as the provider's health check calls it.
    pub target: String,
    /// Where it is reached (a URL, or user@host:port over SSH).
    pub address: String,
    /// `Healthy`, or why not: Unreachable, Unauthorized, Forbidden, Timeout, ...
    pub reason: String,
    /// Why, for a person.
    pub message: String,
    /// What the health check reported besides, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
    /// RFC 3339.
    pub last_checked: String,
}

impl Proxy {
    /// The domain view the shared decisions work on, labels and annotations included: the
    /// decisions read them (a pool's member, by its pool label, leaves a spec edit its
    /// instance cannot follow to its pool's budget), as they do in the CLI.
    pub fn to_core(&self) -> egress_core::Proxy {
        egress_core::Proxy {
            api_version: egress_core::proxy::API_VERSION.into(),
            kind: egress_core::proxy::KIND.into(),
            metadata: egress_core::proxy::ObjectMeta {
                name: self.metadata.name.clone().unwrap_or_default(),
                namespace: self.metadata.namespace.clone().unwrap_or_default(),
                uid: self.metadata.uid.clone(),
                generation: self.metadata.generation,
                labels: self.metadata.labels.clone().unwrap_or_default(),
                annotations: self.metadata.annotations.clone().unwrap_or_default(),
            },
            spec: egress_core::ProxySpec {
                provider: self.spec.provider.clone(),
                port: self.spec.port,
                placement: self.spec.placement.clone(),
                cloud_init: self.spec.cloud_init.clone(),
                cloud_init_secret_ref: self.spec.cloud_init_secret_ref.clone(),
            },
            status: None,
        }
    }
}
