//! The `kube` capability: dynamic objects as JSON. The grant limits kinds and namespaces (or
//! allows cluster scope); every mutating call is a plan step.

use crate::bindings::egress::provider::kube as wit;
use crate::call::CallState;
use serde_json::Value;
use tracing::Instrument;

// The simulated API lives beside the real one; these paths are where callers know it.
pub use crate::capabilities::kube_sim::{SimFault, SimKube, SimKubeSpec, merge, rfc3339_ms};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl KubeRef {
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {reason}: {message}")]
pub struct KubeError {
    pub status: u16,
    pub reason: String,
    pub message: String,
}

impl KubeError {
    pub fn new(status: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// One page of a list: the objects, and the token that continues after them (none on the
/// last page).
#[derive(Debug, Clone, Default)]
pub struct ObjectPage {
    pub items: Vec<Object>,
    pub continue_token: Option<String>,
}

/// An object as the API server answered it. Shared: the simulated cluster hands out the
/// version it stores, not a deep copy of it for every get, create and list.
pub type Object = std::sync::Arc<Value>;

#[async_trait::async_trait]
pub trait KubeBackend: Send + Sync {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError>;
    /// [`KubeBackend::get`] as the JSON text a guest receives. A backend that hands out the
    /// same stored version to many gets may keep its text rather than write it each time.
    async fn get_text(&self, target: &KubeRef) -> Result<String, KubeError> {
        self.get(target).await.map(|o| json_text(&o))
    }
    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError>;
    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError>;
    /// One page of a list, as the API server's `limit` and `continue` give it.
    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
        limit: Option<u32>,
        continue_token: Option<&str>,
    ) -> Result<ObjectPage, KubeError>;
    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError>;
    /// A merge patch of the status subresource (what a kubelet or another controller
    /// writes; no guest import reaches it).
    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError>;
    async fn server_version(&self) -> Result<(String, String), KubeError>;
}

// ---------------------------------------------------------------------------------------------
// The real backend: kube-rs against the cluster of the kubeconfig or the in-cluster config.

/// Connects on first use, so a CLI run without a cluster works as long as no provider needs one.
pub struct RealKube {
    client: tokio::sync::OnceCell<Result<(kube::Client, String), String>>,
}

impl RealKube {
    pub fn new() -> Self {
        Self {
            client: tokio::sync::OnceCell::new(),
        }
    }

    /// A backend over an existing client (operator mode, and tests with a mock service).
    pub fn with_client(client: kube::Client, address: String) -> Self {
        Self {
            client: tokio::sync::OnceCell::new_with(Some(Ok((client, address)))),
        }
    }

    async fn client(&self) -> Result<&(kube::Client, String), KubeError> {
        self.client
            .get_or_init(|| async {
                let config = kube::Config::infer()
                    .await
                    .map_err(|e| format!("no Kubernetes config: {e}"))?;
                let address = config.cluster_url.to_string();
                let client = kube::Client::try_from(config)
                    .map_err(|e| format!("Kubernetes client: {e}"))?;
                Ok((client, address))
            })
            .await
            .as_ref()
            .map_err(|e| KubeError::new(0, "Transport", e.clone()))
    }

    async fn api(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Result<kube::Api<kube::api::DynamicObject>, KubeError> {
        let (client, _) = self.client().await?;
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        let resource = kube::api::ApiResource::from_gvk(&gvk);
        Ok(match namespace {
            Some(ns) => kube::Api::namespaced_with(client.clone(), ns, &resource),
            None => kube::Api::all_with(client.clone(), &resource),
        })
    }
}

impl Default for RealKube {
    fn default() -> Self {
        Self::new()
    }
}

fn from_kube(e: kube::Error) -> KubeError {
    match e {
        kube::Error::Api(status) => KubeError {
            status: status.code,
            reason: status.reason.clone(),
            message: status.message.clone(),
        },
        other => KubeError::new(0, "Transport", other.to_string()),
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Object, KubeError> {
    serde_json::to_value(v)
        .map(Object::new)
        .map_err(|e| KubeError::new(0, "Decode", e.to_string()))
}

#[async_trait::async_trait]
impl KubeBackend for RealKube {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError> {
        let api = self
            .api(
                &target.api_version,
                &target.kind,
                target.namespace.as_deref(),
            )
            .await?;
        let obj = api.get(&target.name).await.map_err(from_kube)?;
        to_value(&obj)
    }

    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError> {
        let api = self.api(api_version, kind, namespace).await?;
        let obj: kube::api::DynamicObject = serde_json::from_value(body)
            .map_err(|e| KubeError::new(400, "BadRequest", format!("object: {e}")))?;
        let created = api
            .create(&kube::api::PostParams::default(), &obj)
            .await
            .map_err(from_kube)?;
        to_value(&created)
    }

    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError> {
        let api = self
            .api(
                &target.api_version,
                &target.kind,
                target.namespace.as_deref(),
            )
            .await?;
        api.delete(&target.name, &kube::api::DeleteParams::default())
            .await
            .map(|_| ())
            .map_err(from_kube)
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
        let api = self.api(api_version, kind, namespace).await?;
        let mut params = kube::api::ListParams::default();
        if !label_selector.is_empty() {
            params = params.labels(label_selector);
        }
        if let Some(l) = limit {
            params = params.limit(l);
        }
        if let Some(t) = continue_token {
            params = params.continue_token(t);
        }
        let list = api.list(&params).await.map_err(from_kube)?;
        Ok(ObjectPage {
            items: list.items.iter().map(to_value).collect::<Result<_, _>>()?,
            continue_token: list.metadata.continue_.filter(|t| !t.is_empty()),
        })
    }

    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError> {
        let api = self
            .api(
                &target.api_version,
                &target.kind,
                target.namespace.as_deref(),
            )
            .await?;
        let obj = api
            .patch(
                &target.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(merge_patch),
            )
            .await
            .map_err(from_kube)?;
        to_value(&obj)
    }

    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError> {
        let api = self
            .api(
                &target.api_version,
                &target.kind,
                target.namespace.as_deref(),
            )
            .await?;
        let obj = api
            .patch_status(
                &target.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(merge_patch),
            )
            .await
            .map_err(from_kube)?;
        to_value(&obj)
    }

    async fn server_version(&self) -> Result<(String, String), KubeError> {
        let (client, address) = self.client().await?;
        let info = client.apiserver_version().await.map_err(from_kube)?;
        Ok((info.git_version, address.clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// The guest-facing host functions.

fn to_ref(r: &wit::ObjectRef) -> KubeRef {
    KubeRef {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    }
}

fn to_wit(e: KubeError) -> wit::KubeError {
    wit::KubeError {
        status: e.status,
        reason: e.reason,
        message: e.message,
    }
}

impl CallState {
    fn kube_denied(
        &self,
        verb: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Option<wit::KubeError> {
        let why = match &self.grants.kube {
            None => Some("no kube grant".to_string()),
            Some(g) => g.deny_reason_for(verb, kind, namespace),
        };
        why.map(|m| {
            tracing::warn!(provider = %self.provider, kind, namespace = namespace.unwrap_or(""), "kube call denied: {m}");
            wit::KubeError {
                status: 0,
                reason: "Denied".into(),
                message: m,
            }
        })
    }

    /// The namespaces a list covers (without one in the options: every namespace the grant
    /// allows), each checked against the grant.
    fn list_namespaces(
        &self,
        options: &wit::ListOptions,
    ) -> Result<Vec<Option<String>>, wit::KubeError> {
        let Some(grant) = self.grants.kube.clone() else {
            return Err(self
                .kube_denied("list", &options.kind, options.namespace.as_deref())
                .unwrap_or_else(|| to_wit(KubeError::new(0, "Denied", "no kube grant"))));
        };
        let namespaces: Vec<Option<String>> = match (&options.namespace, grant.cluster_scope) {
            (Some(ns), _) => vec![Some(ns.clone())],
            (None, true) => vec![None],
            (None, false) => grant.namespaces.iter().cloned().map(Some).collect(),
        };
        for ns in &namespaces {
            if let Some(e) = self.kube_denied("list", &options.kind, ns.as_deref()) {
                return Err(e);
            }
        }
        Ok(namespaces)
    }
}

/// An object as the guest receives it: the compact JSON of the Value's Display, written
/// straight into bytes rather than through the formatter (every resync of a kubernetes Proxy
/// reads its Pod here). A Value's keys are strings, so this cannot fail; should it, Display
/// says the same.
pub(crate) fn json_text(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| v.to_string())
}

impl wit::Host for CallState {
    async fn get(&mut self, target: wit::ObjectRef) -> Result<String, wit::KubeError> {
        if let Some(e) = self.kube_denied("get", &target.kind, target.namespace.as_deref()) {
            return Err(e);
        }
        let r = to_ref(&target);
        let span =
            tracing::debug_span!("kube.get", provider = %self.provider, object = %r.describe());
        let backend = self.backends.kube.clone();
        async move {
            let out = backend.get_text(&r).await;
            tracing::debug!(ok = out.is_ok(), "kube get {}", r.describe());
            out.map_err(to_wit)
        }
        .instrument(span)
        .await
    }

    async fn create(
        &mut self,
        api_version: String,
        kind: String,
        namespace: Option<String>,
        body: String,
    ) -> Result<String, wit::KubeError> {
        if let Some(e) = self.kube_denied("create", &kind, namespace.as_deref()) {
            return Err(e);
        }
        let body: Value = serde_json::from_str(&body).map_err(|e| wit::KubeError {
            status: 400,
            reason: "BadRequest".into(),
            message: format!("object is not JSON: {e}"),
        })?;
        let r = KubeRef {
            api_version: api_version.clone(),
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: body["metadata"]["name"].as_str().unwrap_or("").to_string(),
        };
        let span =
            tracing::debug_span!("kube.create", provider = %self.provider, object = %r.describe());
        let backend = self.backends.kube.clone();
        let args = body.clone();
        let desc = r.describe();
        let out = async move {
            let out = backend
                .create(&api_version, &kind, namespace.as_deref(), body)
                .await;
            tracing::debug!(ok = out.is_ok(), "kube create {}", r.describe());
            out
        }
        .instrument(span)
        .await;
        self.record(
            "kube",
            "create",
            desc,
            args,
            out.as_ref().err().map(ToString::to_string),
        );
        out.map(|v| json_text(&v)).map_err(to_wit)
    }

    async fn delete(&mut self, target: wit::ObjectRef) -> Result<(), wit::KubeError> {
        if let Some(e) = self.kube_denied("delete", &target.kind, target.namespace.as_deref()) {
            return Err(e);
        }
        let r = to_ref(&target);
        let span =
            tracing::debug_span!("kube.delete", provider = %self.provider, object = %r.describe());
        let backend = self.backends.kube.clone();
        let desc = r.describe();
        let out = async move {
            let out = backend.delete(&r).await;
            tracing::debug!(ok = out.is_ok(), "kube delete {}", r.describe());
            out
        }
        .instrument(span)
        .await;
        self.record(
            "kube",
            "delete",
            desc,
            Value::Null,
            out.as_ref().err().map(ToString::to_string),
        );
        out.map_err(to_wit)
    }

    async fn list_objects(
        &mut self,
        options: wit::ListOptions,
    ) -> Result<Vec<String>, wit::KubeError> {
        let namespaces = self.list_namespaces(&options)?;
        let span = tracing::debug_span!("kube.list", provider = %self.provider, kind = %options.kind, selector = %options.label_selector);
        let backend = self.backends.kube.clone();
        async move {
            let mut out = Vec::new();
            for ns in namespaces {
                let remaining = options.limit.map(|l| l.saturating_sub(out.len() as u32));
                if remaining == Some(0) {
                    break;
                }
                let page = backend
                    .list(
                        &options.api_version,
                        &options.kind,
                        ns.as_deref(),
                        &options.label_selector,
                        remaining,
                        None,
                    )
                    .await
                    .map_err(to_wit)?;
                out.extend(page.items.iter().map(|o| json_text(o)));
            }
            tracing::debug!(count = out.len(), "kube list {}", options.kind);
            Ok(out)
        }
        .instrument(span)
        .await
    }

    async fn list_objects_page(
        &mut self,
        options: wit::ListOptions,
        continue_token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), wit::KubeError> {
        let namespaces = self.list_namespaces(&options)?;
        if namespaces.is_empty() {
            return Ok((Vec::new(), None));
        }
        // The token names which of the namespaces the grant lists the page is in, and the API
        // server's own token within it: `<index>:<token>`, the token empty at a namespace's
        // start.
        let (index, inner) = match continue_token.as_deref().filter(|t| !t.is_empty()) {
            None => (0, None),
            Some(t) => {
                let bad = || {
                    to_wit(KubeError::new(
                        400,
                        "BadRequest",
                        "continue token is not one this host gave",
                    ))
                };
                let (i, inner) = t.split_once(':').ok_or_else(bad)?;
                let i: usize = i.parse().map_err(|_| bad())?;
                if i >= namespaces.len() {
                    return Err(bad());
                }
                (i, Some(inner.to_string()).filter(|t| !t.is_empty()))
            }
        };
        let span = tracing::debug_span!("kube.list-page", provider = %self.provider, kind = %options.kind, selector = %options.label_selector);
        let backend = self.backends.kube.clone();
        async move {
            let ns = namespaces.get(index).cloned().flatten();
            let page = backend
                .list(
                    &options.api_version,
                    &options.kind,
                    ns.as_deref(),
                    &options.label_selector,
                    options.limit,
                    inner.as_deref(),
                )
                .await
                .map_err(to_wit)?;
            let next = match page.continue_token {
                Some(t) => Some(format!("{index}:{t}")),
                None if index + 1 < namespaces.len() => Some(format!("{}:", index + 1)),
                None => None,
            };
            tracing::debug!(
                count = page.items.len(),
                more = next.is_some(),
                "kube list page {}",
                options.kind
            );
            Ok((page.items.iter().map(|o| json_text(o)).collect(), next))
        }
        .instrument(span)
        .await
    }

    async fn patch(
        &mut self,
        target: wit::ObjectRef,
        merge_patch: String,
    ) -> Result<String, wit::KubeError> {
        if let Some(e) = self.kube_denied("patch", &target.kind, target.namespace.as_deref()) {
            return Err(e);
        }
        let patch: Value = serde_json::from_str(&merge_patch).map_err(|e| wit::KubeError {
            status: 400,
            reason: "BadRequest".into(),
            message: format!("patch is not JSON: {e}"),
        })?;
        let r = to_ref(&target);
        let span =
            tracing::debug_span!("kube.patch", provider = %self.provider, object = %r.describe());
        let backend = self.backends.kube.clone();
        let args = patch.clone();
        let desc = r.describe();
        let out = async move {
            let out = backend.patch(&r, &patch).await;
            tracing::debug!(ok = out.is_ok(), "kube patch {}", r.describe());
            out
        }
        .instrument(span)
        .await;
        self.record(
            "kube",
            "patch",
            desc,
            args,
            out.as_ref().err().map(ToString::to_string),
        );
        out.map(|v| json_text(&v)).map_err(to_wit)
    }

    async fn server_version(&mut self) -> Result<(String, String), wit::KubeError> {
        if self.grants.kube.is_none() {
            return Err(to_wit(KubeError::new(0, "Denied", "no kube grant")));
        }
        let span = tracing::debug_span!("kube.server-version", provider = %self.provider);
        let backend = self.backends.kube.clone();
        async move { backend.server_version().await.map_err(to_wit) }
            .instrument(span)
            .await
    }
}
