//! The simulated Kubernetes API behind the `kube` capability: the cluster model of
//! `egress_sim::kube` (uid, one resourceVersion counter, generation, finalizers, the status
//! subresource, selectors) with its kubelet running Pods with an IP after `podStartSeconds` of
//! simulated time; faults to inject; seeded from the world file.

use crate::capabilities::clock::ClockBackend;
use crate::capabilities::kube::{KubeBackend, KubeError, KubeRef, Object, ObjectPage};
use egress_sim::kube::{
    ApiError, Cluster, DeleteOptions, Key, Kubelet, LabelSelector, Options, Patch, Selection,
    Subresource,
};
use serde_json::Value;
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
    #[serde(default = "once")]
    pub times: u32,
    pub status: u16,
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// A fault happens once unless it says how many times.
fn once() -> u32 {
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

/// The simulated API server: the cluster model of `egress_sim::kube` (the one the guest SDK's
/// fake and the API double serve too) with its kubelet running Pods, the world file's objects
/// and faults, on the capability's clock.
pub struct SimKube {
    spec: SimKubeSpec,
    clock: Arc<dyn ClockBackend>,
    state: Mutex<SimState>,
    /// The JSON text of the version of each object last read, kept with that version: a
    /// Pod reads the same between its changes, and every resync of a kubernetes Proxy reads
    /// its Pod. The version is held, so a text is never taken for a later one's.
    texts: Mutex<std::collections::HashMap<Key, (Object, String)>>,
}

/// Texts kept at most; past it the oldest reads are forgotten all at once (a dry-run's
/// Pods come and go, and each is read again within its resync interval).
const TEXTS_KEPT: usize = 4096;

struct SimState {
    cluster: Cluster,
    faults: Vec<SimFault>,
    rate: egress_sim::faults::RateFaults,
}

impl SimKube {
    pub fn new(spec: SimKubeSpec, clock: Arc<dyn ClockBackend>) -> Self {
        let mut cluster = Cluster::new(Options {
            kubelet: Some(Kubelet {
                start_ms: spec.pod_start_seconds.saturating_mul(1000),
                termination_ms: spec.pod_termination_seconds.saturating_mul(1000),
            }),
            // A provider may be granted any kind; the dry-run serves what it asks for.
            infer_unknown_kinds: true,
            uid: sim_uid,
            // The capability has no watch and pages no lists, so no change is ever read back
            // from the model's log: keeping the default 10,000 (each holding an object and
            // its previous version) only held every Pod twice in a large dry-run.
            history: 1,
            ..Options::default()
        });
        cluster.set_now(clock.now_millis());
        for obj in &spec.objects {
            if let Err(e) = cluster.insert(obj.clone()) {
                tracing::warn!("world file object skipped: {e}");
            }
        }
        Self {
            state: Mutex::new(SimState {
                cluster,
                faults: spec.faults.clone(),
                rate: Default::default(),
            }),
            spec,
            clock,
            texts: Mutex::default(),
        }
    }

    /// Draws every call against `faults` (a world's `faults` section), after the counted
    /// faults.
    pub fn with_rate_faults(self, faults: egress_sim::faults::RateFaults) -> Self {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).rate = faults;
        self
    }

    /// Runs `f` on the model at the clock's time, after the call's injected fault if any:
    /// a counted one first, then one drawn at a rate, in the API server's own shapes.
    fn call<T>(
        &self,
        call: &str,
        f: impl FnOnce(&mut Cluster) -> Result<T, ApiError>,
    ) -> Result<T, KubeError> {
        use egress_sim::faults::FaultClass;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fault) = st.faults.iter_mut().find(|f| f.call == call && f.times > 0) {
            fault.times -= 1;
            return Err(KubeError::new(
                fault.status,
                &fault.reason,
                fault.message.clone(),
            ));
        }
        let trap = match st.rate.draw(call) {
            None => false,
            Some(FaultClass::Transient) => {
                return Err(KubeError::new(
                    503,
                    "ServiceUnavailable",
                    format!(
                        "the server is currently unable to handle the request (injected into {call})"
                    ),
                ));
            }
            Some(FaultClass::Quota) => {
                return Err(KubeError::new(
                    403,
                    "Forbidden",
                    format!("{call} is forbidden: exceeded quota: injected"),
                ));
            }
            Some(FaultClass::Timeout) => {
                return Err(KubeError::new(
                    504,
                    "Timeout",
                    format!(
                        "Timeout: request did not complete within the allowed duration (injected into {call})"
                    ),
                ));
            }
            Some(FaultClass::Trap) => true,
        };
        st.cluster.set_now(self.clock.now_millis());
        let out = f(&mut st.cluster).map_err(from_api);
        if trap {
            crate::trap::inject_trap(format!("injected trap after kube.{call}"));
        }
        out
    }

    /// Writes a merge patch to an object's status subresource, as a kubelet or another
    /// controller does (a patch through the main resource leaves status alone).
    pub fn patch_status(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError> {
        let key = key(target);
        self.call("patch", |c| {
            c.patch(
                &key,
                &Patch::Merge(merge_patch.clone()),
                Subresource::Status,
            )
        })
    }
}

