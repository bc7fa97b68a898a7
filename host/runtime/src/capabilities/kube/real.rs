//! The real `kube` backend: kube-rs against the cluster of the kubeconfig or the in-cluster
//! config.

use crate::capabilities::kube::{KubeBackend, KubeError, KubeRef, Object, ObjectPage};
use serde_json::Value;

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
