//! The `kube` capability: dynamic objects as JSON. The grant limits kinds and namespaces (or
//! allows cluster scope); every mutating call is a plan step.

use crate::bindings::egress::provider::kube as wit;
use crate::call::CallState;
use crate::capabilities::clock::ClockBackend;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tracing::Instrument;

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

#[async_trait::async_trait]
pub trait KubeBackend: Send + Sync {
    async fn get(&self, target: &KubeRef) -> Result<Value, KubeError>;
    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Value, KubeError>;
    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError>;
    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
        limit: Option<u32>,
    ) -> Result<Vec<Value>, KubeError>;
    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Value, KubeError>;
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

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, KubeError> {
    serde_json::to_value(v).map_err(|e| KubeError::new(0, "Decode", e.to_string()))
}

#[async_trait::async_trait]
impl KubeBackend for RealKube {
    async fn get(&self, target: &KubeRef) -> Result<Value, KubeError> {
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
    ) -> Result<Value, KubeError> {
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
    ) -> Result<Vec<Value>, KubeError> {
        let api = self.api(api_version, kind, namespace).await?;
        let mut params = kube::api::ListParams::default();
        if !label_selector.is_empty() {
            params = params.labels(label_selector);
        }
        if let Some(l) = limit {
            params = params.limit(l);
        }
        let list = api.list(&params).await.map_err(from_kube)?;
        list.items.iter().map(to_value).collect()
    }

    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Value, KubeError> {
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

    async fn server_version(&self) -> Result<(String, String), KubeError> {
        let (client, address) = self.client().await?;
        let info = client.apiserver_version().await.map_err(from_kube)?;
        Ok((info.git_version, address.clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// The simulated backend.

/// How the simulated cluster behaves, from the world file's `kube` section.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimKubeSpec {
    /// `gitVersion` reported by the API server.
    #[serde(default = "default_version")]
    pub server_version: String,
    /// Seconds of simulated time from a Pod's creation until it runs with an IP.
    #[serde(default = "default_start")]
    pub pod_start_seconds: u64,
    /// Seconds a deleted Pod stays Terminating (with a deletionTimestamp) before it is gone.
    #[serde(default)]
    pub pod_termination_seconds: u64,
    /// Objects present at the start (any kind; Pods keep the status given).
    #[serde(default)]
    pub objects: Vec<Value>,
    /// Failures to inject: the call (`get`, `create`, ...) fails `times` times with this answer.
    #[serde(default)]
    pub faults: Vec<SimFault>,
}

#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SimFault {
    pub call: String,
    #[serde(default = "one")]
    pub times: u32,
    pub status: u16,
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

fn one() -> u32 {
    1
}
fn default_version() -> String {
    "v1.33.0".to_string()
}
fn default_start() -> u64 {
    3
}

impl Default for SimKubeSpec {
    fn default() -> Self {
        Self {
            server_version: default_version(),
            pod_start_seconds: default_start(),
            pod_termination_seconds: 0,
            objects: vec![],
            faults: vec![],
        }
    }
}

type ObjKey = (String, String, String, String);

struct SimObject {
    value: Value,
    created_ms: u64,
    /// Set for managed Pods created through the API: they advance Pending -> Running.
    simulated_pod: Option<String>,
    deleted_ms: Option<u64>,
}

struct SimState {
    objects: BTreeMap<ObjKey, SimObject>,
    next_uid: u64,
    next_ip: u32,
    resource_version: u64,
    faults: Vec<SimFault>,
}

/// An in-memory API server: objects with uid, resourceVersion, labels, creationTimestamp and
/// deletionTimestamp; Pods that turn Running with an IP after `podStartSeconds` of simulated
/// time and linger Terminating for `podTerminationSeconds`.
pub struct SimKube {
    spec: SimKubeSpec,
    clock: Arc<dyn ClockBackend>,
    state: Mutex<SimState>,
}

impl SimKube {
    pub fn new(spec: SimKubeSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let now = clock.now_millis();
        let mut state = SimState {
            objects: BTreeMap::new(),
            next_uid: 0,
            next_ip: 0,
            resource_version: 0,
            faults: spec.faults.clone(),
        };
        for obj in &spec.objects {
            let api_version = obj["apiVersion"].as_str().unwrap_or("v1").to_string();
            let kind = obj["kind"].as_str().unwrap_or("").to_string();
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            let mut value = obj.clone();
            state.next_uid += 1;
            state.resource_version += 1;
            let meta = &mut value["metadata"];
            if meta["uid"].is_null() {
                meta["uid"] = json!(sim_uid(state.next_uid));
            }
            meta["resourceVersion"] = json!(state.resource_version.to_string());
            if meta["creationTimestamp"].is_null() {
                meta["creationTimestamp"] = json!(rfc3339_ms(now));
            }
            state.objects.insert(
                (api_version, kind, ns, name),
                SimObject {
                    value,
                    created_ms: now,
                    simulated_pod: None,
                    deleted_ms: None,
                },
            );
        }
        Self {
            spec,
            clock,
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fault(state: &mut SimState, call: &str) -> Result<(), KubeError> {
        if let Some(f) = state
            .faults
            .iter_mut()
            .find(|f| f.call == call && f.times > 0)
        {
            f.times -= 1;
            return Err(KubeError::new(f.status, &f.reason, f.message.clone()));
        }
        Ok(())
    }

    /// Brings every object up to the current simulated time: Pods start, deleted Pods go.
    fn advance(&self, state: &mut SimState) {
        let now = self.clock.now_millis();
        let start = self.spec.pod_start_seconds * 1000;
        let grace = self.spec.pod_termination_seconds * 1000;
        state
            .objects
            .retain(|_, o| o.deleted_ms.is_none_or(|d| now < d.saturating_add(grace)));
        for obj in state.objects.values_mut() {
            if let Some(ip) = &obj.simulated_pod
                && obj.deleted_ms.is_none()
                && now >= obj.created_ms.saturating_add(start)
                && obj.value["status"]["phase"] == "Pending"
            {
                obj.value["status"] = json!({"phase": "Running", "podIP": ip, "startTime": rfc3339_ms(obj.created_ms + start)});
            }
        }
    }

    fn key(r: &KubeRef) -> ObjKey {
        (
            r.api_version.clone(),
            r.kind.clone(),
            r.namespace.clone().unwrap_or_default(),
            r.name.clone(),
        )
    }
}

fn not_found(r: &KubeRef) -> KubeError {
    KubeError::new(
        404,
        "NotFound",
        format!("{} {:?} not found", r.kind.to_lowercase(), r.name),
    )
}

fn sim_uid(n: u64) -> String {
    format!("5e1f0000-0000-4000-8000-{n:012x}")
}

pub fn rfc3339_ms(ms: u64) -> String {
    egress_core::gc::format_rfc3339((ms / 1000) as i64)
}

#[async_trait::async_trait]
impl KubeBackend for SimKube {
    async fn get(&self, target: &KubeRef) -> Result<Value, KubeError> {
        let mut st = self.lock();
        Self::fault(&mut st, "get")?;
        self.advance(&mut st);
        st.objects
            .get(&Self::key(target))
            .map(|o| o.value.clone())
            .ok_or_else(|| not_found(target))
    }

    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        mut body: Value,
    ) -> Result<Value, KubeError> {
        let mut st = self.lock();
        Self::fault(&mut st, "create")?;
        self.advance(&mut st);
        let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
        if name.is_empty() {
            return Err(KubeError::new(
                422,
                "Invalid",
                "metadata.name: Required value",
            ));
        }
        let key = (
            api_version.to_string(),
            kind.to_string(),
            namespace.unwrap_or("").to_string(),
            name.clone(),
        );
        if st.objects.contains_key(&key) {
            return Err(KubeError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", kind.to_lowercase()),
            ));
        }
        let now = self.clock.now_millis();
        st.next_uid += 1;
        st.resource_version += 1;
        let uid = sim_uid(st.next_uid);
        let rv = st.resource_version.to_string();
        let meta = &mut body["metadata"];
        meta["uid"] = json!(uid);
        meta["resourceVersion"] = json!(rv);
        meta["creationTimestamp"] = json!(rfc3339_ms(now));
        if let Some(ns) = namespace {
            meta["namespace"] = json!(ns);
        }
        let simulated_pod = if kind == "Pod" && api_version == "v1" {
            st.next_ip += 1;
            body["status"] = json!({"phase": "Pending"});
            Some(format!(
                "10.244.{}.{}",
                st.next_ip / 250,
                st.next_ip % 250 + 2
            ))
        } else {
            None
        };
        st.objects.insert(
            key,
            SimObject {
                value: body.clone(),
                created_ms: now,
                simulated_pod,
                deleted_ms: None,
            },
        );
        Ok(body)
    }

    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError> {
        let mut st = self.lock();
        Self::fault(&mut st, "delete")?;
        self.advance(&mut st);
        let now = self.clock.now_millis();
        let key = Self::key(target);
        let grace = self.spec.pod_termination_seconds;
        let Some(obj) = st.objects.get_mut(&key) else {
            return Err(not_found(target));
        };
        if grace == 0 || target.kind != "Pod" {
            st.objects.remove(&key);
        } else if obj.deleted_ms.is_none() {
            obj.deleted_ms = Some(now);
            obj.value["metadata"]["deletionTimestamp"] = json!(rfc3339_ms(now));
        }
        Ok(())
    }

    async fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: &str,
        limit: Option<u32>,
    ) -> Result<Vec<Value>, KubeError> {
        let mut st = self.lock();
        Self::fault(&mut st, "list")?;
        self.advance(&mut st);
        let selector =
            parse_selector(label_selector).map_err(|m| KubeError::new(400, "BadRequest", m))?;
        let mut out = Vec::new();
        for ((av, k, ns, _), obj) in &st.objects {
            if av != api_version || k != kind || namespace.is_some_and(|n| n != ns) {
                continue;
            }
            if selector
                .iter()
                .all(|t| t.matches(&obj.value["metadata"]["labels"]))
            {
                out.push(obj.value.clone());
                if limit.is_some_and(|l| out.len() >= l as usize) {
                    break;
                }
            }
        }
        Ok(out)
    }

    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Value, KubeError> {
        let mut st = self.lock();
        Self::fault(&mut st, "patch")?;
        self.advance(&mut st);
        st.resource_version += 1;
        let rv = st.resource_version.to_string();
        let obj = st
            .objects
            .get_mut(&Self::key(target))
            .ok_or_else(|| not_found(target))?;
        merge(&mut obj.value, merge_patch);
        obj.value["metadata"]["resourceVersion"] = json!(rv);
        Ok(obj.value.clone())
    }

    async fn server_version(&self) -> Result<(String, String), KubeError> {
        let mut st = self.lock();
        Self::fault(&mut st, "server-version")?;
        Ok((
            self.spec.server_version.clone(),
            "https://sim-apiserver.invalid".to_string(),
        ))
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Default::default());
            }
            if let Some(t) = target.as_object_mut() {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// One term of an equality-based label selector.
#[derive(Debug, PartialEq, Eq)]
pub enum SelectorTerm {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
}

impl SelectorTerm {
    fn matches(&self, labels: &Value) -> bool {
        match self {
            Self::Equals(k, v) => labels[k.as_str()].as_str() == Some(v.as_str()),
            Self::NotEquals(k, v) => labels[k.as_str()].as_str() != Some(v.as_str()),
            Self::Exists(k) => labels.get(k.as_str()).is_some(),
        }
    }
}

pub fn parse_selector(s: &str) -> Result<Vec<SelectorTerm>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            if let Some((k, v)) = t.split_once("!=") {
                Ok(SelectorTerm::NotEquals(k.trim().into(), v.trim().into()))
            } else if let Some((k, v)) = t.split_once('=') {
                Ok(SelectorTerm::Equals(
                    k.trim().into(),
                    v.trim_start_matches('=').trim().into(),
                ))
            } else if t.contains(' ') {
                Err(format!("unsupported selector term {t:?}"))
            } else {
                Ok(SelectorTerm::Exists(t.into()))
            }
        })
        .collect()
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
    fn kube_denied(&self, kind: &str, namespace: Option<&str>) -> Option<wit::KubeError> {
        let why = match &self.grants.kube {
            None => Some("no kube grant".to_string()),
            Some(g) => g.deny_reason(kind, namespace),
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
}

impl wit::Host for CallState {
    async fn get(&mut self, target: wit::ObjectRef) -> Result<String, wit::KubeError> {
        if let Some(e) = self.kube_denied(&target.kind, target.namespace.as_deref()) {
            return Err(e);
        }
        let r = to_ref(&target);
        let span =
            tracing::debug_span!("kube.get", provider = %self.provider, object = %r.describe());
        let backend = self.backends.kube.clone();
        async move {
            let out = backend.get(&r).await;
            tracing::debug!(ok = out.is_ok(), "kube get {}", r.describe());
            out.map(|v| v.to_string()).map_err(to_wit)
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
        if let Some(e) = self.kube_denied(&kind, namespace.as_deref()) {
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
        out.map(|v| v.to_string()).map_err(to_wit)
    }

    async fn delete(&mut self, target: wit::ObjectRef) -> Result<(), wit::KubeError> {
        if let Some(e) = self.kube_denied(&target.kind, target.namespace.as_deref()) {
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
        let Some(grant) = self.grants.kube.clone() else {
            return Err(self
                .kube_denied(&options.kind, options.namespace.as_deref())
                .unwrap_or_else(|| to_wit(KubeError::new(0, "Denied", "no kube grant"))));
        };
        // Without a namespace: every namespace the grant allows.
        let namespaces: Vec<Option<String>> = match (&options.namespace, grant.cluster_scope) {
            (Some(ns), _) => vec![Some(ns.clone())],
            (None, true) => vec![None],
            (None, false) => grant.namespaces.iter().cloned().map(Some).collect(),
        };
        for ns in &namespaces {
            if let Some(e) = self.kube_denied(&options.kind, ns.as_deref()) {
                return Err(e);
            }
        }
        let span = tracing::debug_span!("kube.list", provider = %self.provider, kind = %options.kind, selector = %options.label_selector);
        let backend = self.backends.kube.clone();
        async move {
            let mut out = Vec::new();
            for ns in namespaces {
                let remaining = options.limit.map(|l| l.saturating_sub(out.len() as u32));
                if remaining == Some(0) {
                    break;
                }
                let items = backend
                    .list(
                        &options.api_version,
                        &options.kind,
                        ns.as_deref(),
                        &options.label_selector,
                        remaining,
                    )
                    .await
                    .map_err(to_wit)?;
                out.extend(items.iter().map(Value::to_string));
            }
            tracing::debug!(count = out.len(), "kube list {}", options.kind);
            Ok(out)
        }
        .instrument(span)
        .await
    }

    async fn patch(
        &mut self,
        target: wit::ObjectRef,
        merge_patch: String,
    ) -> Result<String, wit::KubeError> {
        if let Some(e) = self.kube_denied(&target.kind, target.namespace.as_deref()) {
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
        out.map(|v| v.to_string()).map_err(to_wit)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::capabilities::clock::VirtualClock;
    use std::time::Duration;

    fn pod(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"m": "true"}}})
    }

    fn pod_ref(name: &str) -> KubeRef {
        KubeRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    #[tokio::test]
    async fn pods_start_after_the_configured_time() {
        let clock = Arc::new(VirtualClock::new(0, 1));
        let sim = SimKube::new(SimKubeSpec::default(), clock.clone());
        let created = sim.create("v1", "Pod", Some("ns"), pod("a")).await.unwrap();
        assert_eq!(created["status"]["phase"], "Pending");
        assert_eq!(
            created["metadata"]["creationTimestamp"],
            "1970-01-01T00:00:00Z"
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(
            sim.get(&pod_ref("a")).await.unwrap()["status"]["phase"],
            "Pending"
        );
        clock.advance(Duration::from_secs(1));
        let got = sim.get(&pod_ref("a")).await.unwrap();
        assert_eq!(got["status"]["phase"], "Running");
        assert_eq!(got["status"]["podIP"], "10.244.0.3");
    }

    #[tokio::test]
    async fn deleted_pods_linger_terminating() {
        let clock = Arc::new(VirtualClock::new(0, 1));
        let spec = SimKubeSpec {
            pod_termination_seconds: 5,
            ..Default::default()
        };
        let sim = SimKube::new(spec, clock.clone());
        sim.create("v1", "Pod", Some("ns"), pod("a")).await.unwrap();
        sim.delete(&pod_ref("a")).await.unwrap();
        let got = sim.get(&pod_ref("a")).await.unwrap();
        assert!(got["metadata"]["deletionTimestamp"].is_string());
        let again = sim
            .create("v1", "Pod", Some("ns"), pod("a"))
            .await
            .unwrap_err();
        assert_eq!(again.status, 409);
        clock.advance(Duration::from_secs(5));
        assert_eq!(sim.get(&pod_ref("a")).await.unwrap_err().status, 404);
    }

    #[tokio::test]
    async fn faults_fire_the_given_number_of_times() {
        let clock = Arc::new(VirtualClock::new(0, 1));
        let spec = SimKubeSpec {
            faults: vec![SimFault {
                call: "create".into(),
                times: 2,
                status: 500,
                reason: "InternalError".into(),
                message: "etcd".into(),
            }],
            ..Default::default()
        };
        let sim = SimKube::new(spec, clock);
        for _ in 0..2 {
            assert_eq!(
                sim.create("v1", "Pod", Some("ns"), pod("a"))
                    .await
                    .unwrap_err()
                    .status,
                500
            );
        }
        sim.create("v1", "Pod", Some("ns"), pod("a")).await.unwrap();
    }

    #[tokio::test]
    async fn list_filters_by_namespace_and_selector() {
        let clock = Arc::new(VirtualClock::new(0, 1));
        let sim = SimKube::new(SimKubeSpec::default(), clock);
        sim.create("v1", "Pod", Some("ns"), pod("a")).await.unwrap();
        sim.create("v1", "Pod", Some("other"), pod("b"))
            .await
            .unwrap();
        sim.create("v1", "Pod", Some("ns"), json!({"metadata": {"name": "c"}}))
            .await
            .unwrap();
        assert_eq!(
            sim.list("v1", "Pod", None, "m=true", None)
                .await
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            sim.list("v1", "Pod", Some("ns"), "m=true", None)
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            sim.list("v1", "Pod", None, "", Some(1))
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            sim.list("v1", "Pod", None, "m!=true", None)
                .await
                .unwrap()
                .len(),
            1
        );
    }
}
