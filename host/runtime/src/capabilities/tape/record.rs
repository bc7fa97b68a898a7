//! Recording: each backend trait wrapped, the real call made and written down with its
//! answer.

use super::format::{
    Answer, Arg, Entry, Secrets, TapeError, args, call_name, http_args, kube_body, kube_list_args,
    kube_ref,
};
use crate::capabilities::Backends;
use crate::capabilities::clock::ClockBackend;
use crate::capabilities::http::{HttpBackend, HttpError, HttpRequest, HttpResponse};
use crate::capabilities::kube::{KubeBackend, KubeError, KubeRef, Object, ObjectPage};
use crate::capabilities::libvirt::*;
use crate::redact::Redactor;
use egress_core::config::HttpGrant;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The calls of a run as they are made, redacted with the secrets the run adds.
#[derive(Debug, Default)]
pub struct Tape {
    entries: Mutex<Vec<Entry>>,
    secrets: Secrets,
}

impl Tape {
    pub fn new() -> Self {
        Self::default()
    }

    /// Secrets of the run (a create's htpasswd, its cloud-init) from now on: added before the
    /// calls that carry them.
    pub fn add_secrets(&self, secrets: &Redactor) {
        self.secrets.add(secrets);
    }

    /// The calls recorded so far.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Writes the tape file.
    pub fn write(&self, path: &Path) -> Result<(), TapeError> {
        super::format::write(path, &self.entries())
    }

    fn redactor(&self) -> Redactor {
        self.secrets.get()
    }

    fn push(&self, capability: &str, call: &str, args: Value, answer: Value) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Entry {
                capability: capability.to_string(),
                call: call.to_string(),
                args,
                answer,
            });
    }

    fn answered<T: Answer>(&self, capability: &str, call: &str, args: Value, out: &T) {
        let answer = out.to_tape(&self.redactor());
        self.push(capability, call, args, answer);
    }
}

impl Backends {
    /// `inner`, every capability call written to `tape` with its answer. The lock
    /// capability is the host's own and stays out of it.
    pub fn recording(inner: &Backends, tape: Arc<Tape>) -> Backends {
        recording(inner, tape)
    }
}

fn recording(inner: &Backends, tape: Arc<Tape>) -> Backends {
    Backends {
        clock: Arc::new(RecordingClock {
            inner: inner.clock.clone(),
            tape: tape.clone(),
        }),
        kube: Arc::new(RecordingKube {
            inner: inner.kube.clone(),
            tape: tape.clone(),
        }),
        http: Arc::new(RecordingHttp {
            inner: inner.http.clone(),
            tape: tape.clone(),
        }),
        libvirt: Arc::new(RecordingLibvirt {
            inner: inner.libvirt.clone(),
            tape,
        }),
    }
}

struct RecordingClock {
    inner: Arc<dyn ClockBackend>,
    tape: Arc<Tape>,
}

#[async_trait::async_trait]
impl ClockBackend for RecordingClock {
    fn now_millis(&self) -> u64 {
        let now = self.inner.now_millis();
        self.tape
            .push("clock", "now-millis", Value::Null, json!(now));
        now
    }
    async fn sleep_millis(&self, ms: u64) {
        self.inner.sleep_millis(ms).await;
        self.tape
            .push("clock", "sleep-millis", json!({"ms": ms}), Value::Null);
    }
    fn random_u64(&self) -> u64 {
        let n = self.inner.random_u64();
        self.tape.push("clock", "random-u64", Value::Null, json!(n));
        n
    }
    fn process_id(&self) -> u64 {
        let n = self.inner.process_id();
        self.tape.push("clock", "process-id", Value::Null, json!(n));
        n
    }
}

struct RecordingKube {
    inner: Arc<dyn KubeBackend>,
    tape: Arc<Tape>,
}

