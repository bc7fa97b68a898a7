//! The lease API's flow, written once over a [`LeaseStore`]: a lease is a binding on each
//! leased Proxy (`egress_core::lease` decides them), each write conditioned on the version of
//! the Proxy it was decided on. Two callers racing for the last free proxy both write on the
//! version they read; the store keeps the first and refuses the second, which reads again and
//! finds the proxy taken. A lease of several proxies is all or none: bindings already written
//! are taken back when a later one cannot be.
//!
//! The stores: Proxy statuses in a cluster ([`kube::KubeProxies`]), or the CLI's lease file
//! beside its state. A lease id names its namespace and pool (`LeaseRef`), so a call is
//! authorised before anything is read.

pub mod kube;

use crate::metrics::Metrics;
use egress_core::ProxyStatus;
use egress_core::lease::{
    self, BanReport, Held, LeaseBinding, LeasePolicy, LeaseRef, LeaseRequest, LeaseView, LostProxy,
    Outcome, ReleaseRequest, RenewRequest,
};
use egress_core::target::{self as quarantine, Quarantine, QuarantinePolicy, ReportRequest};
use egress_time::now::Clock;
use std::sync::Arc;
use std::time::Duration;

/// Why a lease call is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseRefusal {
    /// 400: the request is malformed (the field at fault named).
    BadRequest(String),
    /// 404: no such pool, or no such live lease of the caller's (and what it lost, if it lost
    /// proxies). Another's lease is answered as one that does not exist.
    NotFound(String),
    /// 429: the caller holds as many of the pool's proxies as `leases.maxPerHolder` allows,
    /// or reported as many bans as its rate allows.
    TooMany(String),
    /// 503 with Retry-After: no proxy free now, and why.
    Unavailable {
        reason: String,
        retry_after: Duration,
    },
    /// 503 with a short Retry-After: the API server failed or the proxies kept changing.
    Busy(String),
}

impl LeaseRefusal {
    /// Why a lease of pool `at` (under `policy`) is not granted: 503 when not enough is free,
    /// with when to ask again; 429 beyond the holder's share.
    pub fn refused(at: &LeaseRef, policy: &lease::LeasePolicy, r: lease::Refused) -> Self {
        let reason = r.reason(&at.namespace, &at.pool, policy);
        match r {
            lease::Refused::Shortage(s) => LeaseRefusal::Unavailable {
                reason,
                retry_after: s.retry_after,
            },
            lease::Refused::PerHolder { .. } => LeaseRefusal::TooMany(reason),
        }
    }
}

/// What the HTTP API asks of leases ([`Leases`] over a store answers it).
#[async_trait::async_trait]
pub trait LeaseBook: Send + Sync {
    async fn acquire(&self, holder: &str, req: &LeaseRequest) -> Result<LeaseView, LeaseRefusal>;
    async fn renew(
        &self,
        holder: &str,
        at: &LeaseRef,
        id: &str,
        req: &RenewRequest,
    ) -> Result<LeaseView, LeaseRefusal>;
    async fn release(
        &self,
        holder: &str,
        at: &LeaseRef,
        id: &str,
        req: &ReleaseRequest,
    ) -> Result<(), LeaseRefusal>;
    async fn view(&self, holder: &str, at: &LeaseRef, id: &str) -> Result<LeaseView, LeaseRefusal>;
    async fn list(&self, holder: &str, at: &LeaseRef) -> Result<Vec<LeaseView>, LeaseRefusal>;
    /// A target refused one of the pool's proxies (`POST /v1/reports`): the proxy is
    /// quarantined for that target.
    async fn report(&self, holder: &str, req: &ReportRequest) -> Result<Reported, LeaseRefusal>;
}

/// What a report did, as its caller is told.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reported {
    /// `namespace/name` of the Proxy.
    pub proxy: String,
    /// The target the report was counted for: the registrable domain of the host named.
    pub target: String,
    /// RFC 3339: until when new traffic for the target avoids the proxy.
    pub quarantined_until: String,
    /// False when this caller had reported this quarantine already (counted once).
    pub counted: bool,
}

/// What a pool's leases go by.
#[derive(Debug, Clone)]
pub struct PoolFacts<'a> {
    /// `spec.leases`.
    pub policy: LeasePolicy,
    /// `spec.replicas`, which `leases.maxPerHolder` may be a percentage of.
    pub replicas: u32,
    /// `spec.quarantine`.
    pub quarantine: QuarantinePolicy,
    /// What its leases lost (`status.lostLeases`).
    pub lost: &'a [LostProxy],
    /// With `spec.autoscale`: how long a lease request that finds no proxy free waits while
    /// the pool makes one (`coldStartWait`).
    pub cold_start_wait: Option<Duration>,
}

/// Where the bindings are kept: what differs between a cluster and the CLI. Each member is
/// read with a version, and a write lands only on the version it was decided on.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync {
    /// A pool as read.
    type Pool: Send + Sync;
    /// One of its Proxies as read, with its version and its credential.
    type Member: Clone + Send + Sync;

    /// Pool `at`, or 404 naming it.
    async fn pool(&self, at: &LeaseRef) -> Result<Self::Pool, LeaseRefusal>;
    fn facts(pool: &Self::Pool) -> PoolFacts<'_>;
    /// Its Proxies now (not those being deleted).
    async fn members(
        &self,
        at: &LeaseRef,
        pool: &Self::Pool,
    ) -> Result<Vec<Self::Member>, LeaseRefusal>;
    /// `m` as the core's lease functions read it.
    fn held(m: &Self::Member, now: i64) -> Held<'_>;
    /// Its status: its bindings and ban reports.
    fn status(m: &Self::Member) -> &ProxyStatus;
    /// Whether it carries the cordon mark already.
    fn cordoned(m: &Self::Member) -> bool;
    /// `namespace/name`, for what is said about it.
    fn key(m: &Self::Member) -> String;
    /// Writes `records` as the records of `m` on the condition that it is the version read,
    /// keeping its live bindings of a replaced instance (their holders' record of the loss).
    /// `Ok(None)`: it changed since, or is gone.
    async fn write(
        &self,
        m: &Self::Member,
        records: Records,
        now: i64,
    ) -> Result<Option<Self::Member>, LeaseRefusal>;
    /// `m` as it is now, after a write found it changed; None when it is gone.
    async fn reread(&self, m: &Self::Member) -> Result<Option<Self::Member>, LeaseRefusal>;
    /// Cordons a proxy enough of its holders reported banned, or that enough targets
    /// quarantine at once (`why`): out of discovery and leases, to be replaced through the
    /// pool's budget. Best effort, said when it fails.
    async fn cordon(&self, m: &Self::Member, why: &str);
    /// A release landed on `m` (a draining proxy may go now).
    fn released(&self, _m: &Self::Member) {}
    /// Every member of every pool of `namespace` now, for the `concurrentLeases` quotas.
    async fn namespace_members(&self, namespace: &str) -> Result<Vec<Self::Member>, LeaseRefusal>;
    /// The `status.leaseUsage` of every pool of `namespace`, for the `memberHoursPerDay`
    /// quotas.
    async fn namespace_usage(
        &self,
        namespace: &str,
    ) -> Result<Vec<egress_core::quota::LeaseUsage>, LeaseRefusal>;
}

