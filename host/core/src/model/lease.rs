//! Leases as stored on a Proxy and asked for by a holder: bindings, the pool's policy, ban
//! reports, the requests, and their bounds. The decisions are in [`crate::decide::lease`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a lease holds its proxies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum LeaseMode {
    /// The proxy is this lease's alone: no other lease, and out of discovery while held.
    #[default]
    Exclusive,
    /// The proxy is held by at most the pool's `leases.maxShared` shared leases at once, and
    /// no exclusive one.
    Shared,
}

impl LeaseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Exclusive => "Exclusive",
            LeaseMode::Shared => "Shared",
        }
    }
}

/// One lease's hold on one Proxy, as its status records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaseBinding {
    /// The lease's id (the same on every Proxy it holds).
    pub id: String,
    /// Who holds it: the authenticated user that asked (a ServiceAccount's
    /// `system:serviceaccount:NS:NAME`, or a named token's name).
    pub holder: String,
    pub mode: LeaseMode,
    /// RFC 3339: when the lease was granted.
    pub acquired_at: String,
    /// RFC 3339: when it ends unless renewed.
    pub expires_at: String,
    /// How many proxies the lease asked for, so its holder learns when one was lost.
    #[serde(default = "one_proxy")]
    pub count: u32,
    /// The address the proxy had when the lease took it. An instance replaced under the Proxy
    /// (it failed its check) has another: the binding no longer holds, and its holder is told
    /// the proxy was lost rather than handed a new IP in silence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
}

/// A lease takes one proxy unless it asks for more.
fn one_proxy() -> u32 {
    1
}

impl LeaseBinding {
    /// Unix seconds of `expiresAt` (an unreadable one has expired).
    pub fn expires(&self) -> i64 {
        egress_time::parse_rfc3339(&self.expires_at).unwrap_or(i64::MIN)
    }

    pub fn live(&self, now: i64) -> bool {
        self.expires() > now
    }

    /// Whether it holds the instance that serves at `ip` now (the one it was granted on).
    pub fn holds(&self, ip: Option<&str>) -> bool {
        self.ip.as_deref().is_none_or(|granted| Some(granted) == ip)
    }
}

/// Why a binding of a replaced instance ended, as its holder reads it.
pub const INSTANCE_REPLACED: &str =
    "its instance was replaced (it failed its check): the proxy's address changed";

/// A pool's lease settings (`spec.leases`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeasePolicy {
    /// Shared leases a proxy takes at once (default 4).
    #[serde(default = "default_max_shared")]
    pub max_shared: u32,
    /// The longest `ttl` a lease or a renewal may ask for (default 1h).
    #[serde(default = "default_max_ttl", rename = "maxTTL")]
    pub max_ttl: String,
    /// The `ttl` of a lease that asks for none (default 10m).
    #[serde(default = "default_ttl", rename = "defaultTTL")]
    pub default_ttl: String,
    /// How many holders must report a proxy `banned` (each counted once per proxy) before it
    /// is cordoned (taken out of discovery and new leases, and replaced through the pool's
    /// budget); default 3, 0 never, at most 32 (the reports a proxy keeps).
    #[serde(default = "default_cordon_after_bans")]
    pub cordon_after_bans: u32,
    /// The most of the pool's proxies one holder holds at once, over all its leases,
    /// exclusive or shared (a number, or a percentage of replicas rounded up; at least 1);
    /// default 50%, so no one crawler can take a whole shared pool and keep it by renewing.
    #[serde(default = "default_max_per_holder")]
    pub max_per_holder: crate::config::IntOrPercent,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            max_shared: default_max_shared(),
            max_ttl: default_max_ttl(),
            default_ttl: default_ttl(),
            cordon_after_bans: default_cordon_after_bans(),
            max_per_holder: default_max_per_holder(),
        }
    }
}

impl LeasePolicy {
    /// `maxPerHolder` against a pool of `replicas`: a percentage rounded up, and at least 1.
    pub fn per_holder(&self, replicas: u32) -> usize {
        self.max_per_holder.resolve(replicas as usize, true).max(1)
    }
}