/// The uids the simulated cluster has always given, so dry-run plans keep theirs.
fn sim_uid(n: u64) -> String {
    format!("5e1f0000-0000-4000-8000-{n:012x}")
}

fn key(r: &KubeRef) -> Key {
    Key::new(&r.api_version, &r.kind, r.namespace.as_deref(), &r.name)
}

fn from_api(e: ApiError) -> KubeError {
    KubeError::new(e.code, &e.reason, e.message)
}

pub fn rfc3339_ms(ms: u64) -> String {
    egress_sim::kube::rfc3339(ms)
}

#[async_trait::async_trait]
impl KubeBackend for SimKube {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError> {
        let key = key(target);
        self.call("get", |c| c.get(&key))
    }

    async fn get_text(&self, target: &KubeRef) -> Result<String, KubeError> {
        let key = key(target);
        let object = self.call("get", |c| c.get(&key))?;
        let mut texts = self.texts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((kept, text)) = texts.get(&key)
            && Arc::ptr_eq(kept, &object)
        {
            return Ok(text.clone());
        }
        let text = crate::capabilities::kube::json_text(&object);
        if texts.len() >= TEXTS_KEPT {
            texts.clear();
        }
        texts.insert(key, (object, text.clone()));
        Ok(text)
    }

    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError> {
        self.call("create", |c| c.create(api_version, kind, namespace, body))
    }

    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError> {
        let key = key(target);
        self.call("delete", |c| c.delete(&key, &DeleteOptions::default()))
            .map(|_| ())
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
        self.call("list", |c| {
            let mut sel = Selection::of(api_version, kind, namespace);
            sel.labels = LabelSelector::parse(label_selector).map_err(ApiError::bad_request)?;
            let page = c.list(&sel, limit.map(|l| l as usize), continue_token)?;
            Ok(ObjectPage {
                items: page.items,
                continue_token: page.continue_token,
            })
        })
    }

    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError> {
        let key = key(target);
        self.call("patch", |c| {
            c.patch(&key, &Patch::Merge(merge_patch.clone()), Subresource::Main)
        })
    }

    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError> {
        SimKube::patch_status(self, target, merge_patch)
    }

    async fn server_version(&self) -> Result<(String, String), KubeError> {
        self.call("server-version", |_| Ok(()))?;
        Ok((
            self.spec.server_version.clone(),
            "https://sim-apiserver.invalid".to_string(),
        ))
    }
}

