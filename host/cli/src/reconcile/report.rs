//! What a run reports: per Proxy its changes, events and status, per pool its decisions and
//! counts, and the sweep's changes and verdicts; and the lanes' reports merged into one.

use egress_core::ProxyStatus;
use egress_core::pool::PoolStatus;
use egress_runtime::PlanStep;
use serde::Serialize;

/// What a run did: per Proxy its changes and resulting status, and the sweep's changes.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub proxies: Vec<ProxyReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolReport>,
    pub gc: GcReport,
    /// Dry-run: rounds of stepping every due Proxy (in the lane that took most). Real mode:
    /// Proxy steps run.
    pub rounds: u32,
    /// Simulated (dry-run) or real seconds the run covered.
    pub elapsed_seconds: u64,
    /// Every Proxy is steady: Running, or held on a condition only a change can clear.
    pub steady: bool,
    /// RFC 3339: when the run started (simulated time in a dry-run).
    pub started_at: String,
    #[serde(skip)]
    pub started_ms: u64,
    /// When one of its pools has a decision due next (a rotation, a drain's end), Unix ms on
    /// the run's clock: `reconcile --watch` runs again then.
    #[serde(skip)]
    pub next_due_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyReport {
    pub namespace: String,
    pub name: String,
    pub provider: String,
    /// The ProxyPool that owns it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The Proxy was removed from the proxies file and its instance deleted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// When it was first tracked, and when its instance was deleted within the run: its
    /// member-hours (not serialised: the pool's `cost` sums them).
    #[serde(skip)]
    pub created_ms: u64,
    #[serde(skip)]
    pub released_ms: Option<u64>,
    #[serde(skip)]
    pub machine_type: Option<String>,
    pub steady: bool,
    pub changes: Vec<Change>,
    /// What happened to the Proxy worth telling (the Events an operator would record).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ReportEvent>,
    pub status: ProxyStatus,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportEvent {
    /// RFC 3339.
    pub at: String,
    #[serde(skip)]
    pub at_ms: u64,
    #[serde(skip)]
    pub seq: u64,
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GcReport {
    pub changes: Vec<Change>,
    /// Per provider: what the sweep saw and decided.
    pub verdicts: Vec<GcVerdict>,
    /// The providers whose sweep could not list every instance (a module trap, its memory
    /// limit, a backend error): their orphans past the failing page were not judged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<GcIncomplete>,
}

/// A provider whose listing failed part way: the sweep judged (and deleted the orphans of) the
/// pages it listed, and no more.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GcIncomplete {
    pub provider: String,
    /// The failure's reason: MemoryLimit, Trap, Timeout, or the module's own.
    pub reason: String,
    pub message: String,
    /// The pages listed before the failing one.
    pub pages_listed: u32,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GcVerdict {
    pub provider: String,
    #[serde(rename = "providerID")]
    pub provider_id: String,
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub capability: String,
    pub call: String,
    pub target: String,
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub args: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// RFC 3339: when the call was made.
    pub at: String,
    #[serde(skip)]
    pub at_ms: u64,
    #[serde(skip)]
    pub seq: u64,
    /// The provider that made the call.
    #[serde(skip)]
    pub provider: String,
}

impl From<PlanStep> for Change {
    fn from(s: PlanStep) -> Self {
        Self {
            provider: s.provider,
            capability: s.capability,
            call: s.call,
            target: s.target,
            args: s.args,
            error: s.error,
            at: egress_core::egress::rfc3339_ms(s.at_ms),
            at_ms: s.at_ms,
            seq: s.seq,
        }
    }
}

impl Report {
    /// One report of the reports of a dry-run's lanes, as one sequential run would order it:
    /// Proxies by key, pools in `pool_order` (the input's), the sweep by provider name. The
    /// run is steady when every lane is, and took as long as its longest lane.
    pub fn merge(lanes: Vec<Report>, pool_order: &[String]) -> Report {
        let started_ms = lanes.iter().map(|r| r.started_ms).min().unwrap_or(0);
        let mut merged = Report {
            proxies: Vec::new(),
            pools: Vec::new(),
            gc: GcReport {
                changes: Vec::new(),
                verdicts: Vec::new(),
                incomplete: Vec::new(),
            },
            rounds: 0,
            elapsed_seconds: 0,
            steady: true,
            started_at: egress_core::egress::rfc3339_ms(started_ms),
            started_ms,
            next_due_ms: lanes.iter().filter_map(|r| r.next_due_ms).min(),
        };
        for r in lanes {
            merged.proxies.extend(r.proxies);
            merged.pools.extend(r.pools);
            merged.gc.changes.extend(r.gc.changes);
            merged.gc.verdicts.extend(r.gc.verdicts);
            merged.gc.incomplete.extend(r.gc.incomplete);
            merged.rounds = merged.rounds.max(r.rounds);
            merged.elapsed_seconds = merged.elapsed_seconds.max(r.elapsed_seconds);
            merged.steady &= r.steady;
        }
        merged
            .proxies
            .sort_by_cached_key(|p| format!("{}/{}", p.namespace, p.name));
        let place = |p: &PoolReport| {
            let key = format!("{}/{}", p.namespace, p.name);
            pool_order
                .iter()
                .position(|k| *k == key)
                .unwrap_or(usize::MAX)
        };
        merged.pools.sort_by_key(place);
        // Stable: within a provider, the order its sweep made.
        merged
            .gc
            .changes
            .sort_by(|a, b| a.provider.cmp(&b.provider));
        merged
            .gc
            .verdicts
            .sort_by(|a, b| a.provider.cmp(&b.provider));
        merged
            .gc
            .incomplete
            .sort_by(|a, b| a.provider.cmp(&b.provider));
        merged
    }
}

/// A pool's counts as one decision left them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSample {
    pub at_ms: u64,
    pub replicas: u32,
    /// replicas − maxUnavailable.
    pub floor: u32,
    pub ready: u32,
    pub available: u32,
    /// Each placement's available members, in the spec's order.
    pub placements: Vec<u32>,
}

/// A pool as the report shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolReport {
    pub namespace: String,
    pub name: String,
    pub status: PoolStatus,
    /// The lowest readyReplicas seen once the pool had been Available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_ready_replicas: Option<u32>,
    /// The lowest availableReplicas seen once the pool had been Available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_available_replicas: Option<u32>,
    /// Deletions the pool decided of available members that left fewer available than
    /// `replicas − maxUnavailable` (never, unless the pool breaks its promise).
    pub deletions_below_floor: u32,
    pub events: Vec<ReportEvent>,
    /// What each target of its crawl (the world's `crawl`) did over the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<egress_control::crawl::TargetTotals>,
    /// Its members' hours over the run and what they cost, where its providers have
    /// `prices`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<PoolCost>,
    /// Its counts over the run (not serialised: `-o html` draws them).
    #[serde(skip)]
    pub timeline: Vec<PoolSample>,
}

