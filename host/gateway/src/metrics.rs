//! The gateway's metrics, per member and per pool: connections, tunnels open, bytes, errors by
//! kind, how tunnels ended, members by state, and the time a CONNECT took to set up. A
//! member's series go when it leaves the table, so rotation does not grow them for ever.
//! Connections, errors, ended tunnels and setup times say which listener took the crawler
//! (`listener`: `http`, `http2` or `socks5`; HTTP/1.1 and HTTP/2 share the HTTP listener and
//! are told apart by what the TLS handshake agreed), and the SOCKS listener counts its replies
//! by code name. Crawler connections and the requests on them are counted by listener too, so
//! tunnels that arrive as HTTP/2 streams on one connection show as such.

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

/// The listener a crawler came through, and on the HTTP listener the protocol it spoke: a
/// label of three values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Listener {
    /// HTTP/1.1, in clear or over TLS.
    Http,
    /// HTTP/2 on the HTTP listener's TLS (ALPN `h2`): each request a stream.
    Http2,
    Socks5,
}

impl Listener {
    pub const ALL: [Listener; 3] = [Listener::Http, Listener::Http2, Listener::Socks5];

    pub fn label(self) -> &'static str {
        match self {
            Listener::Http => "http",
            Listener::Http2 => "http2",
            Listener::Socks5 => "socks5",
        }
    }
}

/// `labels` with the listener's.
pub fn on(labels: Labels, listener: Listener) -> Labels {
    with(labels, "listener", listener.label())
}

/// From a tenth of a second to about seven minutes: a member made and verified.
fn cold_start_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 13))
}

fn setup_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