/// Counts lease call `op` on the pool of `at` by how it ended
/// (`egress_proxies_leases_total`).
fn count_call(metrics: &Metrics, at: &LeaseRef, op: &str, r: &Result<impl Sized, LeaseRefusal>) {
    let result = match r {
        Ok(_) => "granted",
        Err(LeaseRefusal::Unavailable { .. }) => "unavailable",
        Err(LeaseRefusal::Busy(_)) => "conflict",
        Err(_) => "refused",
    };
    metrics.lease_call(&at.namespace, &at.pool, op, result);
}

/// Writes of one lease call tried at most this many times against a changing pool.
const ATTEMPTS: usize = 5;

/// How often a lease request waiting on an autoscaled pool looks again for a free proxy.
pub const WAKE_POLL: Duration = Duration::from_millis(250);

/// The lease flow over store `S`: the [`LeaseBook`] the API calls.
pub struct Leases<S> {
    store: Arc<S>,
    now: Clock,
    metrics: Arc<Metrics>,
    /// Where a lease request waiting on an autoscaled pool is counted as its demand.
    demand: Option<Arc<crate::demand::DemandBoard>>,
    /// The installation's quotas (`concurrentLeases` is read here).
    quotas: Arc<Vec<egress_core::quota::QuotaRule>>,
}

/// What a change writes on a member: its bindings, and its ban reports and quarantines where
/// they changed (None keeps what it has).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    pub bindings: Vec<LeaseBinding>,
    pub bans: Option<Vec<BanReport>>,
    pub quarantines: Option<Vec<Quarantine>>,
}

impl Records {
    /// New bindings, nothing else changed.
    pub fn bindings(bindings: Vec<LeaseBinding>) -> Self {
        Self {
            bindings,
            ..Self::default()
        }
    }
}

/// A member's change, or None: nothing to write.
type Change = Option<Records>;

