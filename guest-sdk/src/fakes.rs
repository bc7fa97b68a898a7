//! In-memory capabilities for native unit tests of provider logic, like controller-runtime's
//! fake client: Kubernetes is the cluster model the dry-run and the API double serve too (uid,
//! resourceVersion, generation, finalizers, the status subresource, selectors); faults can be
//! queued per call; every log line is captured so a test can assert what was (not) logged.

pub use crate::fake_clock::FakeClock;
use crate::fake_libvirt::FakeLibvirt;
use crate::host::{Clock, Held, Host, Http, Kube, Libvirt, Locks, Log};
use crate::libvirt::{
    AddressSource, DomainState, InterfaceAddresses, LibvirtError, NodeInfo, PoolInfo, ProbeResult,
    ProbeTarget, Transfer, VolumeInfo,
};
use crate::{HttpError, HttpRequest, HttpResponse, KubeError, Level, ListOptions, ObjectRef};
use egress_sim::kube::{
    ApiError, Cluster, DeleteOptions, Key, LabelSelector, Options, Patch, Selection, Subresource,
};
use serde_json::{Value, json};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

/// A captured log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: Level,
    pub message: String,
    pub fields: Vec<(String, String)>,
}

/// A fake Kubernetes API: the cluster model of `egress_sim::kube` (the one the dry-run and the
/// operator's API double serve), with faults queued per call and every call recorded.
pub struct FakeKube {
    cluster: RefCell<Cluster>,
    faults: RefCell<VecDeque<(String, KubeError)>>,
    calls: RefCell<Vec<String>>,
    now: Cell<u64>,
}

