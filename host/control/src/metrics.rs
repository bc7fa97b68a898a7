//! Prometheus metrics: reconciles, errors by class, provider calls by provider, operation and
//! outcome with their durations, GC deletions, health per target, config reloads, the egress
//! check, and each pool's replicas against its floor, its placements and its deletions by
//! reason (what `examples/deploy/components/monitoring` alerts on and charts).

use egress_core::ErrorClass;
use egress_runtime::CallObserver;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

type Labels = Vec<(String, String)>;

/// A pool's series, by namespace and name.
type PoolKey = (String, String);

/// The pool gauges, one family each, in the order they are registered.
const POOL_GAUGES: [(&str, &str); 10] = [
    (
        "pool_spec_replicas",
        "Replicas the pool works to: spec.replicas, or the size autoscale decided",
    ),
    (
        "pool_min_available_replicas",
        "The pool's floor: spec replicas less maxUnavailable, which its own deletions never go below",
    ),
    ("pool_replicas", "Proxies the pool has, not being deleted"),
    (
        "pool_ready_replicas",
        "The pool's Ready Proxies (verified where the egress check runs), none cordoned: what discovery lists",
    ),
    (
        "pool_available_replicas",
        "The pool's Proxies that count toward its floor",
    ),
    (
        "pool_updated_replicas",
        "The pool's Proxies of the current template and provider revision, younger than maxAge",
    ),
    (
        "pool_distinct_egress_ips",
        "Distinct egress addresses among the pool's available Proxies",
    ),
    (
        "pool_leased_replicas",
        "The pool's Proxies a lease holds now",
    ),
    (
        "pool_draining_replicas",
        "The pool's Proxies draining for their leases (retired, kept until their leases end or drainTimeout)",
    ),
    (
        "pool_targets_blocked",
        "Targets that signalled more of the pool's Proxies than maxQuarantinedPercent lets them quarantine (TargetBlocked)",
    ),
];

/// Holders of a pool with series of their own; the rest aggregate under `other`.
pub const HOLDERS_PER_POOL: usize = 100;

