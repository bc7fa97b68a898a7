//! The ProxyPool: its spec and status as stored, the members a decision reads, and what a
//! decision returns. The decisions themselves are in [`crate::decide::pool`].

use crate::config::IntOrPercent;
use crate::model::proxy::{Condition, Placement, SecretKeyRef};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const KIND: &str = "ProxyPool";

/// A ProxyPool manifest as written in a proxies file or stored in the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyPool {
    pub api_version: String,
    pub kind: String,
    pub metadata: crate::model::proxy::ObjectMeta,
    pub spec: PoolSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PoolStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolSpec {
    /// How many proxies the pool keeps (at most `--max-replicas`, default 1000).
    #[schemars(range(max = MAX_REPLICAS_CEILING))]
    pub replicas: u32,
    /// What each of its Proxies is, but for the provider (from the placement).
    #[serde(default)]
    pub template: PoolTemplate,
    /// Where the proxies go, spread by weight.
    #[schemars(length(max = MAX_PLACEMENTS))]
    pub placements: Vec<PoolPlacement>,
    /// Replace each proxy once it is this old (± jitter, fixed per proxy, so a wave of
    /// rotations spreads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<Rotation>,
    #[serde(default)]
    pub strategy: Strategy,
    /// Nothing is created or deleted while paused; the status is still written.
    #[serde(default)]
    pub paused: bool,
    /// How long a placement's creates may keep failing on quota or capacity before its share
    /// is lent to the other placements (a permanent failure lends it at once); default 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_after: Option<String>,
    /// Count only members with an egress address of their own: a member whose egress
    /// address an older member already has is not available and is replaced; a placement
    /// that gives shared addresses SHARED_EGRESS_LIMIT times in a row (Pods behind one NAT) is
    /// degraded and lends its share to the others. Off by default: a pool of one cluster
    /// behind one NAT still works, and the sharing shows in `status.distinctEgressIPs` and in
    /// discovery either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub distinct_egress: bool,
    /// How its proxies are leased (`POST /v1/leases`): the shared bound, the longest ttl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<crate::model::lease::LeasePolicy>,
    /// How long a leased member that rotation, a rollout, a scale-down or a cordon retires may
    /// drain (out of discovery, no new leases, its replacement made first) before it goes
    /// although a lease still holds it; default 30m. A member that fails its check is not
    /// drained: it goes at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<String>,
    /// How a member a target bans is kept from that target (and only from it): cooldowns, the
    /// cap per target, when many targets' bans replace it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<crate::model::target::QuarantinePolicy>,
    /// How often and how many at once its egress addresses start tunnels and requests to a
    /// target, enforced by the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub politeness: Option<crate::model::politeness::PolitenessPolicy>,
    /// Follow the crawlers' demand (tunnels in flight and waiting at the gateways, leases held
    /// and asked for) between `minReplicas`, which may be 0, and `maxReplicas`. While set,
    /// `replicas` is not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<crate::model::autoscale::AutoscalePolicy>,
}

impl PoolSpec {
    /// `spec.quarantine`, or its defaults.
    pub fn quarantine_policy(&self) -> crate::model::target::QuarantinePolicy {
        self.quarantine.clone().unwrap_or_default()
    }

    /// `spec.leases`, or its defaults.
    pub fn lease_policy(&self) -> crate::model::lease::LeasePolicy {
        self.leases.clone().unwrap_or_default()
    }

    /// The most members the pool may have: `replicas`, or an autoscaled pool's
    /// `maxReplicas` (what its budgets and a holder's share are of).
    pub fn most_replicas(&self) -> u32 {
        self.autoscale
            .as_ref()
            .map_or(self.replicas, |a| a.max_replicas)
    }
}

/// The pool's `drainTimeout`, parsed (its default when absent or unreadable).
pub fn drain_timeout(s: &PoolSpec) -> Duration {
    s.drain_timeout
        .as_deref()
        .and_then(|a| crate::config::parse_duration(a).ok())
        .unwrap_or(crate::model::lease::DEFAULT_DRAIN_TIMEOUT)
}

/// Proxies a lease lost, kept in the pool's status this long for their holders to read.
pub const LOST_KEPT: Duration = Duration::from_secs(3600);

/// ... and at most this many.
pub const LOST_KEPT_MAX: usize = 64;

/// With `distinctEgress`, how many members in a row a placement may give an address an
/// older member has before it is degraded (its share lent to the others, one probe kept,
/// replaced with the failed-member backoff).
pub const SHARED_EGRESS_LIMIT: u32 = 3;

/// The most replicas a pool may ask for unless the operator's or the CLI's `--max-replicas`
/// says otherwise: a typo of a few zeros is refused, not planned.
pub const DEFAULT_MAX_REPLICAS: u32 = 1000;

