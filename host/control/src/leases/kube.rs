//! The lease store of a cluster: leases recorded as bindings on the leased Proxies' status,
//! each write a merge patch of the status subresource that names the resourceVersion it was
//! decided on (the API server answers 409 to a write on another). Every call reads the pool's
//! Proxies from the API server (a list of one pool by label), not from a watch cache, so a
//! lease granted by one replica is renewed by another at once.

use super::{LeaseRefusal, LeaseStore, Leases, PoolFacts, Records};
use crate::metrics::Metrics;
use egress_core::ProxyStatus;
use egress_core::credential::ProxyCredential;
use egress_core::discovery::{CORDON_ANNOTATION, POOL_LABEL};
use egress_core::lease::{self, Held, LeaseRef};
use egress_k8s_api::api_error_summary;
use egress_k8s_api::crd::{Proxy, ProxyPool};
use egress_time::now::Clock;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// Where the credentials of the proxies handed out come from (the operator's watch of their
/// Secrets).
pub trait ProxyCredentials: Send + Sync {
    fn credential_of(&self, p: &Proxy) -> Option<ProxyCredential>;
}

/// Leases kept on Proxy statuses.
pub type KubeLeases = Leases<KubeProxies>;

impl KubeLeases {
    pub fn new(
        client: kube::Client,
        credentials: Arc<dyn ProxyCredentials>,
        now: Clock,
        metrics: Arc<Metrics>,
    ) -> Self {
        Leases::with_store(
            Arc::new(KubeProxies {
                client,
                credentials,
            }),
            now,
            metrics,
        )
    }
}

/// The Proxies and ProxyPools of the API server.
pub struct KubeProxies {
    client: kube::Client,
    credentials: Arc<dyn ProxyCredentials>,
}

/// A Proxy as read, with what its lease view borrows: its status, namespace and credential.
#[derive(Clone)]
pub struct Member {
    proxy: Proxy,
    status: ProxyStatus,
    namespace: String,
    credential: Option<ProxyCredential>,
}

/// 503: the API server failed.
fn api_refused(e: &kube::Error) -> LeaseRefusal {
    LeaseRefusal::Busy(format!("the API server failed: {}", api_error_summary(e)))
}

