//! The Proxy controller: a finalizer, then the shared reconcile decisions; status through the
//! status subresource with conditions and observedGeneration; an Event for every create,
//! replacement, deletion and failure; requeue by what the decisions say.

use crate::context::Context;
use egress_control::reconciler::{CloudInitSource, ReconcileEnv, Wait, reconcile_proxy};
use egress_k8s_api::api_error_summary;
use egress_k8s_api::crd::Proxy;
use egress_k8s_api::patch::status_patch;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

pub const FINALIZER: &str = "crawl.example.com/egress-proxies";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shown as the API's code and reason only: its message may quote the object sent (an
    /// invalid field's value: the cloud-init), and this text reaches the log.
    #[error("kube API: {}", api_error_summary(.0))]
    Kube(#[source] kube::Error),
    #[error("the Proxy has no namespace")]
    NoNamespace,
    #[error("building the patch that releases the finalizer: {0}")]
    Patch(#[source] serde_json::Error),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace => "invalid",
            Error::Patch(_) => "patch",
        }
    }
}

/// The label a Secret needs before a Proxy's `cloudInitSecretRef` may name it.
pub const CLOUD_INIT_LABEL: &str = "egress-proxies.crawl.example.com/cloud-init";

/// Reads `cloudInitSecretRef` from the Proxy's namespace at create time. The content goes to
/// the provider call and nowhere else.
pub struct SecretCloudInit {
    pub client: kube::Client,
    pub namespace: String,
}

#[async_trait::async_trait]
impl CloudInitSource for SecretCloudInit {
    async fn resolve(&self, proxy: &egress_core::Proxy) -> Result<Option<String>, String> {
        let Some(r) = &proxy.spec.cloud_init_secret_ref else {
            return Ok(proxy.spec.cloud_init.clone());
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = api.get(&r.name).await.map_err(|e| {
            format!(
                "Secret {}/{}: {}",
                self.namespace,
                r.name,
                api_error_summary(&e)
            )
        })?;
        // Only a Secret its namespace marked for the purpose: the operator may read every
        // Secret, and whoever may create a Proxy must not copy one of them into a VM's user
        // data (where the VM, and whoever can read its metadata, sees it).
        let marked = secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CLOUD_INIT_LABEL))
            .is_some_and(|v| v == "true");
        if !marked {
            return Err(format!(
                "Secret {}/{} is not marked for cloud-init: label it {CLOUD_INIT_LABEL}=true to let Proxies use it",
                self.namespace, r.name
            ));
        }
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .ok_or_else(|| {
                format!(
                    "Secret {}/{} has no key {:?}",
                    self.namespace, r.name, r.key
                )
            })?;
        String::from_utf8(bytes.0.clone()).map(Some).map_err(|_| {
            format!(
                "Secret {}/{} key {:?} is not UTF-8",
                self.namespace, r.name, r.key
            )
        })
    }
}

/// A JSON patch that removes our finalizer at the index the Proxy has it, testing it is still
/// there (as kube-runtime's finalizer helper does). It carries no resourceVersion: the status
/// written just before is a newer version than `proxy`, and a precondition on the old one
/// would be refused with 409 Conflict. None when the finalizer is not there.
pub fn release_patch(proxy: &Proxy) -> Result<Option<json_patch::Patch>, Error> {
    let Some(i) = proxy.finalizers().iter().position(|f| f == FINALIZER) else {
        return Ok(None);
    };
    let path = format!("/metadata/finalizers/{i}");
    serde_json::from_value(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))
    .map(Some)
    .map_err(Error::Patch)
}

// A span per reconcile that follows the future across awaits (an entered guard held across
// them would leave it entered on whichever reconcile the thread runs next).
pub async fn reconcile(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = egress_control::reconciler::reconcile_span(
        &proxy.to_core(),
        proxy.metadata.deletion_timestamp.is_some(),
    );
    reconcile_in_span(proxy, ctx).instrument(span).await
}

/// One reconcile, inside its `reconcile` span (one trace: the finalizer and status writes,
/// the provider calls and their capability calls).
async fn reconcile_in_span(proxy: Arc<Proxy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = proxy.namespace().ok_or(Error::NoNamespace)?;
    let name = proxy.name_any();
    let key = format!("{namespace}/{name}");
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    let has_finalizer = proxy.finalizers().iter().any(|f| f == FINALIZER);

    if !deleting && !has_finalizer {
        let mut finalizers = proxy.finalizers().to_vec();
        finalizers.push(FINALIZER.to_string());
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": proxy.resource_version()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::Kube)?;
        // The patch is a change the controller sees; it continues from there.
        return Ok(Action::await_change());
    }
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }

    let core = proxy.to_core();
    let status = proxy.status.clone().unwrap_or_default();
    let loaded = ctx.loaded();
    let cloud_init = SecretCloudInit {
        client: ctx.client.clone(),
        namespace: namespace.clone(),
    };
    let now = || egress_core::gc::format_rfc3339(ctx.now());
    let env = ReconcileEnv {
        providers: &loaded.providers,
        installation: &ctx.installation,
        cloud_init: &cloud_init,
        credentials: &ctx.credentials,
        owner_references: true,
        now: &now,
        egress: loaded.egress.as_deref(),
    };
    let result = reconcile_proxy(&env, &core, status.clone(), deleting, &key).await;

    if result.status != status {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(status_patch(&result.status)),
        )
        .await
        .map_err(Error::Kube)?;
    }
    if !result.events.is_empty() {
        let recorder = &ctx.recorder;
        let reference = proxy.object_ref(&());
        for e in &result.events {
            let event = Event {
                type_: if e.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: e.reason.clone(),
                note: Some(e.message.chars().take(1000).collect()),
                action: "Reconcile".into(),
                secondary: None,
            };
            // An event that cannot be written must not fail the reconcile.
            if let Err(err) = recorder.publish(&event, &reference).await {
                tracing::warn!("event not recorded: {}", api_error_summary(&err));
            }
        }
    }
    if let Some(checker) = &loaded.egress
        && (result.released || result.status.provider_id.is_none())
    {
        // Gone, or between instances: nothing of the last check describes it now.
        checker.forget(&key);
    }
    if result.released {
        if let Some(patch) = release_patch(&proxy)? {
            api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
                .map_err(Error::Kube)?;
        }
        ctx.forget(&key);
        ctx.credentials.forget(&core.uid());
        ctx.metrics.reconciled("ok");
        return Ok(Action::await_change());
    }
    ctx.metrics.reconciled("ok");
    Ok(match result.wait {
        Wait::After(d) => {
            ctx.forget(&key);
            Action::requeue(d)
        }
        Wait::Backoff(class) => Action::requeue(ctx.backoff(&key, class)),
        Wait::AwaitChange => {
            ctx.forget(&key);
            Action::await_change()
        }
    })
}

pub fn error_policy(_proxy: Arc<Proxy>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(label = error.metric_label(), "reconcile failed: {error}");
    ctx.metrics.reconciled("error");
    Action::requeue(Duration::from_secs(15))
}