pub struct Metrics {
    registry: Registry,
    /// Per holder of a pool: its live leases, and the members they hold by mode (exclusive:
    /// its member-hours, as Prometheus integrates them).
    pub holder_leases: Family<Labels, Gauge>,
    pub holder_leased_members: Family<Labels, Gauge>,
    /// The holders each pool has series of.
    holders: Mutex<BTreeMap<(String, String), BTreeSet<String>>>,
    /// What a pool's members cost an hour now, by its providers' `prices` (one currency: the
    /// first priced placement's).
    pub pool_cost_per_hour: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The currency each priced pool's series has.
    pool_currencies: Mutex<BTreeMap<(String, String), String>>,
    /// The lease API's audit trail lines, by result (`queued`, `dropped`).
    pub audit_records: Family<Labels, Counter>,
    /// Reads of the other replicas' demand boards by the one that decides, by result (`ok`,
    /// `failed`).
    pub demand_peer_reads: Family<Labels, Counter>,
    pub reconciles: Family<Labels, Counter>,
    pub errors: Family<Labels, Counter>,
    pub provider_calls: Family<Labels, Histogram>,
    pub gc_deletions: Family<Labels, Counter>,
    pub gc_sweep_failures: Family<Labels, Counter>,
    pub target_healthy: Family<Labels, Gauge>,
    pub reloads: Family<Labels, Counter>,
    pub egress_checks: Family<Labels, Counter>,
    pub egress_latency: Family<Labels, Histogram>,
    pub egress_proxies: Family<Labels, Gauge>,
    /// No labels; absent until the first check, so an installation without one has no series.
    pub egress_checker_available: Family<Labels, Gauge>,
    pub provider_call_outcomes: Family<Labels, Counter>,
    /// [`POOL_GAUGES`], by namespace and pool.
    pool_gauges: Vec<Family<Labels, Gauge>>,
    pub pool_placement_degraded: Family<Labels, Gauge>,
    pub pool_placement_available: Family<Labels, Gauge>,
    pub pool_placement_target: Family<Labels, Gauge>,
    /// By namespace, pool and target, for the targets the pool's status lists (at most
    /// `TARGETS_SHOWN` per pool: the series stay bounded).
    pub pool_target_signalled: Family<Labels, Gauge>,
    pub pool_target_quarantined: Family<Labels, Gauge>,
    pub pool_deletions: Family<Labels, Counter>,
    pub pool_drains: Family<Labels, Counter>,
    pub leases: Family<Labels, Counter>,
    pub pool_creations: Family<Labels, Counter>,
    /// The placement label sets each pool has series for, so that the series of a pool that is
    /// gone, or of a placement it no longer has, go too.
    pools: Mutex<BTreeMap<PoolKey, BTreeSet<Labels>>>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Starts the lease API's audit trail on `sink`, its lines counted here.
    pub fn audit(
        &self,
        sink: egress_serve::audit::Sink,
    ) -> Result<egress_serve::audit::Audit, egress_serve::audit::AuditError> {
        let counter = |result: &str| {
            self.audit_records
                .get_or_create(&vec![("result".into(), result.into())])
                .clone()
        };
        egress_serve::audit::Audit::start(sink, counter("queued"), counter("dropped"))
    }

    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("egress_proxies");
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let provider_calls = Family::<Labels, Histogram>::new_with_constructor(|| {
            // 1 ms to ~16 min: a get is milliseconds, a first create on a KVM host downloads an
            // image.
            Histogram::new(exponential_buckets(0.001, 4.0, 11))
        });
        let gc_deletions = Family::<Labels, Counter>::default();
        let gc_sweep_failures = Family::<Labels, Counter>::default();
        let target_healthy = Family::<Labels, Gauge>::default();
        let reloads = Family::<Labels, Counter>::default();
        let egress_checks = Family::<Labels, Counter>::default();
        let egress_latency = Family::<Labels, Histogram>::new_with_constructor(|| {
            // 5 ms to ~20 s: a proxy in the same zone answers in milliseconds, the timeout
            // caps the rest.
            Histogram::new(exponential_buckets(0.005, 2.0, 13))
        });
        let egress_proxies = Family::<Labels, Gauge>::default();
        let egress_checker_available = Family::<Labels, Gauge>::default();
        let provider_call_outcomes = Family::<Labels, Counter>::default();
        let pool_gauges: Vec<Family<Labels, Gauge>> =
            POOL_GAUGES.iter().map(|_| Family::default()).collect();
        let pool_placement_degraded = Family::<Labels, Gauge>::default();
        let pool_placement_available = Family::<Labels, Gauge>::default();
        let pool_placement_target = Family::<Labels, Gauge>::default();
        let pool_target_signalled = Family::<Labels, Gauge>::default();
        let pool_target_quarantined = Family::<Labels, Gauge>::default();
        let pool_deletions = Family::<Labels, Counter>::default();
        let pool_drains = Family::<Labels, Counter>::default();
        let leases = Family::<Labels, Counter>::default();
        let pool_creations = Family::<Labels, Counter>::default();
        registry.register(
            "reconciles",
            "Proxy reconciles by result",
            reconciles.clone(),
        );
        registry.register("errors", "Provider errors by class", errors.clone());
        registry.register(
            "provider_call_duration_seconds",
            "Provider call durations by provider and operation",
            provider_calls.clone(),
        );
        registry.register(
            "gc_deletions",
            "Orphans deleted by the sweeper",
            gc_deletions.clone(),
        );
        registry.register(
            "gc_sweep_failures",
            "Sweeps of a provider that could not list every instance, by provider and reason",
            gc_sweep_failures.clone(),
        );
        registry.register(
            "provider_target_healthy",
            "1 when the provider's health target is Healthy",
            target_healthy.clone(),
        );
        registry.register(
            "provider_reloads",
            "Provider version reloads and rejections by provider",
            reloads.clone(),
        );
        registry.register(
            "egress_checks",
            "Egress checks by provider and result (Verified, ProxyUnreachable, ...)",
            egress_checks.clone(),
        );
        registry.register(
            "egress_check_latency_seconds",
            "Latency of egress checks that got an answer, by provider",
            egress_latency.clone(),
        );
        registry.register(
            "egress_proxies",
            "Proxies by provider and their last check (verified, failing)",
            egress_proxies.clone(),
        );
        registry.register(
            "egress_checker_available",
            "0 while the last egress check found the echo endpoints unreachable directly too (the checker, not the proxies, is down), else 1",
            egress_checker_available.clone(),
        );
        registry.register(
            "provider_calls",
            "Provider calls by provider, operation and outcome (ok, or the error class)",
            provider_call_outcomes.clone(),
        );
        for ((name, help), family) in POOL_GAUGES.iter().zip(&pool_gauges) {
            registry.register(*name, *help, family.clone());
        }
        registry.register(
            "pool_placement_degraded",
            "1 while a pool's placement cannot create and lends its share to the others",
            pool_placement_degraded.clone(),
        );
        registry.register(
            "pool_placement_available_replicas",
            "A pool placement's Proxies that count toward the floor",
            pool_placement_available.clone(),
        );
        registry.register(
            "pool_placement_target_replicas",
            "A pool placement's share of the replicas now, with what it lends or borrows",
            pool_placement_target.clone(),
        );
        registry.register(
            "pool_target_signalled_replicas",
            "A pool's Proxies whose quarantine record for a target holds now (the targets its status lists)",
            pool_target_signalled.clone(),
        );
        registry.register(
            "pool_target_quarantined_replicas",
            "A pool's Proxies routing and discovery keep from a target now, within maxQuarantinedPercent",
            pool_target_quarantined.clone(),
        );
        registry.register(
            "pool_deletions",
            "Proxies a pool deleted, by reason (Rotated, Cordoned, OutOfDate, Failed, Rebalanced, ScaledDown)",
            pool_deletions.clone(),
        );
        registry.register(
            "pool_drains",
            "Leased Proxies a pool started to drain instead of deleting, by reason",
            pool_drains.clone(),
        );
        registry.register(
            "leases",
            "Lease API calls by operation (acquire, renew, release) and result (granted, unavailable, conflict, refused, banned)",
            leases.clone(),
        );
        registry.register(
            "pool_creations",
            "Proxies a pool created, by provider",
            pool_creations.clone(),
        );
        let pool_cost_per_hour =
            Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "pool_cost_per_hour",
            "What a pool's members cost an hour now (instances and their addresses), by its providers' prices",
            pool_cost_per_hour.clone(),
        );
        let holder_leases = Family::<Labels, Gauge>::default();
        let holder_leased_members = Family::<Labels, Gauge>::default();
        registry.register(
            "holder_leases",
            "Live leases per holder of a pool (the first 100 holders; the rest as other)",
            holder_leases.clone(),
        );
        registry.register(
            "holder_leased_members",
            "Members held per holder of a pool, by lease mode (exclusive: its member-hours)",
            holder_leased_members.clone(),
        );
        let audit_records = Family::<Labels, Counter>::default();
        registry.register(
            "audit_records",
            "Lease API audit trail lines, by result (queued, dropped: the queue was full)",
            audit_records.clone(),
        );
        let demand_peer_reads = Family::<Labels, Counter>::default();
        registry.register(
            "demand_peer_reads",
            "Reads of the other replicas' demand boards by the leader, by result (ok, failed)",
            demand_peer_reads.clone(),
        );
        Self {
            registry,
            holder_leases,
            holder_leased_members,
            holders: Mutex::new(BTreeMap::new()),
            pool_cost_per_hour,
            pool_currencies: Mutex::new(BTreeMap::new()),
            audit_records,
            demand_peer_reads,
            reconciles,
            errors,
            provider_calls,
            gc_deletions,
            gc_sweep_failures,
            target_healthy,
            reloads,
            egress_checks,
            egress_latency,
            egress_proxies,
            egress_checker_available,
            provider_call_outcomes,
            pool_gauges,
            pool_placement_degraded,
            pool_placement_available,
            pool_placement_target,
            pool_target_signalled,
            pool_target_quarantined,
            pool_deletions,
            pool_drains,
            leases,
            pool_creations,
            pools: Mutex::new(BTreeMap::new()),
        }
    }

    /// A pool as its last reconcile left it: its spec's replicas, its floor and its status.
    pub fn pool_observed(
        &self,
        namespace: &str,
        pool: &str,
        spec_replicas: u32,
        floor: u32,
        status: &egress_core::pool::PoolStatus,
    ) {
        let key = labels(&[("namespace", namespace), ("pool", pool)]);
        let values = [
            spec_replicas,
            floor,
            status.replicas,
            status.ready_replicas,
            status.available_replicas,
            status.updated_replicas,
            status.distinct_egress_ips,
            status.leased_replicas,
            status.draining_replicas,
            status.targets.iter().filter(|t| t.cap_reached).count() as u32,
        ];
        for (family, v) in self.pool_gauges.iter().zip(values) {
            family.get_or_create(&key).set(i64::from(v));
        }
        let mut now = BTreeSet::new();
        for (i, p) in status.placements.iter().enumerate() {
            let index = i.to_string();
            let l = labels(&[
                ("namespace", namespace),
                ("pool", pool),
                ("placement", &index),
                ("provider", &p.provider),
            ]);
            self.pool_placement_degraded
                .get_or_create(&l)
                .set(i64::from(p.degraded_since.is_some()));
            self.pool_placement_available
                .get_or_create(&l)
                .set(i64::from(p.available_replicas));
            self.pool_placement_target
                .get_or_create(&l)
                .set(i64::from(p.target_replicas));
            now.insert(l);
        }
        for t in &status.targets {
            let l = labels(&[
                ("namespace", namespace),
                ("pool", pool),
                ("target", &t.target),
            ]);
            self.pool_target_signalled
                .get_or_create(&l)
                .set(i64::from(t.signalled_replicas));
            self.pool_target_quarantined
                .get_or_create(&l)
                .set(i64::from(t.quarantined_replicas));
            now.insert(l);
        }
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let before = pools
            .insert((namespace.to_string(), pool.to_string()), now.clone())
            .unwrap_or_default();
        for gone in before.difference(&now) {
            self.remove_placement(gone);
        }
    }

    /// A Proxy the pool deleted, and why.
    pub fn pool_deleted(&self, namespace: &str, pool: &str, reason: &str) {
        self.pool_deletions
            .get_or_create(&labels(&[
                ("namespace", namespace),
                ("pool", pool),
                ("reason", reason),
            ]))
            .inc();
    }

    /// A leased Proxy the pool started to drain.
    pub fn pool_drained(&self, namespace: &str, pool: &str, reason: &str) {
        self.pool_drains
            .get_or_create(&labels(&[
                ("namespace", namespace),
                ("pool", pool),
                ("reason", reason),
            ]))
            .inc();
    }

    /// A lease API call on pool `pool`: `op` acquire, renew or release; `result` what came of
    /// it.
    pub fn lease_call(&self, namespace: &str, pool: &str, op: &str, result: &str) {
        self.leases
            .get_or_create(&labels(&[
                ("namespace", namespace),
                ("pool", pool),
                ("op", op),
                ("result", result),
            ]))
            .inc();
    }

    /// A Proxy the pool created on `provider`.
    pub fn pool_created(&self, namespace: &str, pool: &str, provider: &str) {
        self.pool_creations
            .get_or_create(&labels(&[
                ("namespace", namespace),
                ("pool", pool),
                ("provider", provider),
            ]))
            .inc();
    }

    /// What each holder holds of pool `namespace/pool` now (`egress_core::lease::holdings`):
    /// its live leases and the members they hold by mode, the first [`HOLDERS_PER_POOL`]
    /// holders by name and the rest as `other`; a holder that holds nothing any more loses its
    /// series.
    pub fn pool_holdings(
        &self,
        namespace: &str,
        pool: &str,
        holdings: &BTreeMap<String, egress_core::lease::Holding>,
    ) {
        let mut folded: BTreeMap<&str, egress_core::lease::Holding> = BTreeMap::new();
        for (i, (holder, h)) in holdings.iter().enumerate() {
            let name = if i < HOLDERS_PER_POOL {
                holder.as_str()
            } else {
                "other"
            };
            let f = folded.entry(name).or_default();
            f.leases += h.leases;
            f.exclusive_members += h.exclusive_members;
            f.shared_members += h.shared_members;
        }
        let mut held = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), pool.to_string());
        let before = held.remove(&key).unwrap_or_default();
        for gone in before.iter().filter(|h| !folded.contains_key(h.as_str())) {
            self.remove_holder(namespace, pool, gone);
        }
        for (holder, h) in &folded {
            let l = labels(&[("namespace", namespace), ("pool", pool), ("holder", holder)]);
            self.holder_leases
                .get_or_create(&l)
                .set(i64::from(h.leases));
            for (mode, n) in [
                ("exclusive", h.exclusive_members),
                ("shared", h.shared_members),
            ] {
                let mut l = l.clone();
                l.push(("mode".into(), mode.into()));
                self.holder_leased_members
                    .get_or_create(&l)
                    .set(i64::from(n));
            }
        }
        held.insert(key, folded.keys().map(|h| h.to_string()).collect());
    }

    /// What pool `namespace/pool`'s members cost an hour now: `cost` in `currency`, or none
    /// priced (its series goes).
    pub fn pool_cost(&self, namespace: &str, pool: &str, cost: Option<(&str, f64)>) {
        let mut currencies = self
            .pool_currencies
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), pool.to_string());
        if let Some(was) = currencies.remove(&key)
            && cost.is_none_or(|(c, _)| c != was)
        {
            self.pool_cost_per_hour.remove(&labels(&[
                ("namespace", namespace),
                ("pool", pool),
                ("currency", &was),
            ]));
        }
        if let Some((currency, per_hour)) = cost {
            self.pool_cost_per_hour
                .get_or_create(&labels(&[
                    ("namespace", namespace),
                    ("pool", pool),
                    ("currency", currency),
                ]))
                .set(per_hour);
            currencies.insert(key, currency.to_string());
        }
    }

    fn remove_holder(&self, namespace: &str, pool: &str, holder: &str) {
        let l = labels(&[("namespace", namespace), ("pool", pool), ("holder", holder)]);
        self.holder_leases.remove(&l);
        for mode in ["exclusive", "shared"] {
            let mut l = l.clone();
            l.push(("mode".into(), mode.into()));
            self.holder_leased_members.remove(&l);
        }
    }

    /// Drops the gauges of every pool not in `live` (namespace, name): a pool that is gone
    /// says nothing, rather than its last counts forever. Its counters stay, as counters of
    /// a finished job do, until the process restarts.
    pub fn retain_pools(&self, live: &BTreeSet<PoolKey>) {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<PoolKey> = pools
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        let mut held = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        for key in gone {
            self.pool_cost(&key.0, &key.1, None);
            for holder in held.remove(&key).unwrap_or_default() {
                self.remove_holder(&key.0, &key.1, &holder);
            }
            let l = labels(&[("namespace", &key.0), ("pool", &key.1)]);
            for family in &self.pool_gauges {
                family.remove(&l);
            }
            for placement in pools.remove(&key).unwrap_or_default() {
                self.remove_placement(&placement);
            }
        }
    }

    /// Removes the series of a placement or a target of a pool (`l`: its labels).
    fn remove_placement(&self, l: &Labels) {
        self.pool_placement_degraded.remove(l);
        self.pool_placement_available.remove(l);
        self.pool_placement_target.remove(l);
        self.pool_target_signalled.remove(l);
        self.pool_target_quarantined.remove(l);
    }

    /// The provider's proxies whose last check verified them, and those failing.
    pub fn egress_counts(&self, provider: &str, verified: u32, failing: u32) {
        for (state, n) in [("verified", verified), ("failing", failing)] {
            self.egress_proxies
                .get_or_create(&labels(&[("provider", provider), ("state", state)]))
                .set(i64::from(n));
        }
    }

    pub fn reconciled(&self, result: &str) {
        self.reconciles
            .get_or_create(&labels(&[("result", result)]))
            .inc();
    }

    pub fn error(&self, class: ErrorClass) {
        self.errors
            .get_or_create(&labels(&[("class", class.label())]))
            .inc();
    }

    pub fn gc_deleted(&self, provider: &str) {
        self.gc_deletions
            .get_or_create(&labels(&[("provider", provider)]))
            .inc();
    }

    /// A sweep of `provider` that could not list every instance, and why.
    pub fn gc_sweep_failed(&self, provider: &str, reason: &str) {
        self.gc_sweep_failures
            .get_or_create(&labels(&[("provider", provider), ("reason", reason)]))
            .inc();
    }

    pub fn target(&self, provider: &str, target: &str, healthy: bool) {
        self.target_healthy
            .get_or_create(&labels(&[("provider", provider), ("target", target)]))
            .set(i64::from(healthy));
    }

    /// A reload of one provider (`swapped` or `rejected`); an empty provider is the config.
    pub fn reload(&self, provider: &str, result: &str) {
        self.reloads
            .get_or_create(&labels(&[("provider", provider), ("result", result)]))
            .inc();
    }

    /// The OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// The classic Prometheus text format (0.0.4), for clients that do not ask for
    /// OpenMetrics (curl, `promtool check metrics`).
    pub fn encode_text(&self) -> String {
        classic_text(&self.encode())
    }
}

