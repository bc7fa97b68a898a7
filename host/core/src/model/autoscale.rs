//! `spec.autoscale` of a ProxyPool: a pool that follows its crawlers' demand, down to zero when
//! none is crawling, and what the last decision made of that demand (`status.autoscale`).
//!
//! The demand is what the gateways and the lease API see of the pool: tunnels and plain
//! requests in flight, tunnels held for want of a member (a cold pool), leases held and lease
//! requests waiting. [`crate::decide::autoscale`] turns it into the pool's replicas.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The default of `idleAfter`: how long the demand must stay below the pool's size before it
/// shrinks.
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(600);
/// The default of `coldStartWait`.
pub const DEFAULT_COLD_START_WAIT: Duration = Duration::from_secs(120);
/// The longest `coldStartWait`: a held CONNECT holds a crawler's connection and a slot.
pub const MAX_COLD_START_WAIT: Duration = Duration::from_secs(600);
/// The default of `tunnelsPerMember`.
pub const DEFAULT_TUNNELS_PER_MEMBER: u32 = 16;
/// The default of `leasesPerMember` (an exclusive lease holds its member alone).
pub const DEFAULT_LEASES_PER_MEMBER: u32 = 1;

/// `spec.autoscale`. While set, it decides the pool's size and `spec.replicas` is not read
/// (an external autoscaler writing it through the scale subresource is for a pool without it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AutoscalePolicy {
    /// The fewest members, whatever the demand (default 0: none while no one crawls).
    #[serde(default)]
    pub min_replicas: u32,
    /// The most members, whatever the demand.
    pub max_replicas: u32,
    /// Tunnels and plain requests in flight one member is sized for (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnels_per_member: Option<u32>,
    /// Leases one member is sized for (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases_per_member: Option<u32>,
    /// How long the demand must stay below the pool's size before members go, e.g. `10m`
    /// (default). Only members that serve no lease go, through the drain and the budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_after: Option<String>,
    /// How long the gateway holds a tunnel, and the lease API a lease request, while the
    /// pool has no free member, for one to be made and verified (default `2m`, at most
    /// `10m`); then it is answered 503 with Retry-After.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_start_wait: Option<String>,
}

impl AutoscalePolicy {
    pub fn tunnels_per_member(&self) -> u32 {
        self.tunnels_per_member
            .unwrap_or(DEFAULT_TUNNELS_PER_MEMBER)
            .max(1)
    }

    pub fn leases_per_member(&self) -> u32 {
        self.leases_per_member
            .unwrap_or(DEFAULT_LEASES_PER_MEMBER)
            .max(1)
    }

    /// `idleAfter`, parsed (its default when absent; validation refuses an unreadable one).
    pub fn idle_after(&self) -> Duration {
        self.idle_after
            .as_deref()
            .and_then(|a| crate::config::parse_duration(a).ok())
            .unwrap_or(DEFAULT_IDLE_AFTER)
    }

    /// `coldStartWait`, parsed, at most [`MAX_COLD_START_WAIT`].
    pub fn cold_start_wait(&self) -> Duration {
        self.cold_start_wait
            .as_deref()
            .and_then(|a| crate::config::parse_duration(a).ok())
            .unwrap_or(DEFAULT_COLD_START_WAIT)
            .min(MAX_COLD_START_WAIT)
    }
}

/// What the gateways and the lease API see of one pool's demand now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Demand {
    /// Tunnels and plain requests in flight through the gateways.
    #[serde(default)]
    pub tunnels: u32,
    /// Tunnels and requests held for want of a member (a cold or full pool).
    #[serde(default)]
    pub waiting_tunnels: u32,
    /// Leases held.
    #[serde(default)]
    pub leases: u32,
    /// Lease requests waiting for a member.
    #[serde(default)]
    pub waiting_leases: u32,
}

impl Demand {
    /// The sum of two sources' demands (saturating: a flood of reports cannot wrap it).
    pub fn plus(self, o: Demand) -> Demand {
        Demand {
            tunnels: self.tunnels.saturating_add(o.tunnels),
            waiting_tunnels: self.waiting_tunnels.saturating_add(o.waiting_tunnels),
            leases: self.leases.saturating_add(o.leases),
            waiting_leases: self.waiting_leases.saturating_add(o.waiting_leases),
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Demand::default()
    }
}

/// `status.autoscale`: what the last decision made of the demand.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AutoscaleStatus {
    /// The members the pool keeps now (the replicas its decision works to).
    pub replicas: u32,
    /// The members the demand asked for at the last decision, within min and max.
    #[serde(default)]
    pub needed: u32,
    /// The most members the demand asked for since `since`: what the pool shrinks to once
    /// `idleAfter` has passed.
    #[serde(default)]
    pub peak: u32,
    /// RFC 3339: since when the demand has stayed below `replicas` (or when the pool last
    /// changed size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// The demand the decision read.
    #[serde(default)]
    pub demand: Demand,
}
