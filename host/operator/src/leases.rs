//! The lease API's book: leases recorded as bindings on the leased Proxies' status
//! (`egress_core::lease`), each write a merge patch of the status subresource that names the
//! resourceVersion it was decided on. Two operator replicas, or two callers of one, racing for
//! the last free proxy both write on the version they read; the API server stores the first
//! and refuses the second with 409, which reads again and finds the proxy taken. A lease of
//! several proxies is all or none: bindings already written are taken back when a later one
//! cannot be.
//!
//! Every call reads the pool's Proxies from the API server (a list of one pool by label), not
//! from a watch cache, so a lease granted by one replica is renewed by another at once; a
//! lease id names its namespace and pool (`LeaseRef`), so a call is authorised before anything
//! is read.

use crate::metrics::Metrics;
use crate::server::StoreSource;
use egress_core::discovery::{CORDON_ANNOTATION, POOL_LABEL};
use egress_core::lease::{
    self, BanReport, Held, LeaseBinding, LeaseRef, LeaseRequest, LeaseView, LostProxy, Outcome,
    ReleaseRequest, RenewRequest,
};
use egress_k8s_api::api_error_summary;
use egress_k8s_api::crd::{Proxy, ProxyPool};
use egress_time::now::Clock;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
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

    pub fn from_lease(e: lease::LeaseError) -> Self {
        match e {
            lease::LeaseError::NotFound(_) => LeaseRefusal::NotFound(e.to_string()),
        }
    }

    fn api(e: &kube::Error) -> Self {
        LeaseRefusal::Busy(format!("the API server failed: {}", api_error_summary(e)))
    }
}

/// What the HTTP API asks of leases; the operator keeps them on Proxies' status
/// ([`KubeLeases`]).
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