impl KubeProxies {
    fn proxies(&self, ns: &str) -> Api<Proxy> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn member(&self, proxy: Proxy) -> Member {
        Member {
            status: proxy.status.clone().unwrap_or_default(),
            namespace: proxy.namespace().unwrap_or_default(),
            credential: self.credentials.credential_of(&proxy),
            proxy,
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for KubeProxies {
    type Pool = ProxyPool;
    type Member = Member;

    async fn pool(&self, at: &LeaseRef) -> Result<ProxyPool, LeaseRefusal> {
        let pools: Api<ProxyPool> = Api::namespaced(self.client.clone(), &at.namespace);
        match pools.get(&at.pool).await {
            Ok(p) => Ok(p),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(LeaseRefusal::NotFound(format!(
                "no ProxyPool {}/{}",
                at.namespace, at.pool
            ))),
            Err(e) => Err(api_refused(&e)),
        }
    }

    fn facts(pool: &ProxyPool) -> PoolFacts<'_> {
        PoolFacts {
            policy: pool.spec.leases.clone().unwrap_or_default(),
            // An autoscaled pool's share per holder is of the most it may have.
            replicas: pool
                .spec
                .autoscale
                .as_ref()
                .map_or(pool.spec.replicas, |a| a.max_replicas),
            quarantine: pool.spec.quarantine.clone().unwrap_or_default(),
            lost: pool
                .status
                .as_ref()
                .map_or(&[][..], |s| s.lost_leases.as_slice()),
            cold_start_wait: pool.spec.autoscale.as_ref().map(|a| a.cold_start_wait()),
        }
    }

    /// The Proxies of every pool of `namespace` (by the pool label), not being deleted.
    async fn namespace_members(&self, namespace: &str) -> Result<Vec<Member>, LeaseRefusal> {
        let listed = self
            .proxies(namespace)
            .list(&ListParams::default().labels(POOL_LABEL))
            .await
            .map_err(|e| api_refused(&e))?;
        Ok(listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| self.member(p))
            .collect())
    }

    /// The `status.leaseUsage` of the ProxyPools of `namespace`.
    async fn namespace_usage(
        &self,
        namespace: &str,
    ) -> Result<Vec<egress_core::quota::LeaseUsage>, LeaseRefusal> {
        let pools: Api<ProxyPool> = Api::namespaced(self.client.clone(), namespace);
        let listed = pools
            .list(&ListParams::default())
            .await
            .map_err(|e| api_refused(&e))?;
        Ok(listed
            .items
            .into_iter()
            .filter_map(|p| p.status.and_then(|s| s.lease_usage))
            .collect())
    }

    /// The pool's Proxies as the API server has them now (not being deleted, controlled by
    /// the pool).
    async fn members(&self, at: &LeaseRef, pool: &ProxyPool) -> Result<Vec<Member>, LeaseRefusal> {
        let listed = self
            .proxies(&at.namespace)
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}={}", pool.name_any())))
            .await
            .map_err(|e| api_refused(&e))?;
        let uid = pool.meta().uid.clone().unwrap_or_default();
        Ok(listed
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| egress_k8s_api::members::controlled_by(p, &uid))
            .map(|p| self.member(p))
            .collect())
    }

    fn held(m: &Member, now: i64) -> Held<'_> {
        Held {
            proxy: egress_k8s_api::members::candidate(
                &m.proxy,
                &m.status,
                &m.namespace,
                m.credential.as_ref(),
                now,
            ),
            retiring: egress_core::pool::retiring(m.proxy.annotations()),
            created_at: m
                .proxy
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
        }
    }

    fn status(m: &Member) -> &ProxyStatus {
        &m.status
    }

    fn cordoned(m: &Member) -> bool {
        m.proxy
            .annotations()
            .get(CORDON_ANNOTATION)
            .is_some_and(|v| v == "true")
    }

    fn key(m: &Member) -> String {
        format!("{}/{}", m.namespace, m.proxy.name_any())
    }

    async fn write(
        &self,
        m: &Member,
        records: Records,
        now: i64,
    ) -> Result<Option<Member>, LeaseRefusal> {
        let bindings = lease::with_replaced(
            &m.status.leases,
            m.status.ip.as_deref(),
            records.bindings,
            now,
        );
        let mut status = json!({ "leases": bindings });
        if let Some(b) = records.bans {
            status["banReports"] = json!(b.len());
            status["banReporters"] = json!(b);
        }
        if let Some(q) = records.quarantines {
            status["quarantines"] = json!(q);
        }
        let patch = json!({
            "metadata": {"resourceVersion": m.proxy.resource_version()},
            "status": status,
        });
        match self
            .proxies(&m.namespace)
            .patch_status(
                &m.proxy.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(updated) => Ok(Some(self.member(updated))),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(None),
            Err(e) => Err(api_refused(&e)),
        }
    }

    async fn reread(&self, m: &Member) -> Result<Option<Member>, LeaseRefusal> {
        match self
            .proxies(&m.namespace)
            .get_status(&m.proxy.name_any())
            .await
        {
            Ok(p) => Ok(Some(self.member(p))),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(api_refused(&e)),
        }
    }

    async fn cordon(&self, m: &Member, why: &str) {
        let patch = json!({"metadata": {"annotations": {CORDON_ANNOTATION: "true"}}});
        let name = m.proxy.name_any();
        match self
            .proxies(&m.namespace)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(proxy = %name, why, "cordoned")
            }
            Err(e) => {
                tracing::warn!(proxy = %name, why, "cordoning failed: {}", api_error_summary(&e))
            }
        }
    }
}