#[async_trait::async_trait]
impl KubeBackend for RecordingKube {
    async fn get(&self, target: &KubeRef) -> Result<Object, KubeError> {
        let a = json!({"target": kube_ref(target)});
        let out = self.inner.get(target).await;
        self.tape.answered("kube", "get", a, &out);
        out
    }
    async fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: Value,
    ) -> Result<Object, KubeError> {
        let a = json!({
            "apiVersion": api_version,
            "kind": kind,
            "namespace": namespace,
            "body": kube_body(&body, &self.tape.redactor()),
        });
        let out = self.inner.create(api_version, kind, namespace, body).await;
        self.tape.answered("kube", "create", a, &out);
        out
    }
    async fn delete(&self, target: &KubeRef) -> Result<(), KubeError> {
        let a = json!({"target": kube_ref(target)});
        let out = self.inner.delete(target).await;
        self.tape.answered("kube", "delete", a, &out);
        out
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
        let a = kube_list_args(
            api_version,
            kind,
            namespace,
            label_selector,
            limit,
            continue_token,
        );
        let out = self
            .inner
            .list(
                api_version,
                kind,
                namespace,
                label_selector,
                limit,
                continue_token,
            )
            .await;
        self.tape.answered("kube", "list", a, &out);
        out
    }
    async fn patch(&self, target: &KubeRef, merge_patch: &Value) -> Result<Object, KubeError> {
        let a = json!({
            "target": kube_ref(target),
            "patch": kube_body(merge_patch, &self.tape.redactor()),
        });
        let out = self.inner.patch(target, merge_patch).await;
        self.tape.answered("kube", "patch", a, &out);
        out
    }
    async fn patch_status(
        &self,
        target: &KubeRef,
        merge_patch: &Value,
    ) -> Result<Object, KubeError> {
        let a = json!({
            "target": kube_ref(target),
            "patch": kube_body(merge_patch, &self.tape.redactor()),
        });
        let out = self.inner.patch_status(target, merge_patch).await;
        self.tape.answered("kube", "patch-status", a, &out);
        out
    }
    async fn server_version(&self) -> Result<(String, String), KubeError> {
        let out = self.inner.server_version().await;
        self.tape
            .answered("kube", "server-version", Value::Null, &out);
        out
    }
}

struct RecordingHttp {
    inner: Arc<dyn HttpBackend>,
    tape: Arc<Tape>,
}

#[async_trait::async_trait]
impl HttpBackend for RecordingHttp {
    async fn send(&self, req: HttpRequest, grant: &HttpGrant) -> Result<HttpResponse, HttpError> {
        let a = http_args(&req, &self.tape.redactor());
        let out = self.inner.send(req, grant).await;
        self.tape.answered("http", "send", a, &out);
        out
    }
}

struct RecordingLibvirt {
    inner: Arc<dyn LibvirtBackend>,
    tape: Arc<Tape>,
}

macro_rules! recording {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        #[async_trait::async_trait]
        impl LibvirtBackend for RecordingLibvirt {
            fn for_entry(
                self: Arc<Self>,
                entry: &str,
                hosts: &[LibvirtHost],
            ) -> Result<Arc<dyn LibvirtBackend>, String> {
                let inner = self.inner.clone().for_entry(entry, hosts)?;
                Ok(Arc::new(RecordingLibvirt {
                    inner,
                    tape: self.tape.clone(),
                }))
            }
            $(async fn $name(&self, $($arg: $ty),*) -> $ret {
                let r = self.tape.redactor();
                let a = args(vec![$((stringify!($arg), Arg::arg(&$arg, &r))),*]);
                let out = self.inner.$name($($arg),*).await;
                self.tape.answered("libvirt", &call_name(stringify!($name)), a, &out);
                out
            })*
            async fn probe(&self, targets: Vec<ProbeTarget>) -> Vec<ProbeResult> {
                let a = args(vec![("targets", targets.arg(&self.tape.redactor()))]);
                let out = self.inner.probe(targets).await;
                self.tape.answered("libvirt", "probe", a, &out);
                out
            }
        }
    };
}

crate::capabilities::libvirt::libvirt_calls!(recording);
