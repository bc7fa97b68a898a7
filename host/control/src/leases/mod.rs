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
    /// 429: the caller holds as many of the pool's proxies as `leases.maxPerHolder` allows.
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
}

/// What a pool's leases go by.
#[derive(Debug, Clone)]
pub struct PoolFacts<'a> {
    /// `spec.leases`.
    pub policy: LeasePolicy,
    /// `spec.replicas`, which `leases.maxPerHolder` may be a percentage of.
    pub replicas: u32,
    /// What its leases lost (`status.lostLeases`).
    pub lost: &'a [LostProxy],
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
    /// Writes `bindings` (and the ban reports `bans`) as the records of `m` on the condition
    /// that it is the version read, keeping its live bindings of a replaced instance (their
    /// holders' record of the loss). `Ok(None)`: it changed since, or is gone.
    async fn write(
        &self,
        m: &Self::Member,
        bindings: Vec<LeaseBinding>,
        bans: Option<Vec<BanReport>>,
        now: i64,
    ) -> Result<Option<Self::Member>, LeaseRefusal>;
    /// `m` as it is now, after a write found it changed; None when it is gone.
    async fn reread(&self, m: &Self::Member) -> Result<Option<Self::Member>, LeaseRefusal>;
    /// Cordons a proxy enough of its holders reported banned (`bans` of them): out of discovery
    /// and leases, to be replaced through the pool's budget. Best effort, said when it fails.
    async fn cordon(&self, m: &Self::Member, bans: usize);
    /// A release landed on `m` (a draining proxy may go now).
    fn released(&self, _m: &Self::Member) {}
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

/// The lease flow over store `S`: the [`LeaseBook`] the API calls.
pub struct Leases<S> {
    store: Arc<S>,
    now: Clock,
    metrics: Arc<Metrics>,
}

/// A member's change: its new bindings and, when they changed, its ban reports.
type Change = Option<(Vec<LeaseBinding>, Option<Vec<BanReport>>)>;

impl<S: LeaseStore> Leases<S> {
    pub fn with_store(store: Arc<S>, now: Clock, metrics: Arc<Metrics>) -> Self {
        Self {
            store,
            now,
            metrics,
        }
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
            let Some((bindings, bans)) = change(&current)? else {
                return Ok(None);
            };
            let now = (self.now)();
            if let Some(updated) = self.store.write(&current, bindings, bans, now).await? {
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
                        .then(|| (lease::without(&b, id, now), None)))
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
        let entropy = crate::credential_store::entropy::<15>().map_err(LeaseRefusal::Busy)?;
        let id = lease::new_id(&at.namespace, &at.pool, &entropy);
        for _ in 0..ATTEMPTS {
            let members = self.store.members(at, &pool).await?;
            let now = (self.now)();
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
                match self.store.write(&members[i], bindings, None, now).await {
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
                        Ok(b) => Ok(Some((b, None))),
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
        let policy = S::facts(&pool).policy;
        let banned = req.outcome == Some(Outcome::Banned);
        let members = self.store.members(at, &pool).await?;
        let now = (self.now)();
        // Every ban report on the pool's proxies: a holder's reports count at a bounded rate.
        let mut in_pool: Vec<BanReport> = members
            .iter()
            .flat_map(|m| S::status(m).ban_reporters.iter().cloned())
            .collect();
        let mut released = 0;
        for m in members.iter().filter(|m| Self::holds(m, id, holder, now)) {
            let counted = &in_pool;
            let done = self
                .settle(m.clone(), |m| {
                    match lease::release(&S::held(m, now).bindings(), id, holder, now) {
                        Ok(b) => {
                            let reports = &S::status(m).ban_reporters;
                            let bans = match banned
                                .then(|| lease::report_ban(reports, counted, holder, now))
                            {
                                Some(lease::BanVerdict::Counted(r)) => Some(r),
                                _ => None,
                            };
                            Ok(Some((b, bans)))
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
            let at = egress_core::gc::format_rfc3339(now);
            in_pool.extend(
                reports
                    .iter()
                    .filter(|r| r.reporter == who && r.at == at)
                    .cloned(),
            );
            if banned && lease::cordons(&reports, &policy) && !S::cordoned(&updated) {
                self.store.cordon(&updated, reports.len()).await;
            }
            self.store.released(&updated);
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

#[async_trait::async_trait]
impl<S: LeaseStore> LeaseBook for Leases<S> {
    async fn acquire(&self, holder: &str, req: &LeaseRequest) -> Result<LeaseView, LeaseRefusal> {
        let at = LeaseRef {
            namespace: req.namespace.clone(),
            pool: req.pool.clone(),
        };
        let r = self.acquire_in(holder, req, &at).await;
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
        policy: LeasePolicy,
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
                policy: serde_json::from_str(r#"{"maxPerHolder": "100%"}"#).unwrap(),
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
                lost: &[],
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
        async fn write(
            &self,
            m: &Member,
            bindings: Vec<LeaseBinding>,
            _: Option<Vec<BanReport>>,
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
                bindings,
                now,
            );
            stored.version += 1;
            Ok(Some(stored.clone()))
        }
        async fn reread(&self, m: &Member) -> Result<Option<Member>, LeaseRefusal> {
            let members = self.members.lock().unwrap();
            Ok(members.iter().find(|s| s.name == m.name).cloned())
        }
        async fn cordon(&self, _: &Member, _: usize) {}
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
}
