//! A layer over the capability backends that counts mutating calls and can break one: fail
//! the k-th with a transient error of the backend's own shape (kube 503, HTTP 503, libvirt
//! internal error "connection lost"), or hang it until the runtime's operation timeout
//! cancels the call, which leaves the backend as a trap at that point would.

use egress_core::config::HttpGrant;
use egress_runtime::capabilities::http::{HttpBackend, HttpError, HttpRequest, HttpResponse};
use egress_runtime::capabilities::kube::{KubeBackend, KubeError, KubeRef, Object, ObjectPage};
use egress_runtime::capabilities::libvirt::{
    AddressSource, DomainState, InterfaceAddresses, LibvirtBackend, LibvirtError, LibvirtHost,
    NodeInfo, PoolInfo, ProbeResult, ProbeTarget, R, Transfer, UrlGrant, VolumeInfo,
};
use serde_json::Value;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The call fails as the backend fails when it is briefly unavailable.
    Transient,
    /// The call never answers.
    Hang,
}

#[derive(Debug, Default)]
struct State {
    mutating: u64,
    /// Fire at this mutating call count.
    armed: Option<(u64, FaultKind)>,
    fired: bool,
}

/// Shared by the wrapped backends of one suite run.
#[derive(Debug, Default)]
pub struct FaultPlan {
    state: Mutex<State>,
}

impl FaultPlan {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mutating calls seen so far.
    pub fn mutating_calls(&self) -> u64 {
        self.lock().mutating
    }

    /// Breaks the `k`-th mutating call from now (1 = the next one).
    pub fn arm(&self, k: u64, kind: FaultKind) {
        let mut st = self.lock();
        st.armed = Some((st.mutating + k.max(1), kind));
        st.fired = false;
    }

    /// Disarms; whether the fault fired.
    pub fn disarm(&self) -> bool {
        let mut st = self.lock();
        st.armed = None;
        std::mem::take(&mut st.fired)
    }

    fn on_mutating(&self) -> Option<FaultKind> {
        let mut st = self.lock();
        st.mutating += 1;
        match st.armed {
            Some((at, kind)) if at == st.mutating => {
                st.armed = None;
                st.fired = true;
                Some(kind)
            }
            _ => None,
        }
    }
}

/// Waits forever: the runtime's timeout drops the call with this future.
async fn hang() {
    std::future::pending::<()>().await;
}

pub struct FaultyKube {
    pub inner: Arc<dyn KubeBackend>,
    pub plan: Arc<FaultPlan>,
}

impl FaultyKube {
    async fn gate(&self) -> Result<(), KubeError> {
        match self.plan.on_mutating() {
            None => Ok(()),
            Some(FaultKind::Transient) => Err(KubeError::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request (injected)",
            )),
            Some(FaultKind::Hang) => {
                hang().await;
                Ok(())
            }
        }
    }
}

#[async_trait::async_trait]
impl KubeBackend for FaultyKube {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError> {
        self.inner.get(target).await
    }
    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError> {
        self.gate().await?;
        self.inner.create(api_version, kind, namespace, body).await
    }
    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError> {
        self.gate().await?;
        self.inner.delete(target).await
    }
    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
        limit: Option<u32>,
        continue_token: Option<&str>,
    ) -> Result<ObjectPage, KubeError> {
        self.inner
            .list(
                api_version,
                kind,
                namespace,
                label_selector,
                limit,
                continue_token,
            )
            .await
    }
    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError> {
        self.gate().await?;
        self.inner.patch(target, merge_patch).await
    }
    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError> {
        self.inner.patch_status(target, merge_patch).await
    }
    async fn server_version(&self) -> Result<(String, String), KubeError> {
        self.inner.server_version().await
    }
}

pub struct FaultyHttp {
    pub inner: Arc<dyn HttpBackend>,
    pub plan: Arc<FaultPlan>,
}

#[async_trait::async_trait]
impl HttpBackend for FaultyHttp {
    async fn send(&self, req: HttpRequest, grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        if !matches!(req.method.as_str(), "GET" | "HEAD") {
            match self.plan.on_mutating() {
                None => {}
                Some(FaultKind::Transient) => {
                    let body = serde_json::json!({"error": {
                        "code": 503,
                        "message": "The service is currently unavailable (injected).",
                        "errors": [{"message": "backend error (injected)", "domain": "global", "reason": "backendError"}],
                        "status": "UNAVAILABLE",
                    }});
                    return Ok(HttpResponse {
                        status: 503,
                        headers: vec![("content-type".into(), "application/json".into())],
                        body: body.to_string().into_bytes(),
                        final_url: req.url,
                    });
                }
                Some(FaultKind::Hang) => hang().await,
            }
        }
        self.inner.send(req, grant).await
    }
}