impl crate::egress::CheckObserver for Metrics {
    fn checked(
        &self,
        provider: &str,
        reason: egress_core::egress::CheckReason,
        latency_ms: Option<u64>,
    ) {
        self.egress_checks
            .get_or_create(&labels(&[
                ("provider", provider),
                ("result", reason.as_str()),
            ]))
            .inc();
        self.egress_checker_available
            .get_or_create(&Labels::new())
            .set(i64::from(
                reason != egress_core::egress::CheckReason::CheckerUnavailable,
            ));
        if let Some(ms) = latency_ms {
            self.egress_latency
                .get_or_create(&labels(&[("provider", provider)]))
                .observe(ms as f64 / 1000.0);
        }
    }
}

impl CallObserver for Metrics {
    fn observe(
        &self,
        provider: &str,
        operation: &str,
        elapsed: Duration,
        failure: Option<ErrorClass>,
    ) {
        self.provider_calls
            .get_or_create(&labels(&[("provider", provider), ("operation", operation)]))
            .observe(elapsed.as_secs_f64());
        self.provider_call_outcomes
            .get_or_create(&labels(&[
                ("provider", provider),
                ("operation", operation),
                ("outcome", failure.map_or("ok", ErrorClass::label)),
            ]))
            .inc();
        if let Some(class) = failure {
            self.error(class);
        }
    }
}