impl<S: LeaseStore> Leases<S> {
    pub fn with_store(store: Arc<S>, now: Clock, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            now,
            metrics,
            demand: None,
            quotas: Arc::default(),
        }
    }

    /// These leases, refused (429) to a holder whose lease would pass a `concurrentLeases`
    /// quota of `quotas`: its own proxies leased at once (a rule naming it), or its
    /// namespace's (a rule naming none), over every pool of the namespace.
    pub fn with_quotas(mut self, quotas: Vec<egress_core::quota::QuotaRule>) -> Self {
        self.quotas = Arc::new(quotas);
        self
    }

    /// 429 when a lease of `asked` proxies for `holder` on the pools of `namespace` would
    /// pass a `concurrentLeases` quota, or a `memberHoursPerDay` one is reached (the pools'
    /// `status.leaseUsage`, which the pool controller counts, and what was held since). Two leases asked at once in two pools may both pass
    /// it by one each: the count is read, not reserved.
    async fn within_lease_quota(
        &self,
        namespace: &str,
        holder: &str,
        asked: u32,
    ) -> Result<(), LeaseRefusal> {
        let applying = |r: &&egress_core::quota::QuotaRule| r.applies(namespace, holder);
        let now = (self.now)();
        if self
            .quotas
            .iter()
            .filter(applying)
            .any(|r| r.member_hours_per_day.is_some())
        {
            let usages = self.store.namespace_usage(namespace).await?;
            let usages: Vec<&egress_core::quota::LeaseUsage> = usages.iter().collect();
            if let Some((rule, limit)) = egress_core::quota::member_hours_reached(
                &self.quotas,
                namespace,
                holder,
                &usages,
                now,
            ) {
                let next = (now.max(0) / 86_400 + 1) * 86_400;
                return Err(LeaseRefusal::TooMany(format!(
                    "quota: memberHoursPerDay of {} reached: {limit} member-hours today; it resets in {}s (the next UTC day)",
                    rule.of(),
                    next - now.max(0)
                )));
            }
        }
        if !self
            .quotas
            .iter()
            .filter(applying)
            .any(|r| r.concurrent_leases.is_some())
        {
            return Ok(());
        }
        let members = self.store.namespace_members(namespace).await?;
        let held = egress_core::quota::held_by_holder(
            members.iter().flat_map(|m| S::status(m).leases.iter()),
            now,
        );
        match egress_core::quota::leases_past(
            &self.quotas,
            namespace,
            holder,
            &held,
            u64::from(asked.max(1)),
        ) {
            Some((rule, limit)) => Err(LeaseRefusal::TooMany(format!(
                "quota: concurrentLeases of {} reached: at most {limit} proxies leased at once; a released lease frees its place",
                rule.of()
            ))),
            None => Ok(()),
        }
    }

    /// These leases, a request that finds an autoscaled pool without a free proxy waiting
    /// up to its `coldStartWait`, counted meanwhile in `demand` (which the pool's decision
    /// reads), for one to be made.
    pub fn with_demand(mut self, demand: Arc<crate::demand::DemandBoard>) -> Self {
        self.demand = Some(demand);
        self
    }

    /// [`Self::acquire_in`], and where it finds no proxy free in an autoscaled pool, again
    /// every [`WAKE_POLL`] while the pool wakes, up to its `coldStartWait`.
    async fn acquire_waking(
        &self,
        holder: &str,
        req: &LeaseRequest,
        at: &LeaseRef,
    ) -> Result<LeaseView, LeaseRefusal> {
        let first = self.acquire_in(holder, req, at).await;
        let Some(board) = &self.demand else {
            return first;
        };
        if !matches!(first, Err(LeaseRefusal::Unavailable { .. })) {
            return first;
        }
        let Some(wait) = self
            .store
            .pool(at)
            .await
            .ok()
            .and_then(|p| S::facts(&p).cold_start_wait)
        else {
            return first;
        };
        // A caller with as many requests waiting as it may have is answered at once.
        let Some(_waiting) = board.lease_waiting(holder, &at.namespace, &at.pool, req.count.max(1))
        else {
            return first;
        };
        let deadline = tokio::time::Instant::now() + wait;
        let mut last = first;
        while tokio::time::Instant::now() + WAKE_POLL <= deadline {
            tokio::time::sleep(WAKE_POLL).await;
            last = self.acquire_in(holder, req, at).await;
            if !matches!(last, Err(LeaseRefusal::Unavailable { .. })) {
                break;
            }
        }
        last
    }

    /// The store the leases are kept in.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Lease `id` as its holder `holder` is told, from the members that hold it and what the
    /// pool says it lost; None when it holds none for `holder`.
    fn describe(
        at: &LeaseRef,
        pool: &S::Pool,
        members: &[S::Member],
        id: &str,
        holder: &str,
        now: i64,
    ) -> Option<LeaseView> {
        let held: Vec<Held<'_>> = members.iter().map(|m| S::held(m, now)).collect();
        lease::view(
            &at.namespace,
            &at.pool,
            &held,
            S::facts(pool).lost,
            id,
            holder,
            now,
        )
    }

    /// 404 for lease `id`, saying what it lost when the pool (or a Proxy whose instance was
    /// replaced) remembers and it was `holder`'s.
    fn gone(
        pool: &S::Pool,
        members: &[S::Member],
        id: &str,
        holder: &str,
        now: i64,
    ) -> LeaseRefusal {
        let held: Vec<Held<'_>> = members.iter().map(|m| S::held(m, now)).collect();
        LeaseRefusal::NotFound(lease::gone(&held, S::facts(pool).lost, id, holder, now))
    }

    /// Applies `change` to member `first` until the write lands on the version it was decided
    /// on (reading again after each conflict), or the change says there is nothing to do
    /// (`Ok(None)`).
    async fn settle(
        &self,
        first: S::Member,
        change: impl Fn(&S::Member) -> Result<Change, LeaseRefusal> + Send + Sync,
    ) -> Result<Option<S::Member>, LeaseRefusal> {
        let key = S::key(&first);
        let mut current = first;
        for _ in 0..ATTEMPTS {
            let Some(records) = change(&current)? else {
                return Ok(None);
            };
            let now = (self.now)();
            if let Some(updated) = self.store.write(&current, records, now).await? {
                return Ok(Some(updated));
            }
            current = match self.store.reread(&current).await? {
                Some(m) => m,
                None => return Ok(None),
            };
        }
        Err(LeaseRefusal::Busy(format!(
            "Proxy {key} kept changing while its lease was written"
        )))
    }

    /// Takes lease `id` off every member of `written` (an acquisition that could not have all
    /// it asked for). Best effort: a binding left behind expires with its ttl.
    async fn take_back(&self, written: Vec<S::Member>, id: &str) {
        for m in written {
            let now = (self.now)();
            let r = self
                .settle(m, |m| {
                    let b = S::held(m, now).bindings();
                    Ok(b.iter()
                        .any(|x| x.id == id)
                        .then(|| Records::bindings(lease::without(&b, id, now))))
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(
                    lease = id,
                    "a binding of an abandoned lease stays until its ttl: {e:?}"
                );
            }
        }
    }

    /// Whether a live binding of lease `id` of `holder` holds `m`.
    fn holds(m: &S::Member, id: &str, holder: &str, now: i64) -> bool {
        S::held(m, now)
            .bindings()
            .iter()
            .any(|b| b.id == id && b.holder == holder && b.live(now))
    }

    async fn acquire_in(
        &self,
        holder: &str,
        req: &LeaseRequest,
        at: &LeaseRef,
    ) -> Result<LeaseView, LeaseRefusal> {
        let problems = lease::validate(req);
        if !problems.is_empty() {
            return Err(LeaseRefusal::BadRequest(problems.join("; ")));
        }
        let pool = self.store.pool(at).await?;
        let facts = S::facts(&pool);
        let ttl =
            lease::ttl(req.ttl.as_deref(), &facts.policy).map_err(LeaseRefusal::BadRequest)?;
        let target = req.target.as_deref().map(report_target).transpose()?;
        self.within_lease_quota(&at.namespace, holder, req.count)
            .await?;
        let entropy = crate::credential_store::entropy::<15>().map_err(LeaseRefusal::Busy)?;
        let id = lease::new_id(&at.namespace, &at.pool, &entropy);
        for _ in 0..ATTEMPTS {
            let mut members = self.store.members(at, &pool).await?;
            let now = (self.now)();
            if let Some(t) = &target {
                let out = quarantined::<S>(&members, t, &facts.quarantine, now);
                members.retain(|m| !out.contains(&proxy_name::<S>(m)));
            }
            let granted = {
                let held: Vec<Held<'_>> = members.iter().map(|m| S::held(m, now)).collect();
                lease::grant(
                    &held,
                    req,
                    &facts.policy,
                    facts.replicas,
                    holder,
                    &id,
                    ttl,
                    now,
                )
                .map_err(|r| LeaseRefusal::refused(at, &facts.policy, r))?
            };
            let mut written: Vec<S::Member> = Vec::new();
            let mut conflicted = false;
            for (i, bindings) in granted {
                match self
                    .store
                    .write(&members[i], Records::bindings(bindings), now)
                    .await
                {
                    Ok(Some(updated)) => written.push(updated),
                    Ok(None) => {
                        conflicted = true;
                        break;
                    }
                    Err(e) => {
                        self.take_back(written, &id).await;
                        return Err(e);
                    }
                }
            }
            if conflicted {
                // Another writer changed one of them: take back what was written, and choose
                // again from what the store has now.
                self.take_back(written, &id).await;
                continue;
            }
            return Self::describe(at, &pool, &written, &id, holder, now).ok_or_else(|| {
                LeaseRefusal::Busy("the lease was written but reads back empty".into())
            });
        }
        Err(LeaseRefusal::Busy(format!(
            "pool {}/{}: its proxies kept changing while the lease was written",
            at.namespace, at.pool
        )))
    }

    async fn renew_in(
        &self,
        holder: &str,
        at: &LeaseRef,
        id: &str,
        req: &RenewRequest,
    ) -> Result<LeaseView, LeaseRefusal> {
        let pool = self.store.pool(at).await?;
        let ttl = lease::ttl(req.ttl.as_deref(), &S::facts(&pool).policy)
            .map_err(LeaseRefusal::BadRequest)?;
        let members = self.store.members(at, &pool).await?;
        let now = (self.now)();
        let mut renewed = Vec::new();
        for m in members.iter().filter(|m| Self::holds(m, id, holder, now)) {
            let done = self
                .settle(m.clone(), |m| {
                    let h = S::held(m, now);
                    let cap = h.retiring.map(|(at, _)| at);
                    match lease::renew(&h.bindings(), id, holder, ttl, cap, now) {
                        Ok(b) => Ok(Some(Records::bindings(b))),
                        // Ended on this one since it was read.
                        Err(lease::LeaseError::NotFound(_)) => Ok(None),
                    }
                })
                .await?;
            renewed.extend(done);
        }
        if renewed.is_empty() {
            return Err(Self::gone(&pool, &members, id, holder, now));
        }
        let mut view = Self::describe(at, &pool, &renewed, id, holder, now)
            .ok_or_else(|| Self::gone(&pool, &members, id, holder, now))?;
        // What it lost, over every member (the renewed ones hold; others may have gone).
        let held: Vec<Held<'_>> = members.iter().map(|m| S::held(m, now)).collect();
        view.lost = lease::lost(&held, S::facts(&pool).lost, id, holder, now);
        Ok(view)
    }

    async fn release_in(
        &self,
        holder: &str,
        at: &LeaseRef,
        id: &str,
        req: &ReleaseRequest,
    ) -> Result<(), LeaseRefusal> {
        let pool = self.store.pool(at).await?;
        let facts = S::facts(&pool);
        let policy = facts.policy.clone();
        let banned = req.outcome == Some(Outcome::Banned);
        // A ban that names its target quarantines the proxy for that target only; one that
        // names none counts toward cordoning it for every target (`leases.cordonAfterBans`).
        let target = match (&req.target, banned) {
            (Some(host), true) => Some(report_target(host)?),
            (Some(_), false) => {
                return Err(LeaseRefusal::BadRequest(
                    "body: target: only with outcome banned".into(),
                ));
            }
            (None, _) => None,
        };
        let cooldowns = quarantine::Cooldowns::of(&facts.quarantine);
        let members = self.store.members(at, &pool).await?;
        let now = (self.now)();
        // Every ban report on the pool's proxies: a holder's reports count at a bounded rate.
        let mut in_pool: Vec<BanReport> = members
            .iter()
            .flat_map(|m| S::status(m).ban_reporters.iter().cloned())
            .collect();
        let mut quarantines_in_pool: Vec<Quarantine> = members
            .iter()
            .flat_map(|m| S::status(m).quarantines.iter().cloned())
            .collect();
        let mut released = 0;
        let mut quarantined = Vec::new();
        for m in members.iter().filter(|m| Self::holds(m, id, holder, now)) {
            let counted = &in_pool;
            let counted_quarantines = &quarantines_in_pool;
            let done = self
                .settle(m.clone(), |m| {
                    match lease::release(&S::held(m, now).bindings(), id, holder, now) {
                        Ok(b) => {
                            let mut records = Records::bindings(b);
                            if let Some(target) = &target {
                                let signal = quarantine::Signal {
                                    member: &proxy_name::<S>(m),
                                    target,
                                    holder,
                                    retry_after: None,
                                };
                                if let quarantine::Reported::Quarantined { records: q, .. } =
                                    quarantine::report(
                                        &S::status(m).quarantines,
                                        counted_quarantines,
                                        &signal,
                                        &cooldowns,
                                        now,
                                    )
                                {
                                    records.quarantines = Some(q);
                                }
                            } else if banned {
                                let reports = &S::status(m).ban_reporters;
                                if let lease::BanVerdict::Counted(r) =
                                    lease::report_ban(reports, counted, holder, now)
                                {
                                    records.bans = Some(r);
                                }
                            }
                            Ok(Some(records))
                        }
                        Err(lease::LeaseError::NotFound(_)) => Ok(None),
                    }
                })
                .await?;
            let Some(updated) = done else { continue };
            released += 1;
            let reports = S::status(&updated).ban_reporters.clone();
            // This release's own report, for the rate of the next proxy it releases.
            let who = lease::holder_digest(holder);
            let stamp = egress_core::gc::format_rfc3339(now);
            in_pool.extend(
                reports
                    .iter()
                    .filter(|r| r.reporter == who && r.at == stamp)
                    .cloned(),
            );
            if target.is_some() {
                quarantines_in_pool.extend(S::status(&updated).quarantines.iter().cloned());
                quarantined.push(updated.clone());
            } else if banned && lease::cordons(&reports, &policy) && !S::cordoned(&updated) {
                let why = format!("{} of its lease holders reported it banned", reports.len());
                self.store.cordon(&updated, &why).await;
            }
            self.store.released(&updated);
        }
        if !quarantined.is_empty() {
            self.replace_if_quarantined(&members, &quarantined, &facts.quarantine, now)
                .await;
        }
        if released == 0 {
            return Err(Self::gone(&pool, &members, id, holder, now));
        }
        if banned {
            self.metrics
                .lease_call(&at.namespace, &at.pool, "release", "banned");
        }
        Ok(())
    }
}

