//! The gateway's metrics, per member and per pool: connections, tunnels open, bytes, errors by
//! kind, how tunnels ended, members by state, and the time a CONNECT took to set up. A
//! member's series go when it leaves the table, so rotation does not grow them for ever.

use crate::members::{Entry, PoolKey, Snapshot};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::Mutex;

pub type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    /// By namespace, pool, member and kind (connect, http).
    pub connections: Family<Labels, Counter>,
    /// Tunnels open, by namespace, pool and member.
    pub tunnels: Family<Labels, Gauge>,
    /// By namespace, pool, member and direction (up: crawler to member; down: back).
    pub bytes: Family<Labels, Counter>,
    /// By namespace, pool, member (empty where none was chosen) and kind
    /// ([`crate::status::ErrorKind::label`]).
    pub errors: Family<Labels, Counter>,
    /// Tunnels ended, by namespace, pool and why (closed, idle, retired).
    pub ended: Family<Labels, Counter>,
    /// Members by namespace, pool and state (available, leased, draining, unready).
    pub members: Family<Labels, Gauge>,
    /// Seconds from a CONNECT's arrival to the member's `200`.
    pub setup: Histogram,
    known: Mutex<BTreeSet<Labels>>,
}

pub fn member_labels(e: &Entry) -> Labels {
    vec![
        ("namespace".into(), e.member.namespace.clone()),
        ("pool".into(), e.member.pool.clone()),
        ("member".into(), e.member.name.clone()),
    ]
}

pub fn pool_labels(p: &PoolKey) -> Labels {
    vec![
        ("namespace".into(), p.namespace.clone()),
        ("pool".into(), p.name.clone()),
    ]
}

pub fn with(mut labels: Labels, key: &str, value: &str) -> Labels {
    labels.push((key.into(), value.into()));
    labels
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("egress_gateway");
        let connections = Family::<Labels, Counter>::default();
        let tunnels = Family::<Labels, Gauge>::default();
        let bytes = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let ended = Family::<Labels, Counter>::default();
        let members = Family::<Labels, Gauge>::default();
        let setup = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "connections",
            "Connections and requests routed to a member, by kind (connect, http)",
            connections.clone(),
        );
        registry.register("tunnels", "Tunnels open through a member", tunnels.clone());
        registry.register(
            "bytes",
            "Bytes relayed through a member (up: from the crawler; down: to it)",
            bytes.clone(),
        );
        registry.register(
            "errors",
            "Requests the gateway answered with an error, by kind",
            errors.clone(),
        );
        registry.register(
            "tunnels_ended",
            "Tunnels ended, by why (closed, idle, retired)",
            ended.clone(),
        );
        registry.register(
            "members",
            "Members of a served pool, by state (available, leased, draining, unready)",
            members.clone(),
        );
        registry.register(
            "connect_setup_seconds",
            "From a CONNECT's arrival to the member's 200",
            setup.clone(),
        );
        Self {
            registry,
            connections,
            tunnels,
            bytes,
            errors,
            ended,
            members,
            setup,
            known: Mutex::new(BTreeSet::new()),
        }
    }

    /// An error of `kind` on `pool`, by `member` (`NS/NAME`) where one was chosen: a member
    /// that fails shows as itself, not only as its pool.
    pub fn error(
        &self,
        pool: Option<&PoolKey>,
        member: Option<&str>,
        kind: crate::status::ErrorKind,
    ) {
        let labels = match pool {
            Some(p) => pool_labels(p),
            None => vec![
                ("namespace".into(), String::new()),
                ("pool".into(), String::new()),
            ],
        };
        let member = member
            .map(|id| id.rsplit_once('/').map_or(id, |(_, name)| name))
            .unwrap_or_default();
        self.errors
            .get_or_create(&with(with(labels, "member", member), "kind", kind.label()))
            .inc();
    }

    /// The member gauges of `snapshot`; the series of members that left are removed.
    pub fn observe(&self, snapshot: &Snapshot, now: i64) {
        let mut present = BTreeSet::new();
        for (pool, entries) in &snapshot.pools {
            let mut counts = [0i64; 4];
            for e in entries {
                let m = &e.member;
                let i = if m.retire_at.is_some() {
                    2
                } else if !m.ready || m.cordoned {
                    3
                } else if m.exclusive_lease(now).is_some() {
                    1
                } else {
                    0
                };
                counts[i] += 1;
                present.insert(member_labels(e));
            }
            for (state, n) in ["available", "leased", "draining", "unready"]
                .iter()
                .zip(counts)
            {
                self.members
                    .get_or_create(&with(pool_labels(pool), "state", state))
                    .set(n);
            }
        }
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        for gone in known.difference(&present) {
            for kind in ["connect", "http"] {
                self.connections.remove(&with(gone.clone(), "kind", kind));
            }
            for dir in ["up", "down"] {
                self.bytes.remove(&with(gone.clone(), "direction", dir));
            }
            for kind in crate::status::ErrorKind::ALL {
                let mut labels = gone.clone();
                labels.push(("kind".into(), kind.label().into()));
                self.errors.remove(&labels);
            }
            self.tunnels.remove(gone);
        }
        *known = present;
    }

    /// The classic text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