/// Counts lease call `op` on the pool of `at` by how it ended
/// (`egress_proxies_leases_total`), for either book.
pub fn count_call(
    metrics: &Metrics,
    at: &LeaseRef,
    op: &str,
    r: &Result<impl Sized, LeaseRefusal>,
) {
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

pub struct KubeLeases {
    client: kube::Client,
    /// The credentials of the proxies handed out.
    source: Arc<StoreSource>,
    now: Clock,
    metrics: Arc<Metrics>,
}

impl KubeLeases {
    pub fn new(
        client: kube::Client,
        source: Arc<StoreSource>,
        now: Clock,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            source,
            now,
            metrics,
        }
    }

    async fn pool(&self, at: &LeaseRef) -> Result<ProxyPool, LeaseRefusal> {
        let pools: Api<ProxyPool> = Api::namespaced(self.client.clone(), &at.namespace);
        match pools.get(&at.pool).await {
            Ok(p) => Ok(p),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(LeaseRefusal::NotFound(format!(
                "no ProxyPool {}/{}",
                at.namespace, at.pool
            ))),
            Err(e) => Err(LeaseRefusal::api(&e)),
        }
    }

    /// The pool's Proxies as the API server has them now (not being deleted, controlled by
    /// the pool).
    async fn members(&self, pool: &ProxyPool) -> Result<Vec<Proxy>, LeaseRefusal> {
        let listed = self
            .proxies(&pool.namespace().unwrap_or_default())
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}={}", pool.name_any())))
            .await
            .map_err(|e| LeaseRefusal::api(&e))?;
        let uid = pool.meta().uid.clone().unwrap_or_default();
        Ok(listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| egress_k8s_api::members::controlled_by(p, &uid))
            .collect())
    }

    fn proxies(&self, ns: &str) -> Api<Proxy> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Writes `bindings` (and the ban reports `bans`) as the status of `p` on the condition
    /// that it is the version read, keeping its live bindings of a replaced instance (their
    /// holders' record of the loss). `Ok(None)`: it changed since (409) or is gone (404).
    async fn write(
        &self,
        p: &Proxy,
        bindings: Vec<LeaseBinding>,
        bans: Option<Vec<BanReport>>,
    ) -> Result<Option<Proxy>, LeaseRefusal> {
        let stored = p.status.clone().unwrap_or_default();
        let bindings =
            lease::with_replaced(&stored.leases, stored.ip.as_deref(), bindings, (self.now)());
        let mut status = json!({ "leases": bindings });
        if let Some(b) = bans {
            status["banReports"] = json!(b.len());
            status["banReporters"] = json!(b);
        }
        let patch = json!({
            "metadata": {"resourceVersion": p.resource_version()},
            "status": status,
        });
        match self
            .proxies(&p.namespace().unwrap_or_default())
            .patch_status(
                &p.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(updated) => Ok(Some(updated)),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(None),
            Err(e) => Err(LeaseRefusal::api(&e)),
        }
    }

    /// Applies `change` to the bindings of Proxy `name` until the write lands on the version
    /// it was decided on (reading again after each conflict), or the change says there is
    /// nothing to do (`Ok(None)`).
    async fn settle(
        &self,
        first: Proxy,
        change: impl Fn(
            &Proxy,
        )
            -> Result<Option<(Vec<LeaseBinding>, Option<Vec<BanReport>>)>, LeaseRefusal>,
    ) -> Result<Option<Proxy>, LeaseRefusal> {
        let ns = first.namespace().unwrap_or_default();
        let name = first.name_any();
        let mut current = first;
        for _ in 0..ATTEMPTS {
            let Some((bindings, bans)) = change(&current)? else {
                return Ok(None);
            };
            if let Some(updated) = self.write(&current, bindings, bans).await? {
                return Ok(Some(updated));
            }
            current = match self.proxies(&ns).get_status(&name).await {
                Ok(p) => p,
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
                Err(e) => return Err(LeaseRefusal::api(&e)),
            };
        }
        Err(LeaseRefusal::Busy(format!(
            "Proxy {ns}/{name} kept changing while its lease was written"
        )))
    }

    /// Takes lease `id` off every Proxy of `written` (an acquisition that could not have all
    /// it asked for). Best effort: a binding left behind expires with its ttl.
    async fn take_back(&self, written: Vec<Proxy>, id: &str) {
        for p in written {
            let now = (self.now)();
            let r = self
                .settle(p, |p| {
                    let b = bindings(p);
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

    /// What the lease views of `members` borrow: each one's status, namespace and credential.
    fn facts(&self, members: &[Proxy]) -> Facts {
        Facts {
            statuses: members
                .iter()
                .map(|p| p.status.clone().unwrap_or_default())
                .collect(),
            namespaces: members
                .iter()
                .map(|p| p.namespace().unwrap_or_default())
                .collect(),
            credentials: members
                .iter()
                .map(|p| self.source.credential_of(p))
                .collect(),
        }
    }

    /// Lease `id` as its holder `holder` is told, from the Proxies that hold it and what the
    /// pool's status says it lost; None when it holds none for `holder`.
    fn describe(
        &self,
        pool: &ProxyPool,
        members: &[Proxy],
        id: &str,
        holder: &str,
        now: i64,
    ) -> Option<LeaseView> {
        let facts = self.facts(members);
        lease::view(
            &pool.namespace().unwrap_or_default(),
            &pool.name_any(),
            &held(members, &facts, now),
            pool_lost(pool),
            id,
            holder,
            now,
        )
    }

    /// 404 for lease `id`, saying what it lost when the pool's status (or a Proxy whose
    /// instance was replaced) remembers and it was `holder`'s.
    fn gone(
        &self,
        pool: &ProxyPool,
        members: &[Proxy],
        id: &str,
        holder: &str,
        now: i64,
    ) -> LeaseRefusal {
        let facts = self.facts(members);
        LeaseRefusal::NotFound(lease::gone(
            &held(members, &facts, now),
            pool_lost(pool),
            id,
            holder,
            now,
        ))
    }

    fn count(&self, at: &LeaseRef, op: &str, r: &Result<impl Sized, LeaseRefusal>) {
        count_call(&self.metrics, at, op, r);
    }
}

/// The members' statuses, namespaces and credentials, which their [`Held`] views borrow.
struct Facts {
    statuses: Vec<egress_core::ProxyStatus>,
    namespaces: Vec<String>,
    credentials: Vec<Option<egress_core::credential::ProxyCredential>>,
}

/// `members` as the core's lease functions read them.
fn held<'a>(members: &'a [Proxy], facts: &'a Facts, now: i64) -> Vec<Held<'a>> {
    members
        .iter()
        .enumerate()
        .map(|(i, p)| Held {
            proxy: egress_k8s_api::members::candidate(
                p,
                &facts.statuses[i],
                &facts.namespaces[i],
                facts.credentials[i].as_ref(),
                now,
            ),
            retiring: egress_core::pool::retiring(p.annotations()),
            created_at: p
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
        })
        .collect()
}

/// The bindings of `p` that hold its instance now (`lease::holding`).
fn bindings(p: &Proxy) -> Vec<LeaseBinding> {
    p.status
        .as_ref()
        .map(|s| lease::holding(&s.leases, s.ip.as_deref()))
        .unwrap_or_default()
}

/// Whether `p` carries the cordon mark already.
fn cordoned(p: &Proxy) -> bool {
    p.annotations()
        .get(CORDON_ANNOTATION)
        .is_some_and(|v| v == "true")
}

fn pool_lost(pool: &ProxyPool) -> &[LostProxy] {
    pool.status
        .as_ref()
        .map_or(&[][..], |s| s.lost_leases.as_slice())
}

#[async_trait::async_trait]
impl LeaseBook for KubeLeases {
    async fn acquire(&self, holder: &str, req: &LeaseRequest) -> Result<LeaseView, LeaseRefusal> {
        let at = LeaseRef {
            namespace: req.namespace.clone(),
            pool: req.pool.clone(),
        };
        let r = self.acquire_in(holder, req, &at).await;
        self.count(&at, "acquire", &r);
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
        self.count(at, "renew", &r);
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
        self.count(at, "release", &r);
        r
    }

    async fn view(&self, holder: &str, at: &LeaseRef, id: &str) -> Result<LeaseView, LeaseRefusal> {
        let pool = self.pool(at).await?;
        let members = self.members(&pool).await?;
        let now = (self.now)();
        self.describe(&pool, &members, id, holder, now)
            .ok_or_else(|| self.gone(&pool, &members, id, holder, now))
    }

    async fn list(&self, holder: &str, at: &LeaseRef) -> Result<Vec<LeaseView>, LeaseRefusal> {
        let pool = self.pool(at).await?;
        let members = self.members(&pool).await?;
        let now = (self.now)();
        let facts = self.facts(&members);
        let ids = lease::held_by(&held(&members, &facts, now), holder, now);
        Ok(ids
            .into_iter()
            .filter_map(|id| self.describe(&pool, &members, &id, holder, now))
            .collect())
    }
}

impl KubeLeases {
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
        let pool = self.pool(at).await?;
        let policy = pool.spec.leases.clone().unwrap_or_default();
        let ttl = lease::ttl(req.ttl.as_deref(), &policy).map_err(LeaseRefusal::BadRequest)?;
        let entropy =
            egress_control::credential_store::entropy::<15>().map_err(LeaseRefusal::Busy)?;
        let id = lease::new_id(&at.namespace, &at.pool, &entropy);
        for _ in 0..ATTEMPTS {
            let members = self.members(&pool).await?;
            let now = (self.now)();
            let facts = self.facts(&members);
            let granted = lease::grant(
                &held(&members, &facts, now),
                req,
                &policy,
                pool.spec.replicas,
                holder,
                &id,
                ttl,
                now,
            )
            .map_err(|r| LeaseRefusal::refused(at, &policy, r))?;
            let mut written: Vec<Proxy> = Vec::new();
            let mut conflicted = false;
            for (i, bindings) in granted {
                match self.write(&members[i], bindings, None).await {
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
                // again from what the API server has now.
                self.take_back(written, &id).await;
                continue;
            }
            return self
                .describe(&pool, &written, &id, holder, now)
                .ok_or_else(|| {
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
        let pool = self.pool(at).await?;
        let policy = pool.spec.leases.clone().unwrap_or_default();
        let ttl = lease::ttl(req.ttl.as_deref(), &policy).map_err(LeaseRefusal::BadRequest)?;
        let members = self.members(&pool).await?;
        let now = (self.now)();
        let mut renewed = Vec::new();
        for p in &members {
            if !bindings(p)
                .iter()
                .any(|b| b.id == id && b.holder == holder && b.live(now))
            {
                continue;
            }
            let done = self
                .settle(p.clone(), |p| {
                    let cap = egress_core::pool::retiring(p.annotations()).map(|(at, _)| at);
                    match lease::renew(&bindings(p), id, holder, ttl, cap, now) {
                        Ok(b) => Ok(Some((b, None))),
                        // Ended on this one since it was read.
                        Err(lease::LeaseError::NotFound(_)) => Ok(None),
                    }
                })
                .await?;
            renewed.extend(done);
        }
        if renewed.is_empty() {
            return Err(self.gone(&pool, &members, id, holder, now));
        }
        let mut view = self
            .describe(&pool, &renewed, id, holder, now)
            .ok_or_else(|| self.gone(&pool, &members, id, holder, now))?;
        // What it lost, over every member (the renewed ones hold; others may have gone).
        let facts = self.facts(&members);
        view.lost = lease::lost(
            &held(&members, &facts, now),
            pool_lost(&pool),
            id,
            holder,
            now,
        );
        Ok(view)
    }

    async fn release_in(
        &self,
        holder: &str,
        at: &LeaseRef,
        id: &str,
        req: &ReleaseRequest,
    ) -> Result<(), LeaseRefusal> {
        let pool = self.pool(at).await?;
        let policy = pool.spec.leases.clone().unwrap_or_default();
        let banned = req.outcome == Some(Outcome::Banned);
        let members = self.members(&pool).await?;
        let now = (self.now)();
        // Every ban report on the pool's proxies: a holder's reports count at a bounded rate.
        let mut in_pool: Vec<BanReport> = members
            .iter()
            .filter_map(|p| p.status.as_ref())
            .flat_map(|s| s.ban_reporters.iter().cloned())
            .collect();
        let mut released = 0;
        for p in &members {
            if !bindings(p)
                .iter()
                .any(|b| b.id == id && b.holder == holder && b.live(now))
            {
                continue;
            }
            let done = self
                .settle(p.clone(), |p| {
                    match lease::release(&bindings(p), id, holder, now) {
                        Ok(b) => {
                            let reports = p
                                .status
                                .as_ref()
                                .map(|s| s.ban_reporters.clone())
                                .unwrap_or_default();
                            let bans = match banned
                                .then(|| lease::report_ban(&reports, &in_pool, holder, now))
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
            let reports = updated
                .status
                .as_ref()
                .map(|s| s.ban_reporters.clone())
                .unwrap_or_default();
            // This release's own report, for the rate of the next proxy it releases.
            let who = lease::holder_digest(holder);
            let at = egress_core::gc::format_rfc3339(now);
            in_pool.extend(
                reports
                    .iter()
                    .filter(|r| r.reporter == who && r.at == at)
                    .cloned(),
            );
            if banned && lease::cordons(&reports, &policy) && !cordoned(&updated) {
                self.cordon(&updated, reports.len()).await;
            }
        }
        if released == 0 {
            return Err(self.gone(&pool, &members, id, holder, now));
        }
        if banned {
            self.metrics
                .lease_call(&at.namespace, &at.pool, "release", "banned");
        }
        Ok(())
    }

    /// Cordons a proxy enough of its holders reported banned: out of discovery and leases,
    /// replaced through the pool's budget (drained while other leases hold it).
    async fn cordon(&self, p: &Proxy, bans: usize) {
        let patch = json!({"metadata": {"annotations": {CORDON_ANNOTATION: "true"}}});
        let name = p.name_any();
        match self
            .proxies(&p.namespace().unwrap_or_default())
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(proxy = %name, bans, "cordoned: its lease holders reported it banned")
            }
            Err(e) => {
                tracing::warn!(proxy = %name, "cordoning a banned proxy failed: {}", api_error_summary(&e))
            }
        }
    }
}
