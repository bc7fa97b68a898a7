//! Discovery in the cluster: the [`ProxySource`] the /v1 API (`egress_control::api`) lists
//! the Proxies from, a watch of every Proxy and of their credential Secrets.

use crate::context::Context;
use egress_control::api::ProxySource;
use egress_control::leases::kube::ProxyCredentials;
use egress_core::discovery::{self, Discovered, Filter};
use egress_k8s_api::crd::Proxy;
use egress_k8s_api::members::candidate;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Discovery from a watch of every Proxy, which every replica keeps (so a standby answers as
/// the leader does): readiness, address and egress address come from the status the leader
/// writes; on the leader, the latency and the time of the last verification come from its
/// checker, which sees each check while the status records them only when something changed.
pub struct StoreSource {
    pub store: Store<Proxy>,
    pub context: OnceLock<Arc<Context>>,
    /// The credential Secrets (`crate::credentials`), when watched: each listed proxy's
    /// credential goes to the caller, who is authorised for its pool by then.
    credentials: Option<Store<k8s_openapi::api::core::v1::Secret>>,
    synced: AtomicBool,
}

impl StoreSource {
    pub fn new(store: Store<Proxy>) -> Self {
        Self {
            store,
            context: OnceLock::new(),
            credentials: None,
            synced: AtomicBool::new(false),
        }
    }

    pub fn with_credentials(mut self, secrets: Store<k8s_openapi::api::core::v1::Secret>) -> Self {
        self.credentials = Some(secrets);
        self
    }

    /// Marks the source synced once its watch has listed every Proxy (run it beside the
    /// watch).
    pub async fn track_sync(self: Arc<Self>) {
        if self.store.wait_until_ready().await.is_ok() {
            self.synced.store(true, Ordering::SeqCst);
        }
    }
}

/// Each proxy's credential from its Secret, as the watch has it.
impl ProxyCredentials for StoreSource {
    fn credential_of(&self, p: &Proxy) -> Option<egress_core::credential::ProxyCredential> {
        let store = self.credentials.as_ref()?;
        let uid = p.metadata.uid.as_deref()?;
        let name = p.metadata.name.as_deref()?;
        let secret = store.get(
            &kube::runtime::reflector::ObjectRef::new(&egress_k8s_api::secrets::secret_name(name))
                .within(p.metadata.namespace.as_deref()?),
        )?;
        egress_k8s_api::secrets::from_secret(&secret, uid)
    }
}

impl ProxySource for StoreSource {
    fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    fn discover(&self, filter: &Filter) -> Vec<Discovered> {
        let mut proxies = self.store.state();
        proxies.sort_by(|a, b| {
            (a.metadata.namespace.as_deref(), a.metadata.name.as_deref())
                .cmp(&(b.metadata.namespace.as_deref(), b.metadata.name.as_deref()))
        });
        let latest = self
            .context
            .get()
            .and_then(|c| c.loaded().egress.clone())
            .map(|checker| checker.latest())
            .unwrap_or_default();
        let statuses: Vec<_> = proxies
            .iter()
            .map(|p| p.status.clone().unwrap_or_default())
            .collect();
        let namespaces: Vec<String> = proxies
            .iter()
            .map(|p| p.namespace().unwrap_or_default())
            .collect();
        let credentials: Vec<_> = proxies.iter().map(|p| self.credential_of(p)).collect();
        let now = egress_time::now::unix_now();
        let candidates = proxies
            .iter()
            .zip(&statuses)
            .zip(&namespaces)
            .zip(&credentials)
            .filter(|(((p, _), _), _)| p.metadata.deletion_timestamp.is_none())
            .map(|(((p, status), namespace), credential)| {
                candidate(p, status, namespace, credential.as_ref(), now)
            });
        let mut list = discovery::discover(candidates, filter);
        for d in &mut list {
            if let Some(l) = latest.get(&format!("{}/{}", d.namespace, d.name))
                && l.reason == egress_core::egress::CheckReason::Verified
            {
                d.latency_ms = l.latency_ms.or(d.latency_ms);
                if let Some(ms) = l.verified_at_ms {
                    d.verified_at = Some(egress_core::gc::format_rfc3339((ms / 1000) as i64));
                }
            }
        }
        list
    }
}