/// What a pool's members cost over a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolCost {
    /// Hours its members' instances existed over the run: each from its creation (or the run's
    /// start) to its deletion (or the run's end), whether ready or not, as a bill counts them.
    pub member_hours: f64,
    /// Of those, hours on a provider entry without `prices` (or in another currency than the
    /// first priced one's), which the cost leaves out.
    #[serde(skip_serializing_if = "is_zero")]
    pub unpriced_member_hours: f64,
    pub currency: String,
    #[serde(flatten)]
    pub cost: egress_core::config::Cost,
    pub total: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// `pool`'s [`PoolCost`] from the lifetimes of its `proxies` between `started_ms` and `end_ms`
/// and the providers' prices; none where no provider of its members has prices. The dry-run
/// knows no bytes, so egress costs nothing here.
pub fn pool_cost(
    pool: &PoolReport,
    proxies: &[ProxyReport],
    config: &egress_core::config::ProvidersConfig,
    started_ms: u64,
    end_ms: u64,
) -> Option<PoolCost> {
    let mut total = PoolCost {
        member_hours: 0.0,
        unpriced_member_hours: 0.0,
        currency: String::new(),
        cost: egress_core::config::Cost::default(),
        total: 0.0,
    };
    let mut priced = false;
    for p in proxies
        .iter()
        .filter(|p| p.namespace == pool.namespace && p.pool.as_deref() == Some(&pool.name))
    {
        let from = p.created_ms.max(started_ms);
        let to = p.released_ms.unwrap_or(end_ms).max(from);
        let hours = (to - from) as f64 / 3_600_000.0;
        total.member_hours += hours;
        let prices = config
            .provider(&p.provider)
            .and_then(|e| e.prices.as_ref())
            .filter(|pr| !priced || pr.currency == total.currency);
        match prices {
            Some(pr) => {
                priced = true;
                total.currency.clone_from(&pr.currency);
                total.cost.add(pr.cost(p.machine_type.as_deref(), hours, 0));
            }
            None => total.unpriced_member_hours += hours,
        }
    }
    total.total = total.cost.total();
    priced.then_some(total)
}
