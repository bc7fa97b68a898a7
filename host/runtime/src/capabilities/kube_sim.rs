//! The simulated Kubernetes API behind the `kube` capability: objects with uid,
//! resourceVersion, labels, creationTimestamp and deletionTimestamp; Pods that run with an IP
//! after `podStartSeconds` of simulated time; faults to inject; seeded from the world file.

use crate::capabilities::clock::ClockBackend;
use crate::capabilities::kube::{KubeBackend, KubeError, KubeRef};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

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