pub struct Metrics {
    registry: Registry,
    /// By namespace, pool, member, kind (connect, http) and listener.
    pub connections: Family<Labels, Counter>,
    /// Tunnels open, by namespace, pool and member.
    pub tunnels: Family<Labels, Gauge>,
    /// By namespace, pool, member and direction (up: crawler to member; down: back).
    pub bytes: Family<Labels, Counter>,
    /// By namespace, pool, member (empty where none was chosen), kind
    /// ([`crate::status::ErrorKind::label`]) and listener.
    pub errors: Family<Labels, Counter>,
    /// Tunnels ended, by namespace, pool, why (closed, idle, retired) and listener.
    pub ended: Family<Labels, Counter>,
    /// Members by namespace, pool and state (available, leased, draining, unready).
    pub members: Family<Labels, Gauge>,
    /// Seconds from a tunnel's request (a CONNECT, a SOCKS request) to the member's `200`, by
    /// listener.
    pub setup: Family<Labels, Histogram, fn() -> Histogram>,
    /// The SOCKS listener's answers, by the name of their code ([`crate::socks::wire::Reply`],
    /// and `auth_failed`, `no_acceptable_methods` for the negotiation's refusals).
    pub socks_replies: Family<Labels, Counter>,
    /// Signals that a target refused a member, by namespace, pool, source (`report`: the
    /// crawler's; `status`: a plain answer's) and result (`quarantined`, `repeated`: its
    /// holder had signalled that quarantine already, `over_rate`: past its holder's rate).
    /// Targets are not a label: a crawler's list of sites would make the series unbounded.
    pub quarantine_signals: Family<Labels, Counter>,
    /// Tunnels and requests under a politeness rule, by namespace, pool and result
    /// (`started`: at once; `waited`: after waiting for budget; `refused`: answered 429). No
    /// target label, for the same reason as above.
    pub politeness: Family<Labels, Counter>,
    /// This replica's quarantine signals sent on to the lease API (`--reports-to`), by result:
    /// `ok`, `refused` (4xx: the caller may not report it, or is past its rate), `failed` (no
    /// answer, 5xx) and `dropped` (the queue was full).
    pub reports_forwarded: Family<Labels, Counter>,
    /// Autoscaled pools' demand said to the lease API, by result: `ok`, `refused` (4xx),
    /// `failed` (no answer, 5xx), `unkept` (past the bound of counts kept).
    pub demand_said: Family<Labels, Counter>,
    /// Tunnels and requests held while their autoscaled pool had no member, by namespace,
    /// pool and result (`served`: a member verified within coldStartWait; `timeout`: answered
    /// 503), and how long each was held.
    pub cold_starts: Family<Labels, Counter>,
    pub cold_start_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Crawler connections accepted, by listener (`http` and `http2` once the TLS handshake
    /// agreed which).
    pub crawler_connections: Family<Labels, Counter>,
    /// Requests crawlers made, by listener: an HTTP/1.1 request, an HTTP/2 stream, a SOCKS
    /// request. Against `crawler_connections`, how many each connection carried.
    pub requests: Family<Labels, Counter>,
    /// Per target, by namespace, pool, target and result: plain answers relayed (`served`:
    /// below 400; `refused`: one of the pool's `quarantine.signalStatuses`; `failed`: any other
    /// 4xx or 5xx), from which a target's success ratio is read.
    pub target_answers: Family<Labels, Counter>,
    /// Per target, by namespace, pool, target and source: quarantine signals.
    pub target_signals: Family<Labels, Counter>,
    /// Per target, by namespace, pool and target: requests answered 429 for politeness.
    pub target_politeness_refusals: Family<Labels, Counter>,
    /// Per holder (the authenticated caller), by the pool's namespace, holder and direction:
    /// bytes relayed, as [`Metrics::bytes`] counts them.
    pub holder_bytes: Family<Labels, Counter>,
    /// Per holder: tunnels by result (how they ended: `closed`, `idle`, `retired`; or the
    /// error kind of one refused or failed before it opened).
    pub holder_tunnels: Family<Labels, Counter>,
    /// Per holder: plain requests by result (`served`, `refused`, `failed`, or an error kind).
    pub holder_requests: Family<Labels, Counter>,
    /// Per holder: tunnels open now.
    pub holder_tunnels_open: Family<Labels, Gauge>,
    /// Tunnels and requests of holders past [`HOLDERS_PER_NAMESPACE`], accounted under
    /// `holder="other"`, by namespace: a nonzero value says the per-holder series are not all
    /// there is (the audit trail names every holder).
    pub holders_aggregated: Family<Labels, Counter>,
    /// The audit trail's lines, by result (`queued`, `dropped`: its queue was full).
    pub audit_records: Family<Labels, Counter>,
    /// Reads of the peers' quota counts (`--quota-peers`), by result (`ok`, `failed`).
    pub quota_peer_reads: Family<Labels, Counter>,
    /// Each byte quota's bytes of the day (this replica's and its peers') and its limit, by
    /// namespace and holder (`*`: the namespace's holders together).
    pub quota_used_bytes: Family<Labels, Gauge>,
    pub quota_limit_bytes: Family<Labels, Gauge>,
    /// The holders each namespace has series of: the first [`HOLDERS_PER_NAMESPACE`] seen.
    holders: Mutex<std::collections::BTreeMap<String, BTreeSet<String>>>,
    /// The targets each pool has series of: the first [`TARGETS_PER_POOL`] seen; any other is
    /// counted under `target="other"`, so a crawler's list of sites cannot grow the series.
    targets: Mutex<std::collections::BTreeMap<(String, String), BTreeSet<String>>>,
    known: Mutex<BTreeSet<Labels>>,
}

/// Holders of a namespace with series of their own; the rest aggregate under `other`.
pub const HOLDERS_PER_NAMESPACE: usize = 100;

/// Targets of a pool with series of their own; the rest aggregate under `other`.
pub const TARGETS_PER_POOL: usize = 20;

/// A member's name from its id (`NAMESPACE/NAME`), as its series and trail lines name it.
pub fn member_name(id: &str) -> &str {
    id.rsplit_once('/').map_or(id, |(_, name)| name)
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
        let setup = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
            setup_histogram as fn() -> Histogram,
        );
        let socks_replies = Family::<Labels, Counter>::default();
        let quarantine_signals = Family::<Labels, Counter>::default();
        let politeness = Family::<Labels, Counter>::default();
        registry.register(
            "politeness",
            "Tunnels and requests under a politeness rule, by result (started, waited, refused)",
            politeness.clone(),
        );
        let target_answers = Family::<Labels, Counter>::default();
        let target_signals = Family::<Labels, Counter>::default();
        let target_politeness_refusals = Family::<Labels, Counter>::default();
        registry.register(
            "target_answers",
            "Plain answers relayed per target (the first 20 of a pool; the rest as other), by result (served, refused, failed)",
            target_answers.clone(),
        );
        registry.register(
            "target_signals",
            "Quarantine signals per target (the first 20 of a pool; the rest as other), by source",
            target_signals.clone(),
        );
        registry.register(
            "target_politeness_refusals",
            "Requests answered 429 for politeness per target (the first 20 of a pool; the rest as other)",
            target_politeness_refusals.clone(),
        );
        let reports_forwarded = Family::<Labels, Counter>::default();
        registry.register(
            "reports_forwarded",
            "Quarantine signals sent on to the lease API, by result (ok, refused, failed, dropped)",
            reports_forwarded.clone(),
        );
        let demand_said = Family::<Labels, Counter>::default();
        registry.register(
            "demand_said",
            "Autoscaled pools' demand said to the lease API, by result (ok, refused, failed, unkept)",
            demand_said.clone(),
        );
        let cold_starts = Family::<Labels, Counter>::default();
        registry.register(
            "cold_starts",
            "Tunnels and requests held while their autoscaled pool had no member, by result (served, timeout)",
            cold_starts.clone(),
        );
        let cold_start_seconds =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
                cold_start_histogram as fn() -> Histogram,
            );
        registry.register(
            "cold_start_seconds",
            "How long tunnels and requests were held while their autoscaled pool woke",
            cold_start_seconds.clone(),
        );
        let crawler_connections = Family::<Labels, Counter>::default();
        let requests = Family::<Labels, Counter>::default();
        registry.register(
            "crawler_connections",
            "Crawler connections accepted, by listener (http, http2, socks5)",
            crawler_connections.clone(),
        );
        registry.register(
            "requests",
            "Crawler requests by listener: HTTP/1.1 requests, HTTP/2 streams, SOCKS requests",
            requests.clone(),
        );
        registry.register(
            "quarantine_signals",
            "Signals that a target refused a member, by source (report, status) and result",
            quarantine_signals.clone(),
        );
        registry.register(
            "connections",
            "Connections and requests routed to a member, by kind (connect, http) and listener",
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
            "Requests the gateway answered with an error, by kind and listener",
            errors.clone(),
        );
        registry.register(
            "tunnels_ended",
            "Tunnels ended, by why (closed, idle, retired) and listener",
            ended.clone(),
        );
        registry.register(
            "members",
            "Members of a served pool, by state (available, leased, draining, unready)",
            members.clone(),
        );
        registry.register(
            "connect_setup_seconds",
            "From a tunnel's request (CONNECT, SOCKS) to the member's 200, by listener",
            setup.clone(),
        );
        registry.register(
            "socks_replies",
            "Answers of the SOCKS listener, by reply code name",
            socks_replies.clone(),
        );
        let holder_bytes = Family::<Labels, Counter>::default();
        let holder_tunnels = Family::<Labels, Counter>::default();
        let holder_requests = Family::<Labels, Counter>::default();
        let holder_tunnels_open = Family::<Labels, Gauge>::default();
        let holders_aggregated = Family::<Labels, Counter>::default();
        let audit_records = Family::<Labels, Counter>::default();
        let quota_peer_reads = Family::<Labels, Counter>::default();
        let quota_used_bytes = Family::<Labels, Gauge>::default();
        let quota_limit_bytes = Family::<Labels, Gauge>::default();
        registry.register(
            "quota_used_bytes",
            "Bytes of the UTC day under each byte quota, all replicas', by namespace and holder (* for the namespace's)",
            quota_used_bytes.clone(),
        );
        registry.register(
            "quota_limit_bytes",
            "Each byte quota's bytes per UTC day, by namespace and holder (* for the namespace's)",
            quota_limit_bytes.clone(),
        );
        registry.register(
            "quota_peer_reads",
            "Reads of the peer replicas' quota counts, by result (ok, failed)",
            quota_peer_reads.clone(),
        );
        registry.register(
            "holder_bytes",
            "Bytes relayed per holder (the first 100 of a namespace; the rest as other), by direction",
            holder_bytes.clone(),
        );
        registry.register(
            "holder_tunnels",
            "Tunnels per holder, by result (closed, idle, retired, or the error kind)",
            holder_tunnels.clone(),
        );
        registry.register(
            "holder_requests",
            "Plain requests per holder, by result (served, refused, failed, or the error kind)",
            holder_requests.clone(),
        );
        registry.register(
            "holder_tunnels_open",
            "Tunnels open per holder",
            holder_tunnels_open.clone(),
        );
        registry.register(
            "holders_aggregated",
            "Tunnels and requests accounted under holder=\"other\" (past the namespace's 100 holders)",
            holders_aggregated.clone(),
        );
        registry.register(
            "audit_records",
            "Audit trail lines, by result (queued, dropped: the queue was full)",
            audit_records.clone(),
        );
        Self {
            registry,
            holder_bytes,
            holder_tunnels,
            holder_requests,
            holder_tunnels_open,
            holders_aggregated,
            audit_records,
            quota_peer_reads,
            quota_used_bytes,
            quota_limit_bytes,
            holders: Mutex::new(std::collections::BTreeMap::new()),
            connections,
            tunnels,
            bytes,
            errors,
            ended,
            members,
            setup,
            socks_replies,
            quarantine_signals,
            politeness,
            reports_forwarded,
            demand_said,
            cold_starts,
            cold_start_seconds,
            target_answers,
            target_signals,
            target_politeness_refusals,
            targets: Mutex::new(std::collections::BTreeMap::new()),
            crawler_connections,
            requests,
            known: Mutex::new(BTreeSet::new()),
        }
    }

    /// The labels of `target` on `pool`: its own name for the first [`TARGETS_PER_POOL`]
    /// targets the pool saw, `other` past them.
    pub fn target_labels(&self, pool: &PoolKey, target: &str) -> Labels {
        let mut seen = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        let named = seen
            .entry((pool.namespace.clone(), pool.name.clone()))
            .or_default();
        let label = if named.contains(target) {
            target
        } else if named.len() < TARGETS_PER_POOL {
            named.insert(target.to_string());
            target
        } else {
            "other"
        };
        with(pool_labels(pool), "target", label)
    }

    /// The labels of `holder` using a pool of `namespace`: its own name for the first
    /// [`HOLDERS_PER_NAMESPACE`] holders the namespace saw, `other` past them (counted in
    /// [`Metrics::holders_aggregated`]).
    pub fn holder_labels(&self, namespace: &str, holder: &str) -> Labels {
        let mut seen = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        let named = seen.entry(namespace.to_string()).or_default();
        let label = if named.contains(holder) {
            holder
        } else if named.len() < HOLDERS_PER_NAMESPACE {
            named.insert(holder.to_string());
            holder
        } else {
            self.holders_aggregated
                .get_or_create(&vec![("namespace".into(), namespace.into())])
                .inc();
            "other"
        };
        vec![
            ("namespace".into(), namespace.into()),
            ("holder".into(), label.into()),
        ]
    }

    /// A report sent on to the lease API ended as `result`.
    pub fn demand_said(&self, result: &str) {
        self.demand_said
            .get_or_create(&vec![("result".into(), result.into())])
            .inc();
    }

    /// A tunnel or request held `held` while `pool` woke, ending in `result`.
    pub fn cold_start(&self, pool: &PoolKey, result: &str, held: std::time::Duration) {
        self.cold_starts
            .get_or_create(&with(pool_labels(pool), "result", result))
            .inc();
        self.cold_start_seconds
            .get_or_create(&pool_labels(pool))
            .observe(held.as_secs_f64());
    }

    pub fn report_forwarded(&self, result: &str) {
        self.reports_forwarded
            .get_or_create(&vec![("result".into(), result.into())])
            .inc();
    }

    /// An error of `kind` on `pool`, by `member` (`NS/NAME`) where one was chosen: a member
    /// that fails shows as itself, not only as its pool.
    pub fn error(
        &self,
        listener: Listener,
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
        let member = member.map(member_name).unwrap_or_default();
        self.errors
            .get_or_create(&on(
                with(with(labels, "member", member), "kind", kind.label()),
                listener,
            ))
            .inc();
    }

    /// A crawler connection accepted on `listener`.
    pub fn accepted(&self, listener: Listener) {
        self.crawler_connections
            .get_or_create(&on(Vec::new(), listener))
            .inc();
    }

    /// A crawler request (an HTTP/2 stream, a SOCKS request) on `listener`.
    pub fn request(&self, listener: Listener) {
        self.requests.get_or_create(&on(Vec::new(), listener)).inc();
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
            for listener in Listener::ALL {
                for kind in ["connect", "http"] {
                    self.connections
                        .remove(&on(with(gone.clone(), "kind", kind), listener));
                }
                for kind in crate::status::ErrorKind::ALL {
                    self.errors
                        .remove(&on(with(gone.clone(), "kind", kind.label()), listener));
                }
            }
            for dir in ["up", "down"] {
                self.bytes.remove(&with(gone.clone(), "direction", dir));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A namespace's holders have series of their own up to the bound, the rest as `other`
    /// (and counted so), and one namespace's holders do not use another's room.
    #[test]
    fn the_holders_of_a_namespace_are_named_up_to_the_bound_and_the_rest_aggregate() {
        let m = Metrics::new();
        let holder = |l: Labels| l.into_iter().find(|(k, _)| k == "holder").unwrap().1;
        for i in 0..HOLDERS_PER_NAMESPACE + 3 {
            let want = if i < HOLDERS_PER_NAMESPACE {
                format!("h{i}")
            } else {
                "other".into()
            };
            assert_eq!(holder(m.holder_labels("ns", &format!("h{i}"))), want);
        }
        assert_eq!(holder(m.holder_labels("ns", "h7")), "h7");
        assert_eq!(holder(m.holder_labels("team-b", "h999")), "h999");
        assert!(
            m.encode()
                .contains("egress_gateway_holders_aggregated_total{namespace=\"ns\"} 3"),
            "{}",
            m.encode()
        );
    }

    /// A pool's targets have series of their own up to the bound, the rest as `other`, and
    /// one pool's targets do not use another's room.
    #[test]
    fn the_targets_of_a_pool_are_named_up_to_the_bound_and_the_rest_aggregate() {
        let m = Metrics::new();
        let pool = |name: &str| PoolKey {
            namespace: "ns".into(),
            name: name.into(),
        };
        let target = |l: Labels| l.into_iter().find(|(k, _)| k == "target").unwrap().1;
        for i in 0..TARGETS_PER_POOL + 5 {
            let l = m.target_labels(&pool("web"), &format!("site-{i}.example"));
            let want = if i < TARGETS_PER_POOL {
                format!("site-{i}.example")
            } else {
                "other".into()
            };
            assert_eq!(target(l), want);
        }
        // Named once, named for good; another pool has room of its own.
        assert_eq!(
            target(m.target_labels(&pool("web"), "site-3.example")),
            "site-3.example"
        );
        assert_eq!(
            target(m.target_labels(&pool("api"), "site-99.example")),
            "site-99.example"
        );
    }
}