/// OpenMetrics text as the classic text format (0.0.4). prometheus-client writes OpenMetrics
/// only. The two differ, for the metrics here, in that a counter's family is named with its
/// `_total` in the classic format's HELP and TYPE lines, and the classic format has no
/// `# UNIT`, no `# EOF` and no `_created` samples.
fn classic_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The HELP line waits for its TYPE, which says whether the name gets `_total`.
    let mut help: Option<(&str, &str)> = None;
    let mut counters: BTreeSet<&str> = BTreeSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => {
                    counters.insert(name);
                    (format!("{name}_total"), "counter")
                }
                "gauge" | "histogram" | "summary" => (name.to_string(), kind),
                _ => (name.to_string(), "untyped"),
            };
            if let Some((_, text)) = help.take() {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let series = line.split(['{', ' ']).next().unwrap_or("");
        if series
            .strip_suffix("_created")
            .is_some_and(|f| counters.contains(f))
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classic_format_names_counters_with_their_total_and_has_no_eof() {
        let m = Metrics::new();
        m.reconciled("ok");
        m.target("gce", "compute", true);
        let text = m.encode_text();
        assert!(
            text.contains(
                "# HELP egress_proxies_reconciles_total Proxy reconciles by result.\n\
                 # TYPE egress_proxies_reconciles_total counter\n\
                 egress_proxies_reconciles_total{result=\"ok\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE egress_proxies_provider_target_healthy gauge\n"),
            "{text}"
        );
        assert!(!text.contains("# EOF"), "{text}");
        assert!(m.encode().ends_with("# EOF\n"));
    }

    /// A pool's holders past [`HOLDERS_PER_POOL`] are folded into `other`: a flood of holders
    /// makes at most 101 series a pool, and series go with their holdings.
    #[test]
    fn a_pools_holders_past_the_bound_fold_into_other_and_their_series_go_with_them() {
        let m = Metrics::new();
        let one = egress_core::lease::Holding {
            leases: 1,
            exclusive_members: 1,
            shared_members: 0,
        };
        let many: BTreeMap<String, _> = (0..150)
            .map(|i| (format!("h{i:03}"), one.clone()))
            .collect();
        m.pool_holdings("ns", "web", &many);
        let series = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("egress_proxies_holder_leases{"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let text = m.encode_text();
        let leases = series(&text);
        assert_eq!(leases.len(), HOLDERS_PER_POOL + 1, "{leases:?}");
        assert!(
            leases.contains(
                &"egress_proxies_holder_leases{namespace=\"ns\",pool=\"web\",holder=\"other\"} 50"
                    .to_string()
            ),
            "{leases:?}"
        );
        let few: BTreeMap<String, _> = (0..2).map(|i| (format!("h{i:03}"), one.clone())).collect();
        m.pool_holdings("ns", "web", &few);
        assert_eq!(series(&m.encode_text()).len(), 2);
    }
}