impl<S: LeaseStore> Leases<S> {
    async fn report_in(
        &self,
        holder: &str,
        req: &ReportRequest,
        at: &LeaseRef,
    ) -> Result<Reported, LeaseRefusal> {
        let target = report_target(&req.target)?;
        let retry_after = match req.retry_after {
            Some(s) if s > MAX_RETRY_AFTER.as_secs() => {
                return Err(LeaseRefusal::BadRequest(format!(
                    "body: retryAfter: at most {} seconds",
                    MAX_RETRY_AFTER.as_secs()
                )));
            }
            r => r.map(Duration::from_secs),
        };
        let pool = self.store.pool(at).await?;
        let facts = S::facts(&pool);
        let cooldowns = quarantine::Cooldowns::of(&facts.quarantine);
        let members = self.store.members(at, &pool).await?;
        let key = format!("{}/{}", at.namespace, req.proxy);
        let now = (self.now)();
        // A proxy another holder leases exclusively is that holder's: answered as one that
        // does not exist, so no one quarantines another's lease or learns that it is there.
        let theirs = |m: &S::Member| {
            S::held(m, now)
                .bindings()
                .iter()
                .any(|b| b.mode == lease::LeaseMode::Exclusive && b.live(now) && b.holder != holder)
        };
        let Some(member) = members
            .iter()
            .find(|m| S::key(m) == key)
            .filter(|m| !theirs(m))
        else {
            return Err(LeaseRefusal::NotFound(format!(
                "no proxy {key} in pool {}/{}",
                at.namespace, at.pool
            )));
        };
        let in_pool: Vec<Quarantine> = members
            .iter()
            .flat_map(|m| S::status(m).quarantines.iter().cloned())
            .collect();

        let signal = quarantine::Signal {
            member: &req.proxy,
            target: &target,
            holder,
            retry_after,
        };
        let over_rate = std::sync::atomic::AtomicBool::new(false);
        let written = self
            .settle(member.clone(), |m| {
                match quarantine::report(
                    &S::status(m).quarantines,
                    &in_pool,
                    &signal,
                    &cooldowns,
                    now,
                ) {
                    quarantine::Reported::Quarantined { records, .. } => Ok(Some(Records {
                        bindings: S::held(m, now).bindings(),
                        bans: None,
                        quarantines: Some(records),
                    })),
                    quarantine::Reported::Repeated { .. } => Ok(None),
                    quarantine::Reported::OverRate => {
                        over_rate.store(true, std::sync::atomic::Ordering::Relaxed);
                        Ok(None)
                    }
                }
            })
            .await?;
        if over_rate.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(LeaseRefusal::TooMany(format!(
                "this caller reported {} bans in pool {}/{} within {}s: this one is not counted",
                egress_core::target::REPORTS_PER_WINDOW,
                at.namespace,
                at.pool,
                egress_core::target::REPORT_WINDOW.as_secs()
            )));
        }
        let counted = written.is_some();
        let now_member = written.clone().unwrap_or_else(|| member.clone());
        let until = S::status(&now_member)
            .quarantines
            .iter()
            .find(|q| q.target == target)
            .map(|q| q.until.clone())
            .unwrap_or_default();
        if let Some(updated) = written {
            self.replace_if_quarantined(&members, &[updated], &facts.quarantine, now)
                .await;
        }
        Ok(Reported {
            proxy: key,
            target,
            quarantined_until: until,
            counted,
        })
    }

    /// Cordons those of `reported` (as just written) that the pool's records, `members` as
    /// read before with `reported` in their place, quarantine for `replaceAfterTargets`
    /// distinct targets at once (the cap per target applied), so the pool replaces them
    /// through its budget. The pool is not listed again: only the reported ones changed.
    async fn replace_if_quarantined(
        &self,
        members: &[S::Member],
        reported: &[S::Member],
        policy: &QuarantinePolicy,
        now: i64,
    ) {
        let current: Vec<S::Member> = members
            .iter()
            .map(|m| {
                let key = S::key(m);
                reported
                    .iter()
                    .find(|r| S::key(r) == key)
                    .unwrap_or(m)
                    .clone()
            })
            .collect();
        let due = quarantine::to_replace(&pool_view::<S>(&current, policy, now), policy);
        for m in reported {
            if due.contains(&proxy_name::<S>(m)) && !S::cordoned(m) {
                let why = format!(
                    "quarantined by {} or more targets at once",
                    policy.replace_after_targets
                );
                self.store.cordon(m, &why).await;
            }
        }
    }
}