fn fake_uid(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

impl Default for FakeKube {
    fn default() -> Self {
        Self {
            cluster: RefCell::new(Cluster::new(Options {
                // A provider may be granted any kind; its tests create what it asks for.
                infer_unknown_kinds: true,
                uid: fake_uid,
                ..Options::default()
            })),
            faults: RefCell::new(VecDeque::new()),
            calls: RefCell::new(Vec::new()),
            now: Cell::new(0),
        }
    }
}

/// A fake HTTP capability: a handler answers every request.
pub type HttpHandler = Box<dyn Fn(&HttpRequest) -> Result<HttpResponse, HttpError>>;

/// Capabilities in memory. Libvirt and HTTP answer `Denied` unless a test installs a handler.
pub struct FakeHost {
    pub kube: FakeKube,
    /// Denied unless a test installs one with [`FakeHost::with_libvirt`].
    libvirt: Box<dyn Libvirt>,
    http: RefCell<Option<HttpHandler>>,
    logs: RefCell<Vec<LogLine>>,
    clock_ms: FakeClock,
    rng: Cell<u64>,
    pub locks: FakeLocks,
    /// When the fake call ends; None: ten minutes after whatever time it is now, as if every
    /// capability call started a fresh call.
    call_deadline_ms: Cell<Option<u64>>,
    /// What `proxy_htpasswd` answers: [`FAKE_HTPASSWD`] unless a test sets another.
    pub htpasswd: RefCell<Option<String>>,
}

/// The htpasswd a [`FakeHost`] hands a create by default: a real SHA-512 crypt line, of the
/// password [`FAKE_PASSWORD`] for the user `fake-proxy`.
pub const FAKE_HTPASSWD: &str = "fake-proxy:$6$rounds=5000$c2FsdHNhbHRzYWx0$rSyUEPQAK88gypcRYg.Y.4GYNwDN102Wi6hBfRorG9Wq444M3Gl0vwpfyybmqMEdYHL/iNgqzRF4ic.0TBNne1\n";
/// [`FAKE_HTPASSWD`], checked: what a test hands a generator that takes an htpasswd.
pub fn fake_htpasswd() -> crate::squid::Htpasswd {
    crate::squid::Htpasswd::parse(FAKE_HTPASSWD)
        .unwrap_or_else(|_| crate::squid::Htpasswd::nobody())
}

/// The password [`FAKE_HTPASSWD`] accepts.
pub const FAKE_PASSWORD: &str = "fake-password-of-the-fake-proxy";

/// Locks as one call sees them: a key held twice fails at once (a native test has no other
/// call to wait for), every acquisition is recorded.
#[derive(Default, Clone)]
pub struct FakeLocks {
    held: std::rc::Rc<RefCell<std::collections::BTreeSet<String>>>,
    taken: std::rc::Rc<RefCell<Vec<String>>>,
}

impl FakeLocks {
    /// Keys held now.
    pub fn held(&self) -> Vec<String> {
        self.held.borrow().iter().cloned().collect()
    }
    /// Every key acquired so far, in order.
    pub fn taken(&self) -> Vec<String> {
        self.taken.borrow().clone()
    }
}

struct FakeGuard {
    key: String,
    held: std::rc::Rc<RefCell<std::collections::BTreeSet<String>>>,
}

impl Drop for FakeGuard {
    fn drop(&mut self) {
        self.held.borrow_mut().remove(&self.key);
    }
}

impl Locks for FakeLocks {
    fn acquire(&self, key: &str, _wait_ms: u64) -> Result<Held, String> {
        if !self.held.borrow_mut().insert(key.to_string()) {
            return Err(format!("lock {key:?} is already held by this call"));
        }
        self.taken.borrow_mut().push(key.to_string());
        Ok(Held::new(FakeGuard {
            key: key.to_string(),
            held: self.held.clone(),
        }))
    }
    fn holder_id(&self) -> String {
        "fake-host".to_string()
    }
}

impl Default for FakeHost {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeHost {
    pub fn new() -> Self {
        Self {
            kube: FakeKube::default(),
            libvirt: Box::new(DeniedLibvirt),
            http: RefCell::new(None),
            logs: RefCell::new(Vec::new()),
            clock_ms: FakeClock::new(),
            rng: Cell::new(0x9e37_79b9_7f4a_7c15),
            locks: FakeLocks::default(),
            call_deadline_ms: Cell::new(None),
            htpasswd: RefCell::new(Some(FAKE_HTPASSWD.to_string())),
        }
    }

    /// The host's clock, to share with fake backends.
    pub fn clock(&self) -> FakeClock {
        self.clock_ms.clone()
    }

    /// A host whose libvirt capability is the in-memory hypervisor `libvirt`, on its clock.
    pub fn with_fake_libvirt(libvirt: &FakeLibvirt) -> Self {
        Self {
            libvirt: Box::new(libvirt.clone()),
            clock_ms: libvirt.clock(),
            ..Self::new()
        }
    }

    /// A host whose libvirt capability is `libvirt`, on a clock of its own (for the in-memory
    /// hypervisor, [`FakeHost::with_fake_libvirt`] shares the clock).
    pub fn with_libvirt(libvirt: Box<dyn Libvirt>) -> Self {
        Self {
            libvirt,
            ..Self::new()
        }
    }

    /// The call ends `ms` after the current (fake) time.
    pub fn set_call_budget_ms(&self, ms: u64) {
        self.call_deadline_ms.set(Some(self.clock_ms.get() + ms));
    }

    pub fn set_http(&self, handler: HttpHandler) {
        *self.http.borrow_mut() = Some(handler);
    }

    pub fn logs(&self) -> Vec<LogLine> {
        self.logs.borrow().clone()
    }

    /// Every captured log line and field as one string, for "never logged" assertions.
    pub fn log_text(&self) -> String {
        self.logs
            .borrow()
            .iter()
            .map(|l| {
                let fields: Vec<String> =
                    l.fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{:?} {} {}", l.level, l.message, fields.join(" "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Log for FakeHost {
    fn log(&self, level: Level, message: &str, fields: &[(&str, &str)]) {
        self.logs.borrow_mut().push(LogLine {
            level,
            message: message.to_string(),
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        });
    }
}

impl Clock for FakeHost {
    fn now_millis(&self) -> u64 {
        self.clock_ms.get()
    }
    fn sleep_millis(&self, ms: u64) {
        self.clock_ms.advance(ms);
    }
    fn random_u64(&self) -> u64 {
        // splitmix64: deterministic, so test output is stable.
        let mut z = self.rng.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        self.rng.set(z);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn call_deadline_millis(&self) -> u64 {
        self.call_deadline_ms
            .get()
            .unwrap_or(self.clock_ms.get() + 600_000)
    }
}

impl Host for FakeHost {
    fn kube(&self) -> &dyn Kube {
        self.kube.now.set(self.clock_ms.get() / 1000);
        &self.kube
    }
    fn http(&self) -> &dyn Http {
        self
    }
    fn libvirt(&self) -> &dyn Libvirt {
        self.libvirt.as_ref()
    }
    fn locks(&self) -> &dyn Locks {
        &self.locks
    }
    fn proxy_htpasswd(&self) -> Option<String> {
        self.htpasswd.borrow().clone()
    }
}

impl Http for FakeHost {
    fn send(&self, req: &HttpRequest) -> Result<HttpResponse, HttpError> {
        match self.http.borrow().as_ref() {
            Some(h) => h(req),
            None => Err(HttpError::Denied(format!("no http grant for {}", req.url))),
        }
    }
}

pub fn kube_error(status: u16, reason: &str, message: &str) -> KubeError {
    KubeError {
        status,
        reason: reason.to_string(),
        message: message.to_string(),
    }
}

impl FakeKube {
    /// The next call named `op` (`get`, `create`, `delete`, `list`, `patch`, `server-version`)
    /// fails with `err`; `op` may name the kind too (`create Secret`) to fail only that.
    pub fn fail_next(&self, op: &str, err: KubeError) {
        self.faults.borrow_mut().push_back((op.to_string(), err));
    }

    /// The calls made, as `op kind ns/name`.
    pub fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }

    /// Inserts an object as is (a test fixture), filling uid and creationTimestamp if absent.
    pub fn insert(&self, api_version: &str, kind: &str, mut obj: Value) {
        obj["apiVersion"] = json!(api_version);
        obj["kind"] = json!(kind);
        let mut c = self.cluster.borrow_mut();
        c.set_now(self.now.get() * 1000);
        // A fixture without a name is no object; the test then finds nothing.
        let _ = c.insert(obj);
    }

    pub fn object(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let ns = Some(ns).filter(|n| !n.is_empty());
        self.cluster
            .borrow()
            .peek(&Key::new(api_version, kind, ns, name))
            .map(|v| (*v).clone())
    }

    /// Writes a merge patch to the object's status subresource, as a kubelet does: a patch
    /// through the capability (the main resource) leaves status alone.
    pub fn patch_status(
        &self,
        target: &ObjectRef,
        merge_patch: &Value,
    ) -> Result<Value, KubeError> {
        self.model(|c| {
            c.patch(
                &Self::key(target),
                &Patch::Merge(merge_patch.clone()),
                Subresource::Status,
            )
        })
        .map(|v| (*v).clone())
    }

    pub fn len(&self) -> usize {
        self.cluster.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.cluster.borrow().is_empty()
    }

    fn fault(&self, op: &str, kind: &str) -> Result<(), KubeError> {
        let mut faults = self.faults.borrow_mut();
        let of_kind = format!("{op} {kind}");
        if let Some((_, e)) = faults
            .iter()
            .position(|(o, _)| o == op || *o == of_kind)
            .and_then(|pos| faults.remove(pos))
        {
            return Err(e);
        }
        Ok(())
    }

    fn record(&self, op: &str, kind: &str, ns: Option<&str>, name: &str) {
        self.calls
            .borrow_mut()
            .push(format!("{op} {kind} {}/{name}", ns.unwrap_or("")));
    }

    fn key(r: &ObjectRef) -> Key {
        Key::new(&r.api_version, &r.kind, r.namespace.as_deref(), &r.name)
    }

    /// Runs `f` on the model at the host's time.
    fn model<T>(
        &self,
        f: impl FnOnce(&mut Cluster) -> Result<T, ApiError>,
    ) -> Result<T, KubeError> {
        let mut c = self.cluster.borrow_mut();
        c.set_now(self.now.get() * 1000);
        f(&mut c).map_err(|e| kube_error(e.code, &e.reason, &e.message))
    }
}

fn parse(text: &str, what: &str) -> Result<Value, KubeError> {
    serde_json::from_str(text)
        .map_err(|e| kube_error(400, "BadRequest", &format!("{what} is not JSON: {e}")))
}

impl Kube for FakeKube {
    fn get(&self, target: &ObjectRef) -> Result<String, KubeError> {
        self.record(
            "get",
            &target.kind,
            target.namespace.as_deref(),
            &target.name,
        );
        self.fault("get", &target.kind)?;
        self.model(|c| c.get(&Self::key(target)))
            .map(|v| v.to_string())
    }

    fn create(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        body: &str,
    ) -> Result<String, KubeError> {
        let obj = parse(body, "object")?;
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        self.record("create", kind, namespace, &name);
        self.fault("create", kind)?;
        self.model(|c| c.create(api_version, kind, namespace, obj))
            .map(|v| v.to_string())
    }

    fn delete(&self, target: &ObjectRef) -> Result<(), KubeError> {
        self.record(
            "delete",
            &target.kind,
            target.namespace.as_deref(),
            &target.name,
        );
        self.fault("delete", &target.kind)?;
        self.model(|c| c.delete(&Self::key(target), &DeleteOptions::default()))
            .map(|_| ())
    }

    fn list(&self, options: &ListOptions) -> Result<Vec<String>, KubeError> {
        self.list_page(options, None).map(|(items, _)| items)
    }

    fn list_page(
        &self,
        options: &ListOptions,
        continue_token: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), KubeError> {
        self.record("list", &options.kind, options.namespace.as_deref(), "");
        self.fault("list", &options.kind)?;
        self.model(|c| {
            let mut sel = Selection::of(
                &options.api_version,
                &options.kind,
                options.namespace.as_deref(),
            );
            sel.labels =
                LabelSelector::parse(&options.label_selector).map_err(ApiError::bad_request)?;
            let page = c.list(&sel, options.limit.map(|l| l as usize), continue_token)?;
            Ok((
                page.items.iter().map(|v| v.to_string()).collect(),
                page.continue_token,
            ))
        })
    }

    fn patch(&self, target: &ObjectRef, merge_patch: &str) -> Result<String, KubeError> {
        self.record(
            "patch",
            &target.kind,
            target.namespace.as_deref(),
            &target.name,
        );
        self.fault("patch", &target.kind)?;
        let patch = parse(merge_patch, "patch")?;
        self.model(|c| c.patch(&Self::key(target), &Patch::Merge(patch), Subresource::Main))
            .map(|v| v.to_string())
    }

    fn server_version(&self) -> Result<(String, String), KubeError> {
        self.record("server-version", "", None, "");
        self.fault("server-version", "")?;
        Ok(("v1.33.0".to_string(), "https://fake-apiserver".to_string()))
    }
}

/// RFC 7386 JSON merge patch (the cluster model's).
pub use egress_sim::kube::merge_patch as merge;

/// Whether `labels` match a label selector in its text form; an invalid selector matches
/// nothing.
pub fn selector_matches(selector: &str, labels: &Value) -> bool {
    LabelSelector::parse(selector).is_ok_and(|s| s.matches(labels))
}

/// Libvirt without a grant: every call is denied.
pub struct DeniedLibvirt;

fn denied() -> LibvirtError {
    LibvirtError {
        code: 0,
        domain: 0,
        message: "no libvirt grant".to_string(),
        stage: None,
        timeout: false,
        denied: true,
    }
}

impl Libvirt for DeniedLibvirt {
    fn lib_version(&self, _: &str) -> Result<u64, LibvirtError> {
        Err(denied())
    }
    fn hostname(&self, _: &str) -> Result<String, LibvirtError> {
        Err(denied())
    }
    fn node_info(&self, _: &str) -> Result<NodeInfo, LibvirtError> {
        Err(denied())
    }
    fn node_free_memory(&self, _: &str) -> Result<u64, LibvirtError> {
        Err(denied())
    }
    fn list_domains(&self, _: &str) -> Result<Vec<String>, LibvirtError> {
        Err(denied())
    }
    fn domain_lookup(&self, _: &str, _: &str) -> Result<String, LibvirtError> {
        Err(denied())
    }
    fn domain_define_xml(&self, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn domain_create(&self, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn domain_resume(&self, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn domain_destroy(&self, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn domain_undefine(&self, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn domain_get_state(&self, _: &str, _: &str) -> Result<DomainState, LibvirtError> {
        Err(denied())
    }
    fn domain_get_metadata(&self, _: &str, _: &str, _: &str) -> Result<String, LibvirtError> {
        Err(denied())
    }
    fn domain_interface_addresses(
        &self,
        _: &str,
        _: &str,
        _: AddressSource,
    ) -> Result<Vec<InterfaceAddresses>, LibvirtError> {
        Err(denied())
    }
    fn pool_info(&self, _: &str, _: &str) -> Result<PoolInfo, LibvirtError> {
        Err(denied())
    }
    fn pool_refresh(&self, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn pool_list_volumes(&self, _: &str, _: &str) -> Result<Vec<String>, LibvirtError> {
        Err(denied())
    }
    fn volume_lookup(&self, _: &str, _: &str, _: &str) -> Result<String, LibvirtError> {
        Err(denied())
    }
    fn volume_create_xml(&self, _: &str, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn volume_delete(&self, _: &str, _: &str, _: &str) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn volume_info(&self, _: &str, _: &str, _: &str) -> Result<VolumeInfo, LibvirtError> {
        Err(denied())
    }
    fn volume_xml(&self, _: &str, _: &str, _: &str) -> Result<String, LibvirtError> {
        Err(denied())
    }
    fn volume_upload(&self, _: &str, _: &str, _: &str, _: &[u8]) -> Result<(), LibvirtError> {
        Err(denied())
    }
    fn volume_download(&self, _: &str, _: &str, _: &str, _: u64) -> Result<Vec<u8>, LibvirtError> {
        Err(denied())
    }
    fn volume_upload_from_url(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: u64,
    ) -> Result<Transfer, LibvirtError> {
        Err(denied())
    }
    fn url_size(&self, _: &str) -> Result<Option<u64>, LibvirtError> {
        Err(denied())
    }
    fn probe(&self, targets: &[ProbeTarget]) -> Vec<ProbeResult> {
        targets
            .iter()
            .map(|t| crate::host::probe_failed(t, denied()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn selectors() {
        let labels = json!({"a": "1", "b": "2"});
        assert!(selector_matches("a=1", &labels));
        assert!(selector_matches("a==1,b=2", &labels));
        assert!(!selector_matches("a=2", &labels));
        assert!(selector_matches("a!=2", &labels));
        assert!(selector_matches("b", &labels));
        assert!(!selector_matches("c", &labels));
        assert!(selector_matches("", &labels));
        assert!(selector_matches("a in (1,3),!c", &labels));
        assert!(!selector_matches("a in", &labels));
    }

    #[test]
    fn fake_kube_round_trip() {
        let h = FakeHost::new();
        let k = h.kube();
        let body = json!({"metadata": {"name": "x", "labels": {"a": "1"}}}).to_string();
        let created: Value =
            serde_json::from_str(&k.create("v1", "Pod", Some("ns"), &body).unwrap()).unwrap();
        assert_eq!(
            created["metadata"]["creationTimestamp"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(created["metadata"]["namespace"], "ns");
        let again = k.create("v1", "Pod", Some("ns"), &body).unwrap_err();
        assert_eq!(again.status, 409);
        let r = ObjectRef {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: Some("ns".into()),
            name: "x".into(),
        };
        assert!(k.get(&r).is_ok());
        let list = k
            .list(&ListOptions {
                api_version: "v1".into(),
                kind: "Pod".into(),
                namespace: None,
                label_selector: "a=1".into(),
                limit: None,
            })
            .unwrap();
        assert_eq!(list.len(), 1);
        h.kube
            .fail_next("get", kube_error(500, "InternalError", "boom"));
        assert_eq!(k.get(&r).unwrap_err().status, 500);
        k.delete(&r).unwrap();
        assert_eq!(k.get(&r).unwrap_err().status, 404);
        assert_eq!(k.delete(&r).unwrap_err().status, 404);
    }
}