pub struct FaultyLibvirt {
    pub inner: Arc<dyn LibvirtBackend>,
    pub plan: Arc<FaultPlan>,
}

impl FaultyLibvirt {
    async fn gate(&self) -> R<()> {
        match self.plan.on_mutating() {
            None => Ok(()),
            // VIR_ERR_INTERNAL_ERROR from the RPC layer: what a dropped connection reports.
            Some(FaultKind::Transient) => Err(LibvirtError {
                code: 1,
                domain: 7,
                message: "internal error: client socket is closed (injected)".into(),
                stage: None,
                timeout: false,
                denied: false,
            }),
            Some(FaultKind::Hang) => {
                hang().await;
                Ok(())
            }
        }
    }
}

/// Calls passed straight through, and calls that change the hypervisor (gated).
macro_rules! libvirt_layer {
    (read { $($r:ident($($ra:ident: $rt:ty),*) -> $rr:ty;)* }
     write { $($w:ident($($wa:ident: $wt:ty),*) -> $wr:ty;)* }) => {
        #[async_trait::async_trait]
        impl LibvirtBackend for FaultyLibvirt {
            fn for_entry(
                self: Arc<Self>,
                entry: &str,
                hosts: &[LibvirtHost],
            ) -> Result<Arc<dyn LibvirtBackend>, String> {
                Ok(Arc::new(FaultyLibvirt {
                    inner: self.inner.clone().for_entry(entry, hosts)?,
                    plan: self.plan.clone(),
                }))
            }
            $(async fn $r(&self, $($ra: $rt),*) -> $rr {
                self.inner.$r($($ra),*).await
            })*
            $(async fn $w(&self, $($wa: $wt),*) -> $wr {
                self.gate().await?;
                self.inner.$w($($wa),*).await
            })*
            async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
                self.inner.probe(targets).await
            }
        }
    };
}

libvirt_layer! {
    read {
        lib_version(host: &str) -> R<u64>;
        hostname(host: &str) -> R<String>;
        node_get_info(host: &str) -> R<NodeInfo>;
        node_free_memory(host: &str) -> R<u64>;
        list_domains(host: &str) -> R<Vec<String>>;
        domain_lookup(host: &str, name: &str) -> R<String>;
        domain_get_state(host: &str, name: &str) -> R<DomainState>;
        domain_get_metadata(host: &str, name: &str, uri: &str) -> R<String>;
        domain_interface_addresses(host: &str, name: &str, source: AddressSource) -> R<Vec<InterfaceAddresses>>;
        pool_get_info(host: &str, pool: &str) -> R<PoolInfo>;
        pool_refresh(host: &str, pool: &str) -> R<()>;
        pool_list_volumes(host: &str, pool: &str) -> R<Vec<String>>;
        volume_lookup(host: &str, pool: &str, name: &str) -> R<String>;
        volume_get_info(host: &str, pool: &str, name: &str) -> R<VolumeInfo>;
        volume_xml(host: &str, pool: &str, name: &str) -> R<String>;
        volume_download(host: &str, pool: &str, name: &str, max_bytes: u64) -> R<Vec<u8>>;
        url_size(url: &str, images: &UrlGrant) -> R<Option<u64>>;
    }
    write {
        domain_define_xml(host: &str, xml: &str) -> R<()>;
        domain_create(host: &str, name: &str) -> R<()>;
        domain_resume(host: &str, name: &str) -> R<()>;
        domain_destroy(host: &str, name: &str) -> R<()>;
        domain_undefine(host: &str, name: &str) -> R<()>;
        volume_create_xml(host: &str, pool: &str, xml: &str) -> R<()>;
        volume_delete(host: &str, pool: &str, name: &str) -> R<()>;
        volume_upload(host: &str, pool: &str, name: &str, data: Vec<u8>) -> R<()>;
        volume_upload_from_url(host: &str, pool: &str, name: &str, url: &str, sha256: Option<&str>, max_bytes: u64, images: &UrlGrant) -> R<Transfer>;
    }
}