/// The longest `retryAfter` a report may carry: the longest quarantine there is.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The target of the host a report names, or what is wrong with it.
fn report_target(host: &str) -> Result<String, LeaseRefusal> {
    let bad = |why: &str| LeaseRefusal::BadRequest(format!("body: target: {why}"));
    if host.is_empty() {
        return Err(bad("empty"));
    }
    let spelled = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        }),
    };
    if !spelled {
        return Err(bad(
            "a host name, dotted quad or [IPv6] address, without scheme, port or path",
        ));
    }
    quarantine::target_of(host).ok_or_else(|| bad("longer than a host name may be"))
}

/// Every target `members` record at `now`, within the pool's cap.
fn pool_view<S: LeaseStore>(
    members: &[S::Member],
    policy: &QuarantinePolicy,
    now: i64,
) -> std::collections::BTreeMap<String, quarantine::TargetView> {
    let names: Vec<String> = members.iter().map(proxy_name::<S>).collect();
    quarantine::pool_targets(
        names
            .iter()
            .zip(members)
            .map(|(n, m)| (n.as_str(), S::status(m).quarantines.as_slice())),
        members.len(),
        policy.max_quarantined_percent,
        now,
    )
}

/// The names of the members `target` quarantines at `now`, within the pool's cap.
fn quarantined<S: LeaseStore>(
    members: &[S::Member],
    target: &str,
    policy: &QuarantinePolicy,
    now: i64,
) -> Vec<String> {
    pool_view::<S>(members, policy, now)
        .get(target)
        .map(|v| v.quarantined.keys().cloned().collect())
        .unwrap_or_default()
}

/// The name of member `m` (its key is `namespace/name`).
fn proxy_name<S: LeaseStore>(m: &S::Member) -> String {
    let key = S::key(m);
    key.rsplit_once('/')
        .map_or(key.clone(), |(_, n)| n.to_string())
}

#[async_trait::async_trait]
impl<S: LeaseStore> LeaseBook for Leases<S> {
    async fn acquire(&self, holder: &str, req: &LeaseRequest) -> Result<LeaseView, LeaseRefusal> {
        let at = LeaseRef {
            namespace: req.namespace.clone(),
            pool: req.pool.clone(),
        };
        let r = self.acquire_waking(holder, req, &at).await;
        count_call(&self.metrics, &at, "acquire", &r);
        r
    }

    async fn renew(
        &self,
        holder: &str,
        at: &LeaseRef,
        id: &str,
        req: &RenewRequest,
    ) -> Result<LeaseView, LeaseRefusal> {
        let r = self.renew_in(holder, at, id, req).await;
        count_call(&self.metrics, at, "renew", &r);
        r
    }

    async fn release(
        &self,
        holder: &str,
        at: &LeaseRef,
        id: &str,
        req: &ReleaseRequest,
    ) -> Result<(), LeaseRefusal> {
        let r = self.release_in(holder, at, id, req).await;
        count_call(&self.metrics, at, "release", &r);
        r
    }

    async fn view(&self, holder: &str, at: &LeaseRef, id: &str) -> Result<LeaseView, LeaseRefusal> {
        let pool = self.store.pool(at).await?;
        let members = self.store.members(at, &pool).await?;
        let now = (self.now)();
        Self::describe(at, &pool, &members, id, holder, now)
            .ok_or_else(|| Self::gone(&pool, &members, id, holder, now))
    }

    async fn report(&self, holder: &str, req: &ReportRequest) -> Result<Reported, LeaseRefusal> {
        let at = LeaseRef {
            namespace: req.namespace.clone(),
            pool: req.pool.clone(),
        };
        let r = self.report_in(holder, req, &at).await;
        count_call(&self.metrics, &at, "report", &r);
        r
    }