/// The most `--max-replicas` may allow, and the CRD's maximum of `spec.replicas`.
pub const MAX_REPLICAS_CEILING: u32 = 100_000;

/// The most placements a pool has.
pub const MAX_PLACEMENTS: usize = 32;

/// The most zones a placement spreads over.
pub const MAX_ZONES: usize = 64;

/// The most Proxies one decision creates, whatever the spec asks: the next decision, woken by
/// their creation, makes more. A decision's work is bounded by this and by the members that
/// exist, never by `replicas`.
pub const CREATES_PER_PASS: usize = 100;

/// The default of `spec.spillAfter`.
pub const DEFAULT_SPILL_AFTER: Duration = Duration::from_secs(600);

/// The first wait before the pool replaces a member held in a permanent failure; it doubles
/// with each failure of the placement in a row, up to [`FAILED_REPLACEMENT_MAX`].
pub const FAILED_REPLACEMENT_BASE: Duration = Duration::from_secs(60);

pub const FAILED_REPLACEMENT_MAX: Duration = Duration::from_secs(1800);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolTemplate {
    /// The port each Proxy's Squid listens on (default 3128).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Placement defaults; a placement's own fields win.
    #[serde(default)]
    pub placement: Placement,
    /// Secret: never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<String>,
    /// Cloud-init user data from a Secret in the pool's namespace, read when each Proxy is
    /// created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init_secret_ref: Option<SecretKeyRef>,
}

fn default_port() -> u16 {
    crate::model::proxy::DEFAULT_PORT
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolPlacement {
    /// A provider entry's name.
    pub provider: String,
    /// Its share of the replicas, relative to the other placements' (default 1).
    #[serde(default = "equal_weight")]
    pub weight: u32,
    /// Zones its proxies are spread over, round robin; empty: the template's zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ZONES))]
    pub zones: Vec<String>,
    /// The machine type of its Proxies; empty: the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// The image of its Proxies; empty: the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// At most this many of the pool's proxies here; the rest goes to the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<u32>,
}

/// Placements share a pool equally unless weighted.
fn equal_weight() -> u32 {
    1
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rotation {
    /// e.g. `24h`.
    pub max_age: String,
    /// e.g. `2h`: each proxy's age limit is moved by up to this much, either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Strategy {
    /// Proxies above `replicas` while replacing (a number or a percentage, rounded up;
    /// default 25%).
    #[serde(default = "default_surge")]
    pub max_surge: IntOrPercent,
    /// Ready proxies below `replicas` a replacement may cost (rounded down; default 0).
    #[serde(default = "default_unavailable")]
    pub max_unavailable: IntOrPercent,
}

impl Default for Strategy {
    fn default() -> Self {
        Self {
            max_surge: default_surge(),
            max_unavailable: default_unavailable(),
        }
    }
}

fn default_surge() -> IntOrPercent {
    IntOrPercent::Percent("25%".into())
}

fn default_unavailable() -> IntOrPercent {
    IntOrPercent::Int(0)
}

/// What the pool controller last saw of the pool's Proxies and decided.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolStatus {
    /// The generation of the spec this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Proxies the pool has (not being deleted).
    #[serde(default)]
    pub replicas: u32,
    /// Ready ones (verified where the egress check is configured), none cordoned: what
    /// discovery lists.
    #[serde(default)]
    pub ready_replicas: u32,
    /// Ones that count toward the floor: verified and not failed past the egress check's
    /// failureThreshold (Ready where no check is configured); a cordoned one among them until
    /// it is replaced (it still serves its holders).
    #[serde(default)]
    pub available_replicas: u32,
    /// Ones of the current template and provider revision, younger than maxAge.
    #[serde(default)]
    pub updated_replicas: u32,
    /// How many different egress addresses the available members have: what a crawler that
    /// buys distinct IPs gets (Pods behind one NAT count once).
    #[serde(
        default,
        rename = "distinctEgressIPs",
        skip_serializing_if = "is_zero_u32"
    )]
    pub distinct_egress_ips: u32,
    /// How many member names the pool has handed out: the next Proxy is named from the next
    /// number, so no name repeats within the pool's life.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub member_serial: u64,
    /// The label selector of the pool's Proxies, serialised (`crawl.example.com/pool=NAME`):
    /// the scale subresource's, which `kubectl scale` shows and a HorizontalPodAutoscaler
    /// requires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Available (the floor holds), Progressing (the rollout: Complete, Paused, or what it
    /// waits for) and PlacementDegraded (a placement that cannot create, and why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Each placement's counts and share, in the spec's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<PlacementStatus>,
    /// Members a lease holds now (they count toward the floor while they serve).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub leased_replicas: u32,
    /// Members draining: retired but kept for their leases, until they end or drainTimeout
    /// (they count toward neither replicas nor the floor).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub draining_replicas: u32,
    /// Proxies leases lost in the last hour, so their holders learn why: a member that failed
    /// its check (it goes at once), a drain that reached drainTimeout, an instance replaced
    /// under a lease, a Proxy deleted under one. Written before the pool deletes the member;
    /// newest last, at most LOST_KEPT_MAX.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_leases: Vec<crate::model::lease::LostProxy>,
    /// The targets (sites, by registrable domain) that quarantine members now: the most
    /// signalled first, at most TARGETS_SHOWN; the rest are counted in `otherTargets`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetStatus>,
    /// Targets that quarantine members now beyond those listed in `targets`.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub other_targets: u32,
    /// With `spec.autoscale`: the size the demand asks for now, and since when it has been
    /// below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<crate::model::autoscale::AutoscaleStatus>,
    /// The exclusive member-seconds each holder's leases took today, for the
    /// `memberHoursPerDay` quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_usage: Option<crate::model::quota::LeaseUsage>,
}

