//! The `kube` capability's host functions: each checks the grant, opens its `kube.<call>`
//! span, records a mutating call as a plan step and calls the backend.

use crate::bindings::egress::provider::kube as wit;
use crate::call::CallState;
use crate::capabilities::kube::{KubeError, KubeRef, json_text};
use serde_json::Value;
use tracing::Instrument;

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