    async fn list(&self, holder: &str, at: &LeaseRef) -> Result<Vec<LeaseView>, LeaseRefusal> {
        let pool = self.store.pool(at).await?;
        let members = self.store.members(at, &pool).await?;
        let now = (self.now)();
        let held: Vec<Held<'_>> = members.iter().map(|m| S::held(m, now)).collect();
        Ok(lease::held_by(&held, holder, now)
            .into_iter()
            .filter_map(|id| Self::describe(at, &pool, &members, &id, holder, now))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::Mutex;

    const NOW: i64 = 1_800_000_000;

    /// A Proxy as the test store keeps it.
    #[derive(Clone)]
    struct Member {
        name: String,
        status: ProxyStatus,
        version: u64,
    }

    /// What the next write of a member meets.
    #[derive(Clone, Copy, PartialEq)]
    enum Next {
        Lands,
        /// Another writer changed it since it was read.
        Changed,
        /// The store failed.
        Fails,
    }

    /// Members kept in memory, each write landing on its version; `next` says what the next
    /// write of a named member meets.
    struct Memory {
        members: Mutex<Vec<Member>>,
        next: Mutex<Vec<(String, Next)>>,
        writes: Mutex<Vec<String>>,
        cordons: Mutex<Vec<(String, String)>>,
        policy: LeasePolicy,
        usage: Mutex<Vec<egress_core::quota::LeaseUsage>>,
    }

    impl Memory {
        fn new(names: &[&str]) -> Self {
            let ready = ProxyStatus {
                ip: Some("10.0.0.1".into()),
                conditions: vec![egress_core::Condition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: "Running".into(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: egress_core::gc::format_rfc3339(NOW - 30),
                }],
                ..Default::default()
            };
            Self {
                members: Mutex::new(
                    names
                        .iter()
                        .map(|n| Member {
                            name: n.to_string(),
                            status: ready.clone(),
                            version: 0,
                        })
                        .collect(),
                ),
                next: Mutex::new(Vec::new()),
                writes: Mutex::new(Vec::new()),
                cordons: Mutex::new(Vec::new()),
                policy: serde_json::from_str(r#"{"maxPerHolder": "100%"}"#).unwrap(),
                usage: Mutex::new(Vec::new()),
            }
        }

        fn bindings(&self, name: &str) -> Vec<LeaseBinding> {
            let members = self.members.lock().unwrap();
            let m = members.iter().find(|m| m.name == name).unwrap();
            m.status.leases.clone()
        }
    }

    #[async_trait::async_trait]
    impl LeaseStore for Memory {
        type Pool = LeasePolicy;
        type Member = Member;

        async fn pool(&self, _: &LeaseRef) -> Result<LeasePolicy, LeaseRefusal> {
            Ok(self.policy.clone())
        }
        fn facts(pool: &LeasePolicy) -> PoolFacts<'_> {
            PoolFacts {
                policy: pool.clone(),
                replicas: 2,
                quarantine: QuarantinePolicy {
                    replace_after_targets: 2,
                    max_quarantined_percent: 100,
                    ..QuarantinePolicy::default()
                },
                lost: &[],
                cold_start_wait: None,
            }
        }
        async fn members(
            &self,
            _: &LeaseRef,
            _: &LeasePolicy,
        ) -> Result<Vec<Member>, LeaseRefusal> {
            Ok(self.members.lock().unwrap().clone())
        }
        fn held(m: &Member, now: i64) -> Held<'_> {
            Held {
                proxy: egress_core::discovery::Candidate {
                    namespace: "ns",
                    name: &m.name,
                    provider: "p",
                    port: 3128,
                    zone: None,
                    pool: Some("web"),
                    cordoned: false,
                    draining: false,
                    exclusively_leased: lease::exclusively_leased(
                        &m.status.leases,
                        m.status.ip.as_deref(),
                        now,
                    ),
                    status: &m.status,
                    credential: None,
                },
                retiring: None,
                created_at: Some(NOW - 60),
            }
        }
        fn status(m: &Member) -> &ProxyStatus {
            &m.status
        }
        fn cordoned(_: &Member) -> bool {
            false
        }
        fn key(m: &Member) -> String {
            format!("ns/{}", m.name)
        }
        async fn namespace_members(&self, _: &str) -> Result<Vec<Member>, LeaseRefusal> {
            Ok(self.members.lock().unwrap().clone())
        }
        async fn namespace_usage(
            &self,
            _: &str,
        ) -> Result<Vec<egress_core::quota::LeaseUsage>, LeaseRefusal> {
            Ok(self.usage.lock().unwrap().clone())
        }
        async fn write(
            &self,
            m: &Member,
            records: Records,
            now: i64,
        ) -> Result<Option<Member>, LeaseRefusal> {
            self.writes.lock().unwrap().push(m.name.clone());
            let meets = {
                let mut next = self.next.lock().unwrap();
                match next.iter().position(|(n, _)| *n == m.name) {
                    Some(i) => next.remove(i).1,
                    None => Next::Lands,
                }
            };
            let mut members = self.members.lock().unwrap();
            let stored = members.iter_mut().find(|s| s.name == m.name).unwrap();
            match meets {
                Next::Fails => return Err(LeaseRefusal::Busy("the store failed".into())),
                Next::Changed => stored.version += 1,
                Next::Lands => {}
            }
            if stored.version != m.version {
                return Ok(None);
            }
            stored.status.leases = lease::with_replaced(
                &stored.status.leases,
                stored.status.ip.as_deref(),
                records.bindings,
                now,
            );
            if let Some(q) = records.quarantines {
                stored.status.quarantines = q;
            }
            stored.version += 1;
            Ok(Some(stored.clone()))
        }
        async fn reread(&self, m: &Member) -> Result<Option<Member>, LeaseRefusal> {
            let members = self.members.lock().unwrap();
            Ok(members.iter().find(|s| s.name == m.name).cloned())
        }
        async fn cordon(&self, m: &Member, why: &str) {
            self.cordons
                .lock()
                .unwrap()
                .push((m.name.clone(), why.to_string()));
        }
    }

    fn leases(store: Memory) -> Leases<Memory> {
        Leases::with_store(Arc::new(store), Arc::new(|| NOW), Arc::new(Metrics::new()))
    }

    fn ask(count: u32) -> LeaseRequest {
        serde_json::from_value(serde_json::json!({
            "namespace": "ns", "pool": "web", "count": count, "mode": "Exclusive", "ttl": "10m"
        }))
        .unwrap()
    }

    /// `concurrentLeases`: a holder's rule counts its own proxies leased at once, its
    /// namespace's counts everyone's; a lease that would pass either is refused (429) naming
    /// it, before anything is written; a release frees its place.
    #[tokio::test]
    async fn a_lease_past_a_concurrent_leases_quota_is_refused_naming_it() {
        let rules = egress_core::quota::parse(
            "quotas:\n- {namespace: ns, holder: spider, concurrentLeases: 1}\n- {namespace: ns, concurrentLeases: 2}\n- {namespace: other, concurrentLeases: 0}\n",
        )
        .unwrap();
        let l = leases(Memory::new(&["a", "b", "c"])).with_quotas(rules);
        let first = l.acquire("spider", &ask(1)).await.unwrap();
        let writes = l.store().writes.lock().unwrap().len();
        match l.acquire("spider", &ask(1)).await {
            Err(LeaseRefusal::TooMany(m)) => {
                assert!(
                    m.contains("concurrentLeases of holder spider in namespace ns"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            l.store().writes.lock().unwrap().len(),
            writes,
            "nothing written"
        );
        // rival has no rule of its own; the namespace's allows one more, not two.
        assert!(matches!(
            l.acquire("rival", &ask(2)).await,
            Err(LeaseRefusal::TooMany(m)) if m.contains("of namespace ns")
        ));
        l.acquire("rival", &ask(1)).await.unwrap();
        // Released, spider's lease frees its place under both.
        l.release(
            "spider",
            &LeaseRef {
                namespace: "ns".into(),
                pool: "web".into(),
            },
            &first.id,
            &ReleaseRequest::default(),
        )
        .await
        .unwrap();
        l.acquire("spider", &ask(1)).await.unwrap();
    }

    /// `memberHoursPerDay`: once the pools' counted member-seconds of the day and what was
    /// held since reach a holder's quota, its next lease is refused (429) naming it and when
    /// it resets; another holder is not held back; yesterday's hours count for nothing.
    #[tokio::test]
    async fn a_lease_past_a_member_hours_quota_is_refused_until_the_next_day() {
        let rules = egress_core::quota::parse(
            "quotas:\n- {namespace: ns, holder: spider, memberHoursPerDay: 1}\n",
        )
        .unwrap();
        let l = leases(Memory::new(&["a", "b"])).with_quotas(rules.clone());
        let usage = |day_of: i64, seconds: u64, holding: u64| egress_core::quota::LeaseUsage {
            day: (day_of / 86_400) as u64,
            accounted_at: day_of,
            holders: vec![egress_core::quota::HolderUsage {
                holder: "spider".into(),
                member_seconds: seconds,
                holding,
            }],
        };
        // 3000 s counted and one member held for the 600 s since: an hour.
        *l.store().usage.lock().unwrap() = vec![usage(NOW - 600, 3000, 1)];
        match l.acquire("spider", &ask(1)).await {
            Err(LeaseRefusal::TooMany(m)) => {
                assert!(m.contains("memberHoursPerDay of holder spider"), "{m}");
                assert!(m.contains("resets in"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        l.acquire("rival", &ask(1)).await.unwrap();
        // A minute short of the hour: granted.
        *l.store().usage.lock().unwrap() = vec![usage(NOW - 540, 3000, 1)];
        l.acquire("spider", &ask(1)).await.unwrap();
        // Yesterday's hours count for nothing today.
        let l = leases(Memory::new(&["a"])).with_quotas(rules);
        *l.store().usage.lock().unwrap() = vec![usage(NOW - 86_400, 90_000, 0)];
        l.acquire("spider", &ask(1)).await.unwrap();
    }

    /// A lease of two whose second proxy changed after it was read: the binding already
    /// written on the first is taken back, both are read again, and the lease is granted on
    /// what the store has then, each proxy holding it once.
    #[tokio::test]
    async fn a_conflict_on_a_later_proxy_takes_back_the_earlier_and_chooses_again() {
        let store = Memory::new(&["a", "b"]);
        store.next.lock().unwrap().push(("b".into(), Next::Changed));
        let l = leases(store);
        let view = l.acquire("spider", &ask(2)).await.unwrap();
        assert_eq!(view.proxies.len(), 2);
        let store = l.store();
        // a, b (refused), a taken back, then a and b again.
        assert_eq!(*store.writes.lock().unwrap(), ["a", "b", "a", "a", "b"]);
        for name in ["a", "b"] {
            let ids: Vec<_> = store.bindings(name).into_iter().map(|b| b.id).collect();
            assert_eq!(ids, std::slice::from_ref(&view.id), "{name}");
        }
    }

    /// A store that fails while a lease of two is written: what was written is taken back, and
    /// the call is answered with the failure.
    #[tokio::test]
    async fn a_store_failure_mid_lease_takes_back_what_was_written() {
        let store = Memory::new(&["a", "b"]);
        store.next.lock().unwrap().push(("b".into(), Next::Fails));
        let l = leases(store);
        assert_eq!(
            l.acquire("spider", &ask(2)).await,
            Err(LeaseRefusal::Busy("the store failed".into()))
        );
        for name in ["a", "b"] {
            assert!(l.store().bindings(name).is_empty(), "{name}");
        }
    }

    fn report_of(proxy: &str, target: &str) -> ReportRequest {
        serde_json::from_value(serde_json::json!({
            "namespace": "ns", "pool": "web", "proxy": proxy, "target": target
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_report_quarantines_the_proxy_for_the_target_once_per_holder() {
        let l = leases(Memory::new(&["a", "b"]));
        let r = l
            .report("spider", &report_of("a", "www.shop.example.co.uk"))
            .await
            .unwrap();
        assert_eq!(r.target, "example.co.uk");
        assert_eq!(r.proxy, "ns/a");
        assert!(r.counted);
        let until = egress_core::gc::parse_rfc3339(&r.quarantined_until).unwrap();
        assert!(until > NOW + 200, "{r:?}");
        let stored = l.store().members.lock().unwrap()[0]
            .status
            .quarantines
            .clone();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].target, "example.co.uk");
        // Again by the same holder: counted once, nothing written.
        let writes = l.store().writes.lock().unwrap().len();
        let again = l
            .report("spider", &report_of("a", "img.example.co.uk"))
            .await
            .unwrap();
        assert!(!again.counted);
        assert_eq!(again.quarantined_until, r.quarantined_until);
        assert_eq!(l.store().writes.lock().unwrap().len(), writes);
        // b keeps its record empty: the report was of a only.
        assert!(
            l.store().members.lock().unwrap()[1]
                .status
                .quarantines
                .is_empty()
        );
    }

    #[tokio::test]
    async fn a_report_is_refused_naming_what_is_wrong_before_anything_is_written() {
        let l = leases(Memory::new(&["a"]));
        for (proxy, target, field) in [
            ("a", "", "target"),
            ("a", "https://example.com/x", "target"),
            ("a", "example.com:443", "target"),
            ("z", "example.com", "ns/z"),
        ] {
            let e = l
                .report("spider", &report_of(proxy, target))
                .await
                .unwrap_err();
            let text = format!("{e:?}");
            assert!(text.contains(field), "{proxy} {target}: {text}");
        }
        let mut long = report_of("a", "example.com");
        long.retry_after = Some(10 * 24 * 3600);
        assert!(matches!(
            l.report("spider", &long).await,
            Err(LeaseRefusal::BadRequest(m)) if m.contains("retryAfter")
        ));
        assert!(l.store().writes.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_report_that_meets_a_changed_proxy_is_decided_again_on_what_it_became() {
        let store = Memory::new(&["a"]);
        store.next.lock().unwrap().push(("a".into(), Next::Changed));
        let l = leases(store);
        let r = l
            .report("spider", &report_of("a", "example.com"))
            .await
            .unwrap();
        assert!(r.counted);
        assert_eq!(l.store().writes.lock().unwrap().len(), 2);
        assert_eq!(
            l.store().members.lock().unwrap()[0]
                .status
                .quarantines
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn a_holders_reports_past_its_rate_are_refused_with_429() {
        let names: Vec<String> = (0..=egress_core::target::REPORTS_PER_WINDOW)
            .map(|i| format!("m{i}"))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let l = leases(Memory::new(&refs));
        for n in &names[..egress_core::target::REPORTS_PER_WINDOW] {
            l.report("spider", &report_of(n, "example.com"))
                .await
                .unwrap();
        }
        let last = names.last().unwrap();
        assert!(matches!(
            l.report("spider", &report_of(last, "example.com")).await,
            Err(LeaseRefusal::TooMany(_))
        ));
        // Another holder is not held back.
        assert!(
            l.report("other", &report_of(last, "example.com"))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_proxy_quarantined_by_enough_targets_is_cordoned_and_not_before() {
        // The store's pool replaces after 2 targets.
        let l = leases(Memory::new(&["a", "b"]));
        l.report("spider", &report_of("a", "one.example"))
            .await
            .unwrap();
        assert!(l.store().cordons.lock().unwrap().is_empty());
        l.report("spider", &report_of("b", "two.example"))
            .await
            .unwrap();
        assert!(l.store().cordons.lock().unwrap().is_empty());
        l.report("spider", &report_of("a", "two.example"))
            .await
            .unwrap();
        let cordons = l.store().cordons.lock().unwrap().clone();
        assert_eq!(cordons.len(), 1, "{cordons:?}");
        assert_eq!(cordons[0].0, "a");
        assert!(cordons[0].1.contains("2 or more targets"), "{cordons:?}");
    }

    #[tokio::test]
    async fn a_release_banned_with_a_target_quarantines_instead_of_counting_a_ban() {
        let l = leases(Memory::new(&["a"]));
        let view = l.acquire("spider", &ask(1)).await.unwrap();
        let at = LeaseRef {
            namespace: "ns".into(),
            pool: "web".into(),
        };
        let release: ReleaseRequest = serde_json::from_value(serde_json::json!({
            "outcome": "banned", "target": "www.example.com"
        }))
        .unwrap();
        l.release("spider", &at, &view.id, &release).await.unwrap();
        let status = l.store().members.lock().unwrap()[0].status.clone();
        assert!(
            status
                .leases
                .iter()
                .all(|b| b.id != view.id || !b.live(NOW))
        );
        assert_eq!(status.quarantines.len(), 1);
        assert_eq!(status.quarantines[0].target, "example.com");
        assert_eq!(status.ban_reporters.len(), 0);
        // A target without a ban is a mistake, said before anything is written.
        let view = l.acquire("spider", &ask(1)).await.unwrap();
        let ok_with_target: ReleaseRequest = serde_json::from_value(serde_json::json!({
            "target": "www.example.com"
        }))
        .unwrap();
        assert!(matches!(
            l.release("spider", &at, &view.id, &ok_with_target).await,
            Err(LeaseRefusal::BadRequest(m)) if m.contains("target")
        ));
    }

    #[tokio::test]
    async fn a_lease_for_a_target_takes_no_proxy_that_target_quarantines() {
        let l = leases(Memory::new(&["a", "b"]));
        l.report("spider", &report_of("a", "www.example.com"))
            .await
            .unwrap();
        let mut req = ask(1);
        req.target = Some("shop.example.com".into());
        for _ in 0..4 {
            let view = l.acquire("other", &req).await.unwrap();
            assert!(
                view.proxies.iter().all(|p| p.proxy.name != "a"),
                "{:?}",
                view.proxies
            );
            let at = LeaseRef {
                namespace: "ns".into(),
                pool: "web".into(),
            };
            l.release("other", &at, &view.id, &ReleaseRequest::default())
                .await
                .unwrap();
        }
        // Both free and b leased: a lease for the target finds none, one for another takes a.
        let _b = l.acquire("other", &req).await.unwrap();
        assert!(matches!(
            l.acquire("third", &req).await,
            Err(LeaseRefusal::Unavailable { .. })
        ));
        let mut elsewhere = ask(1);
        elsewhere.target = Some("example.org".into());
        let view = l.acquire("third", &elsewhere).await.unwrap();
        assert_eq!(view.proxies[0].proxy.name, "a");
    }

    #[tokio::test]
    async fn another_holders_exclusive_proxy_cannot_be_reported_and_answers_as_unknown() {
        let l = leases(Memory::new(&["a"]));
        let _lease = l.acquire("spider", &ask(1)).await.unwrap();
        let unknown = l
            .report("other", &report_of("z", "example.com"))
            .await
            .unwrap_err();
        let theirs = l
            .report("other", &report_of("a", "example.com"))
            .await
            .unwrap_err();
        assert!(matches!(&theirs, LeaseRefusal::NotFound(m) if m.contains("ns/a")));
        assert_eq!(
            format!("{theirs:?}").replace("ns/a", "ns/z"),
            format!("{unknown:?}"),
            "answered as a proxy that does not exist"
        );
        assert!(
            l.store().members.lock().unwrap()[0]
                .status
                .quarantines
                .is_empty()
        );
        // Its holder may.
        assert!(
            l.report("spider", &report_of("a", "example.com"))
                .await
                .unwrap()
                .counted
        );
    }
}