/// Targets a pool's status lists at most (`status.targets`): a crawler's list of sites is
/// unbounded, a status is not.
pub const TARGETS_SHOWN: usize = 20;

/// One target as the pool's status shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    /// The registrable domain (or address) of the sites it covers.
    pub target: String,
    /// Members whose record for it holds now.
    pub signalled_replicas: u32,
    /// Of those, the ones routing and discovery keep from it (within
    /// `quarantine.maxQuarantinedPercent`).
    pub quarantined_replicas: u32,
    /// It signalled past the cap: some of its records quarantine no one, and its traffic
    /// reaches members it refused (TargetBlocked).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cap_reached: bool,
}

impl PoolStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PlacementStatus {
    /// The placement's provider entry.
    pub provider: String,
    /// Its Proxies, not being deleted.
    pub replicas: u32,
    /// Its Ready ones, none cordoned.
    pub ready_replicas: u32,
    /// Its ones that count toward the pool's floor.
    #[serde(default)]
    pub available_replicas: u32,
    /// Its share of the replicas now: by weight, less what it lends while degraded, plus
    /// what it borrows from degraded placements.
    #[serde(default)]
    pub target_replicas: u32,
    /// RFC 3339: since when its creates fail (a permanent failure, or quota or capacity for
    /// longer than spillAfter); its share is lent to the others until a member of it serves
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded_since: Option<String>,
    /// Members held in a permanent failure the pool replaced in a row (the backoff of the
    /// next replacement doubles with each).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub failed_replacements: u32,
    /// With `distinctEgress`: members of it replaced in a row because an older member had
    /// their egress address. At SHARED_EGRESS_LIMIT it is degraded; a member of it with an
    /// address of its own, newer than the last one counted, clears the count.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub shared_egress_replacements: u32,
    /// The serial (the number its name was made from) of the last member counted in
    /// sharedEgressReplacements, so a member is counted once however many decisions see it,
    /// and the members made after it are known exactly, however many were made within one
    /// second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_egress_counted_serial: Option<u64>,
    /// Read and dropped: an earlier status's creation time of the last member counted, which
    /// could not order members made within one second.
    #[serde(default, rename = "sharedEgressCountedTo", skip_serializing)]
    #[schemars(skip)]
    pub legacy_shared_egress_counted_to: Option<String>,
    /// The egress addresses its members were replaced for sharing, while the run of them
    /// lasts: a member on one of them is no proof the placement now gives addresses of their
    /// own (the holder of a NAT address may just have failed a check, leaving it to the next).
    #[serde(
        default,
        rename = "sharedEgressIPs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub shared_egress_ips: Vec<String>,
    /// The last failure of one of its proxies, if any is failing now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The shortest age limit a rotation may have when no egress check bounds a member's start.
pub const MIN_AGE_LIMIT: Duration = Duration::from_secs(600);

/// One of the pool's Proxies as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Its placement's index (the label), None when it names none that exists.
    pub placement: Option<usize>,
    pub zone: Option<String>,
    /// The revision it was made from (the annotation).
    pub revision: String,
    /// Unix seconds: when the Proxy was created.
    pub created_at: Option<i64>,
    /// Its number in the pool's sequence of names (see [`member_serial`]): the order the
    /// pool made its members in, exact where creation times tie within a second. None for a
    /// name the pool did not make.
    pub serial: Option<u64>,
    /// Unix seconds: when its instance was first seen serving (running with an address).
    pub running_since: Option<i64>,
    /// Counts toward the floor: verified and not failed past the egress check's threshold
    /// (Ready, where no check is configured). Deleting it is a disruption the budget pays for.
    pub available: bool,
    /// In discovery now (Ready True).
    pub ready: bool,
    /// Out of discovery and new leases, to be replaced: a voluntary disruption, so it counts
    /// toward the floor while it serves, and goes (or drains, when leased) only once the
    /// floor allows.
    pub cordoned: bool,
    /// Being deleted already: neither counted nor chosen again.
    pub deleting: bool,
    /// Its instance no longer follows its spec (edited under it): out of date.
    pub drifted: bool,
    /// What the echo saw through it, once verified.
    pub egress_ip: Option<String>,
    /// Why it cannot be created now, if so.
    pub failure: Option<MemberFailure>,
    /// The lease bindings recorded on it, expired ones and ones of a replaced instance
    /// included (the decision judges them against its `now`).
    pub leases: Vec<MemberLease>,
    /// Draining since the pool retired it: Unix seconds of its retirement at the latest, and
    /// why. Neither counted nor chosen again; deleted once its leases end or by then.
    pub retiring: Option<(i64, DeleteReason)>,
    /// Its quarantine records per target (`status.quarantines`), for the pool's view of its
    /// targets.
    pub quarantines: Vec<crate::model::target::Quarantine>,
}