/// RFC 7386 JSON merge patch (the cluster model's).
pub use egress_sim::kube::merge_patch as merge;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::capabilities::clock::VirtualClock;
    use serde_json::json;
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

    /// A get's text is the JSON of the object as it is at that read: the same between its
    /// changes, the new version's after the kubelet runs the Pod, a patch, or a delete and a
    /// create under the same name.
    #[tokio::test]
    async fn a_gets_text_is_the_json_of_the_version_read() {
        let clock = Arc::new(VirtualClock::new(0, 1));
        let sim = SimKube::new(SimKubeSpec::default(), clock.clone());
        sim.create("v1", "Pod", Some("ns"), pod("a")).await.unwrap();
        async fn read(sim: &SimKube) -> String {
            let text = sim.get_text(&pod_ref("a")).await.unwrap();
            let object = sim.get(&pod_ref("a")).await.unwrap();
            assert_eq!(text, object.to_string());
            text
        }
        let first = read(&sim).await;
        assert_eq!(read(&sim).await, first);
        clock.advance(Duration::from_secs(600));
        let running = read(&sim).await;
        assert_ne!(running, first, "the kubelet ran the Pod");
        sim.patch(&pod_ref("a"), &json!({"metadata": {"labels": {"m": "no"}}}))
            .await
            .unwrap();
        let patched = read(&sim).await;
        assert!(patched.contains(r#""m":"no""#), "{patched}");
        sim.delete(&pod_ref("a")).await.unwrap();
        clock.advance(Duration::from_secs(600));
        assert!(sim.get_text(&pod_ref("a")).await.is_err());
        sim.create("v1", "Pod", Some("ns"), pod("a")).await.unwrap();
        let again = read(&sim).await;
        assert!(again.contains(r#""m":"true""#), "{again}");
    }

    /// Faults at a rate fail calls in the API server's shapes, before the call reaches the
    /// cluster, and only while switched on.
    #[tokio::test]
    async fn rate_faults_answer_like_the_api_server() {
        use egress_sim::faults::{FaultClass, FaultRule, FaultSwitch, RateFaults};
        let rule = |call: &str, class| FaultRule {
            capability: "kube".into(),
            call: call.into(),
            rate: 1.0,
            class,
        };
        let rules = [
            rule("create", FaultClass::Transient),
            rule("get", FaultClass::Quota),
            rule("delete", FaultClass::Timeout),
        ];
        let switch = FaultSwitch::default();
        let sim = SimKube::new(SimKubeSpec::default(), Arc::new(VirtualClock::new(0, 1)))
            .with_rate_faults(RateFaults::new(1, "kube", &rules).switched_by(&switch));
        let e = sim
            .create("v1", "Pod", Some("ns"), pod("a"))
            .await
            .unwrap_err();
        assert_eq!((e.status, e.reason.as_str()), (503, "ServiceUnavailable"));
        let e = sim.get(&pod_ref("a")).await.unwrap_err();
        assert_eq!(e.status, 403);
        assert!(e.message.contains("exceeded quota"), "{}", e.message);
        assert_eq!(sim.delete(&pod_ref("a")).await.unwrap_err().status, 504);
        switch.set_enabled(false);
        sim.create("v1", "Pod", Some("ns"), pod("a")).await.unwrap();
        assert_eq!(
            sim.get(&pod_ref("a")).await.unwrap()["metadata"]["name"],
            "a"
        );
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
            sim.list("v1", "Pod", None, "m=true", None, None)
                .await
                .unwrap()
                .items
                .len(),
            2
        );
        assert_eq!(
            sim.list("v1", "Pod", Some("ns"), "m=true", None, None)
                .await
                .unwrap()
                .items
                .len(),
            1
        );
        assert_eq!(
            sim.list("v1", "Pod", None, "", Some(1), None)
                .await
                .unwrap()
                .items
                .len(),
            1
        );
        assert_eq!(
            sim.list("v1", "Pod", None, "m!=true", None, None)
                .await
                .unwrap()
                .items
                .len(),
            1
        );
    }
}