fn default_max_shared() -> u32 {
    4
}

fn default_max_ttl() -> String {
    "1h".into()
}

fn default_ttl() -> String {
    "10m".into()
}

fn default_cordon_after_bans() -> u32 {
    3
}

fn default_max_per_holder() -> crate::config::IntOrPercent {
    crate::config::IntOrPercent::Percent("50%".into())
}

/// A holder's report that a target banned a proxy, as the proxy's status keeps it: who and
/// when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BanReport {
    /// The holder, as the first 16 hex digits of the SHA-256 of its name: the status names
    /// no one.
    pub reporter: String,
    /// RFC 3339.
    pub at: String,
}

/// Reports one proxy keeps at most (the newest), and so the largest `cordonAfterBans`.
pub const BAN_REPORTS_KEPT: usize = 32;

/// A holder's ban reports count at most [`BAN_REPORTS_PER_WINDOW`] times per pool in this
/// long: a crawler that reports every proxy it touches cannot vote out a pool's worth at once.
pub const BAN_REPORT_WINDOW: Duration = Duration::from_secs(3600);

pub const BAN_REPORTS_PER_WINDOW: usize = 10;

/// Who holds or held a lease, as a pool's records keep it: the first 16 hex digits of the
/// SHA-256 of the holder's name. Enough to tell one holder's record from another's; it names
/// no one to whoever reads the status.
pub fn holder_digest(holder: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(holder.as_bytes())[..8])
}

/// How long a draining proxy waits for its leases to end before it goes anyway, unless the
/// pool's `spec.drainTimeout` says otherwise.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The most proxies one lease takes.
pub const MAX_COUNT: u32 = 64;

/// Bindings one Proxy records at most (shared leases beyond expired ones); a bound on the
/// status's size whatever `maxShared` says.
pub const MAX_BINDINGS: usize = 32;

/// `POST /v1/leases`, as a crawler sends it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaseRequest {
    pub namespace: String,
    pub pool: String,
    #[serde(default = "one_proxy")]
    pub count: u32,
    #[serde(default)]
    pub mode: LeaseMode,
    /// e.g. `10m`; default the pool's `leases.defaultTTL`, at most its `maxTTL`.
    #[serde(default)]
    pub ttl: Option<String>,
    /// The host the lease is for: proxies its target (its registrable domain) quarantines are
    /// not taken.
    #[serde(default)]
    pub target: Option<String>,
}

/// `POST /v1/leases/{id}/renew`'s body (it may be empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RenewRequest {
    #[serde(default)]
    pub ttl: Option<String>,
}

/// `DELETE /v1/leases/{id}`'s body (it may be empty): how the holder's use went.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseRequest {
    /// `ok` (the default) or `banned`: a target refused the proxy's address. A ban report
    /// counts toward cordoning the proxy (the pool's `leases.cordonAfterBans` holders), once
    /// per holder and proxy and at most [`BAN_REPORTS_PER_WINDOW`] a holder per hour; it
    /// never deletes the proxy on its own. With `target`, the ban quarantines the proxy for
    /// that target only (`crate::target`), and counts toward nothing else.
    #[serde(default)]
    pub outcome: Option<Outcome>,
    /// With `outcome: banned`: the host that refused the proxy; its registrable domain is the
    /// target it is quarantined for.
    #[serde(default)]
    pub target: Option<String>,
}

/// A proxy the lease held and no longer holds, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LostProxy {
    /// The lease's id.
    pub lease: String,
    /// `namespace/name` of the Proxy.
    pub proxy: String,
    /// Why it went (it failed its check; its instance was replaced; it drained past
    /// drainTimeout).
    pub reason: String,
    /// RFC 3339.
    pub at: String,
    /// Whose lease it was, as the first 16 hex digits of the SHA-256 of the holder's name:
    /// only its holder is told, and the status names no one (absent in a record of an
    /// earlier version, which no one is told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    Ok,
    Banned,
}