/// A lease binding recorded on a member, as the decisions read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLease {
    pub id: String,
    /// Unix seconds: when it ends unless renewed.
    pub until: i64,
    /// Its holder, as [`crate::model::lease::holder_digest`]: whom a loss is told to.
    pub holder: String,
    /// It holds the instance serving now; false once the instance was replaced under it
    /// (it then holds nothing, and its holder has lost the proxy).
    pub holds: bool,
}

impl MemberLease {
    /// A binding that holds its member until `until`, of holder `holder` (its name).
    pub fn held(id: &str, until: i64, holder: &str) -> Self {
        Self {
            id: id.to_string(),
            until,
            holder: crate::model::lease::holder_digest(holder),
            holds: true,
        }
    }

    pub(crate) fn live(&self, now: i64) -> bool {
        self.until > now
    }
}

impl Member {
    /// Whether a lease holds it at `now`.
    pub fn leased(&self, now: i64) -> bool {
        self.leases.iter().any(|l| l.holds && l.live(now))
    }
}

/// A member's create failing, as its Ready condition says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberFailure {
    pub kind: FailureKind,
    /// Unix seconds: since when (the condition's transition).
    pub since: Option<i64>,
    /// `Reason: message`, for PlacementDegraded.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Held until a change: a permanent failure, or a provider the config no longer has.
    Permanent,
    /// Quota or capacity: retried with backoff.
    Quota,
}

/// Why the pool deletes a Proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeleteReason {
    /// Cordoned: out of discovery, replaced.
    Cordoned,
    /// Of an older template or provider revision, of a placement that is gone, or with a spec
    /// its instance does not follow.
    OutOfDate,
    /// Held in a permanent failure past its backoff: a new member tries instead.
    Failed,
    /// Its placement has more than its share now (a degraded placement took its share back,
    /// or lent it away while this member never served).
    Rebalanced,
    /// Older than maxAge (± its jitter).
    Rotated,
    /// More proxies than replicas.
    ScaledDown,
    /// With `distinctEgress`: an older member egresses from its address.
    SharedEgress,
}

impl DeleteReason {
    /// The reason named `s` ([`Self::as_str`]).
    pub fn parse(s: &str) -> Option<Self> {
        Self::all().into_iter().find(|r| r.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cordoned => "Cordoned",
            Self::OutOfDate => "OutOfDate",
            Self::Failed => "Failed",
            Self::Rebalanced => "Rebalanced",
            Self::Rotated => "Rotated",
            Self::ScaledDown => "ScaledDown",
            Self::SharedEgress => "SharedEgress",
        }
    }

    pub fn all() -> [Self; 7] {
        [
            Self::Cordoned,
            Self::OutOfDate,
            Self::Failed,
            Self::Rebalanced,
            Self::Rotated,
            Self::ScaledDown,
            Self::SharedEgress,
        ]
    }
}

/// A Proxy to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Create {
    pub placement: usize,
    pub zone: Option<String>,
    pub revision: String,
    /// A degraded placement's one member trying, beside replicas and the surge.
    pub probe: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub creates: Vec<Create>,
    pub deletes: Vec<(String, DeleteReason)>,
    /// Leased members to drain rather than delete (a voluntary disruption the budget paid
    /// for, as a deletion): out of discovery and leases now, deleted once their leases end or
    /// at `retire_at`, whichever is first.
    pub drains: Vec<(String, DeleteReason)>,
    /// Unix seconds: when the members drained now retire at the latest (now + drainTimeout).
    pub retire_at: i64,
    pub status: PoolStatus,
    /// When to look again at the latest (the next rotation or failed-member replacement due),
    /// absent other changes.
    pub requeue_after: Option<Duration>,
}
