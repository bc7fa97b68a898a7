//! The cases, in order. Each creates its own instances (distinct names and UIDs), so one
//! failure does not cascade, and cleans up after itself. The cloud-init case runs last: it
//! searches everything the others logged, traced and planned.

use crate::capture::Captured;
use crate::faults::FaultKind;
use crate::sim::{self, Caps, HttpSim, SimSetup};
use crate::{CaseResult, ModuleSource, Outcome, Report, Suite, SuiteError};
use egress_core::config::{
    ConfigError, Grants, HttpGrant, KubeGrant, LibvirtGrant, Limits, ProviderEntry, ProvidersConfig,
};
use egress_core::{CreateRequest, ErrorClass, Instance, InstanceState, OwnerReference};
use egress_runtime::bindings::Capability;
use egress_runtime::capabilities::http::url_host;
use egress_runtime::{LoadOptions, PlanRecorder, Provider, Providers, Runtime};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::instrument::WithSubscriber;
use tracing_subscriber::layer::SubscriberExt;

const INSTALLATION: &str = "conformance";
const OTHER_INSTALLATION: &str = "conformance-other";
const PROVIDER_NAME: &str = "conformance";
const UNKNOWN_FIELD: &str = "conformanceUnknownField";
/// The name that replaces an instance's name in its provider-id to make an unknown id.
const ABSENT_NAME: &str = "proxy-cf9999999999";
/// A reconciler's backoff between attempts, in simulated time.
const BACKOFF: Duration = Duration::from_secs(30);
/// Long enough for every simulated backend to finish a start or a deletion.
const SETTLE: Duration = Duration::from_secs(600);
/// Attempts a later create or delete gets to converge, as a reconciler would retry.
const ATTEMPTS: usize = 6;

pub(crate) async fn run(suite: Suite) -> Result<Report, SuiteError> {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    run_captured(suite, captured)
        .with_subscriber(subscriber)
        .await
}

struct Run {
    runtime: Runtime,
    module: ModuleSource,
    file: Option<PathBuf>,
    type_name: String,
    block: Value,
    block_path: String,
    settings: crate::Settings,
    grants: Option<Grants>,
    caps: Caps,
    setup: SimSetup,
    recorder: Arc<PlanRecorder>,
    create_timeout: Duration,
    sentinel: String,
    /// Mutating backend calls one clean create makes.
    create_calls: Option<u64>,
    results: Vec<CaseResult>,
}

fn pass(name: &str, message: impl Into<String>) -> CaseResult {
    CaseResult {
        name: name.into(),
        outcome: Outcome::Pass,
        message: message.into(),
    }
}
fn fail(name: &str, message: impl Into<String>) -> CaseResult {
    CaseResult {
        name: name.into(),
        outcome: Outcome::Fail,
        message: message.into(),
    }
}
fn skip(name: &str, message: impl Into<String>) -> CaseResult {
    CaseResult {
        name: name.into(),
        outcome: Outcome::Skip,
        message: message.into(),
    }
}

/// Every case's name, in order.
pub const CASES: &[&str] = &[
    "load",
    "validate-config/unknown-field",
    "validate-config/missing-field",
    "create/returns-gettable-id",
    "create/adopts-repeat",
    "create/refuses-other-uid",
    "get/unknown-is-not-found",
    "delete/idempotent-leaves-nothing",
    "list-by-tag/own-installation-only",
    "list-by-tag/pages",
    "get/stopped-instance",
    "fault/transient-then-retry",
    "fault/timeout-mid-create",
    "check/one-target-per-backend",
    "secrets/cloud-init-not-leaked",
];

/// Strings in the block that are http(s) URLs, for a module's default http grant.
fn url_hosts(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) if s.starts_with("http://") || s.starts_with("https://") => {
            if let Some((h, p)) = url_host(s) {
                out.push(p.map_or(h.clone(), |p| format!("{h}:{p}")));
            }
        }
        Value::Array(a) => a.iter().for_each(|x| url_hosts(x, out)),
        Value::Object(m) => m.values().for_each(|x| url_hosts(x, out)),
        _ => {}
    }
}

async fn run_captured(suite: Suite, captured: Captured) -> Result<Report, SuiteError> {
    let (bytes, file) = match &suite.module {
        ModuleSource::Embedded(b) => (b.to_vec(), None),
        ModuleSource::File(p) => {
            let bytes = std::fs::read(p).map_err(|e| SuiteError::Module {
                path: p.display().to_string(),
                message: e.to_string(),
            })?;
            let abs = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            (bytes, Some(abs))
        }
    };
    let module_name = file.as_ref().map_or_else(
        || "embedded module".to_string(),
        |p| p.display().to_string(),
    );
    let runtime =
        Runtime::new(suite.runtime.clone()).map_err(|e| SuiteError::Runtime(e.to_string()))?;
    let module = runtime
        .load_module(&bytes)
        .await
        .map_err(|message| SuiteError::Module {
            path: module_name.clone(),
            message,
        })?;
    let desc = module.description.clone();
    let type_name = suite.type_name.clone().unwrap_or(desc.type_name.clone());
    let wants = |c: Capability| desc.capabilities.contains(&c);
    let grants = match (&suite.block.settings.grants, &file) {
        (Some(g), _) => Some(g.clone()),
        (None, None) => None,
        // A module from a file gets no implied grant; the simulation is all it can reach.
        (None, Some(_)) => {
            let mut hosts = Vec::new();
            url_hosts(&suite.block.block, &mut hosts);
            Some(Grants {
                kube: wants(Capability::Kube).then(|| KubeGrant {
                    cluster_scope: true,
                    write_only_kinds: vec!["Secret".into()],
                    ..Default::default()
                }),
                http: wants(Capability::Http).then(|| HttpGrant {
                    hosts: hosts.clone(),
                    credentials: vec![],
                    google_credentials_file: None,
                }),
                libvirt: wants(Capability::Libvirt).then(|| LibvirtGrant {
                    hosts: sim::libvirt_hosts(&suite.block.block),
                    image_hosts: hosts.clone(),
                }),
            })
        }
    };
    let kube_kinds = grants
        .as_ref()
        .and_then(|g| g.kube.as_ref())
        .map(|k| k.kinds.clone())
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| vec!["Pod".to_string()]);
    let caps = Caps {
        kube: wants(Capability::Kube),
        http: wants(Capability::Http),
        libvirt: wants(Capability::Libvirt),
        kube_kinds,
    };
    let http_sim = if desc.type_name == "gcp" || desc.aliases.iter().any(|a| a == "gcp") {
        HttpSim::Gce
    } else {
        HttpSim::ExampleCloud
    };
    let setup = sim::build(suite.world.as_ref(), &suite.block.block, http_sim)
        .map_err(SuiteError::World)?;
    let mut run = Run {
        runtime,
        module: suite.module.clone(),
        file,
        type_name,
        block: suite.block.block.clone(),
        block_path: String::new(),
        settings: suite.block.settings.clone(),
        grants,
        caps,
        setup,
        recorder: Arc::new(PlanRecorder::new()),
        create_timeout: suite.create_timeout,
        sentinel: format!("conformance-secret-{}", &module.digest[..16]),
        create_calls: None,
        results: Vec::new(),
    };
    run.block_path = format!("providers[0].{}", run.entry(Value::Null).block().0);

    match run.load(run.block.clone()).await {
        Ok(p) => {
            run.results.push(pass(
                "load",
                format!(
                    "{} loads as type {:?} with capabilities {:?}",
                    module_name, run.type_name, desc.capabilities
                ),
            ));
            run.cases(&p, &captured).await;
        }
        Err(e) => {
            run.results.push(fail(
                "load",
                format!("the block is rejected or the module does not load: {e}"),
            ));
            for name in &CASES[1..] {
                run.results
                    .push(skip(name, "the module did not load with the block"));
            }
        }
    }
    Ok(Report {
        type_name: run.type_name.clone(),
        digest: module.digest.clone(),
        cases: run.results,
    })
}

impl Run {
    fn entry(&self, block: Value) -> ProviderEntry {
        let mut e = ProviderEntry {
            name: PROVIDER_NAME.into(),
            type_: self.type_name.clone(),
            module: self.file.as_ref().map(|p| p.display().to_string()),
            grants: self.grants.clone(),
            limits: Some(Limits {
                memory_mib: None,
                timeouts: [
                    (
                        "create".to_string(),
                        format!("{}ms", self.create_timeout.as_millis()),
                    ),
                    // A libvirt create must outlast its image transfer budget.
                    (
                        egress_core::config::IMAGE_TRANSFER.to_string(),
                        format!("{}ms", (self.create_timeout.as_millis() / 2).max(1)),
                    ),
                ]
                .into(),
                list_page_size: None,
            }),
            ..Default::default()
        };
        let block = (!block.is_null()).then_some(block);
        match e.block().0 {
            "kubernetes" => e.kubernetes = block,
            "gcp" => e.gcp = block,
            "kvm" => e.kvm = block,
            "kvm2" => e.kvm2 = block,
            _ => e.config = block,
        }
        e
    }

    async fn load(&self, block: Value) -> Result<Arc<Provider>, ConfigError> {
        let cfg = ProvidersConfig {
            installation: Some(INSTALLATION.into()),
            egress_check: None,
            providers: vec![self.entry(block)],
        };
        let embedded = match &self.module {
            ModuleSource::Embedded(b) => Some(*b),
            ModuleSource::File(_) => None,
        };
        let lookup = move |_: &str| embedded;
        let providers = Providers::load(
            &self.runtime,
            &cfg,
            LoadOptions {
                base_dir: Path::new("/"),
                builtin: &lookup,
                backends: self.setup.backends.clone(),
                recorder: Some(self.recorder.clone()),
            },
        )
        .await?;
        providers
            .get(PROVIDER_NAME)
            .cloned()
            .ok_or_else(|| ConfigError::new("providers[0]", "not loaded"))
    }

    fn namespace(&self) -> String {
        self.settings
            .namespace
            .clone()
            .unwrap_or_else(|| "conformance".into())
    }

    /// A create request for instance `n` owned by UID `u`.
    fn request(&self, n: u32, u: u32, installation: &str) -> CreateRequest {
        let name = format!("proxy-cf{n:010}");
        let uid = format!("c0f00000-0000-4000-8000-{u:012}");
        CreateRequest {
            name: name.clone(),
            namespace: self.namespace(),
            uid: uid.clone(),
            port: 3128,
            placement: self.settings.placement.clone(),
            cloud_init: Some(format!(
                "#cloud-config\n# {}\nwrite_files: []\n",
                self.sentinel
            )),
            installation: installation.into(),
            owner: Some(OwnerReference {
                api_version: "crawl.example.com/v1alpha1".into(),
                kind: "Proxy".into(),
                name: format!("conformance-{n}"),
                uid,
            }),
            // Carries the sentinel too: the credential is as secret as the cloud-init.
            htpasswd: Some(format!(
                "conformance-{n}:$6$rounds=5000${}$x\n",
                self.hash_sentinel()
            )),
        }
    }

    fn subject(&self, req: &CreateRequest) -> String {
        format!("{}/{}", req.namespace, req.name)
    }

    fn advance(&self, d: Duration) {
        self.setup.clock.advance(d);
    }

    /// Creates until it succeeds, retrying transient and quota failures with backoff.
    async fn converge(&self, p: &Provider, req: &CreateRequest) -> Result<Instance, String> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            match p.create(&self.subject(req), req).await {
                Ok(i) => return Ok(i),
                Err(e) if matches!(e.class, ErrorClass::Transient | ErrorClass::QuotaExceeded) => {
                    last = e.to_string();
                    self.advance(BACKOFF);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("still failing after {ATTEMPTS} attempts: {last}"))
    }

    /// Deletes, retrying transient failures; the last error if it never succeeds.
    async fn delete(&self, p: &Provider, req: &CreateRequest, id: &str) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            match p.delete(&self.subject(req), id).await {
                Ok(()) => return Ok(()),
                Err(e) if matches!(e.class, ErrorClass::Transient | ErrorClass::QuotaExceeded) => {
                    last = e.to_string();
                    self.advance(BACKOFF);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("still failing after {ATTEMPTS} attempts: {last}"))
    }

    /// After the delete settled: get is NotFound, list-by-tag does not name it, and the
    /// backend holds nothing named after it.
    async fn verify_gone(&self, p: &Provider, req: &CreateRequest, id: &str) -> Result<(), String> {
        self.advance(SETTLE);
        match p.get(&self.subject(req), id).await {
            Err(e) if e.class == ErrorClass::NotFound => {}
            Err(e) => return Err(format!("get after delete: want NotFound, got {e}")),
            Ok(i) => {
                return Err(format!(
                    "get after delete: want NotFound, got an instance in state {:?}",
                    i.state
                ));
            }
        }
        let left = self
            .setup
            .remains(&self.caps, &self.block, &req.namespace, &req.name)
            .await;
        if !left.is_empty() {
            return Err(format!("left behind: {}", left.join(", ")));
        }
        Ok(())
    }

    /// Best-effort cleanup after a case.
    async fn cleanup(&self, p: &Provider, req: &CreateRequest, id: Option<&str>) {
        if let Some(id) = id {
            let _ = self.delete(p, req, id).await;
        }
    }

    async fn cases(&mut self, p: &Provider, captured: &Captured) {
        let r = self.unknown_field().await;
        self.results.push(r);
        let r = self.missing_field().await;
        self.results.push(r);
        let r = self.create_returns_gettable_id(p).await;
        self.results.push(r);
        let r = self.adopts_repeat(p).await;
        self.results.push(r);
        let r = self.refuses_other_uid(p).await;
        self.results.push(r);
        let r = self.unknown_is_not_found(p).await;
        self.results.push(r);
        let r = self.delete_idempotent(p).await;
        self.results.push(r);
        let r = self.own_installation_only(p).await;
        self.results.push(r);
        let r = self.pages(p).await;
        self.results.push(r);
        let r = self.stopped(p).await;
        self.results.push(r);
        let r = self.transient_then_retry(p).await;
        self.results.push(r);
        let r = self.timeout_mid_create(p).await;
        self.results.push(r);
        let r = self.check(p).await;
        self.results.push(r);
        let r = self.cloud_init_not_leaked(captured);
        self.results.push(r);
    }

    async fn unknown_field(&self) -> CaseResult {
        const NAME: &str = "validate-config/unknown-field";
        let mut block = self.block.clone();
        if let Some(m) = block.as_object_mut() {
            m.insert(UNKNOWN_FIELD.into(), Value::from(1));
        }
        match self.load(block).await {
            Ok(_) => fail(
                NAME,
                format!("a block with `{UNKNOWN_FIELD}: 1` was accepted"),
            ),
            Err(e) if !e.path.starts_with(&self.block_path) => fail(
                NAME,
                format!("rejected, but not under {}: {e}", self.block_path),
            ),
            Err(e) if e.path.contains(UNKNOWN_FIELD) || e.message.contains(UNKNOWN_FIELD) => {
                pass(NAME, format!("rejected: {e}"))
            }
            Err(e) => fail(
                NAME,
                format!("rejected without naming {UNKNOWN_FIELD}: {e}"),
            ),
        }
    }

    async fn missing_field(&self) -> CaseResult {
        const NAME: &str = "validate-config/missing-field";
        if !self.settings.required.is_empty() {
            let mut notes = Vec::new();
            for field in &self.settings.required {
                let mut block = self.block.clone();
                if let Some(m) = block.as_object_mut() {
                    m.remove(field);
                }
                let at = format!("{}.{field}", self.block_path);
                match self.load(block).await {
                    Ok(_) => return fail(NAME, format!("a block without {field:?} was accepted")),
                    Err(e) if e.path.starts_with(&at) || e.message.contains(field.as_str()) => {
                        notes.push(e.to_string())
                    }
                    Err(e) => return fail(NAME, format!("without {field:?}: want {at}, got {e}")),
                }
            }
            return pass(NAME, notes.join("; "));
        }
        match self.load(Value::Object(Default::default())).await {
            Ok(_) => skip(
                NAME,
                "an empty block is accepted: every field has a default (list fields that must not be missing in `conformance.required`)",
            ),
            Err(e) if e.path.starts_with(&format!("{}.", self.block_path)) => {
                pass(NAME, format!("an empty block is rejected: {e}"))
            }
            Err(e) => fail(
                NAME,
                format!(
                    "an empty block is rejected without naming a field under {}: {e}",
                    self.block_path
                ),
            ),
        }
    }

    async fn create_returns_gettable_id(&mut self, p: &Provider) -> CaseResult {
        const NAME: &str = "create/returns-gettable-id";
        let req = self.request(1, 1, INSTALLATION);
        let before = self.setup.faults.mutating_calls();
        let created = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("create failed: {e}")),
        };
        self.create_calls = Some(self.setup.faults.mutating_calls() - before);
        let result = async {
            if created.provider_id.is_empty() {
                return Err("create returned an empty provider-id".to_string());
            }
            if created.uid != req.uid {
                return Err(format!(
                    "create returned uid {:?}, want the request's {:?}",
                    created.uid, req.uid
                ));
            }
            let got = p
                .get(&self.subject(&req), &created.provider_id)
                .await
                .map_err(|e| format!("get of {:?} failed: {e}", created.provider_id))?;
            if got.provider_id != created.provider_id || got.uid != req.uid {
                return Err(format!(
                    "get of {:?} answered id {:?} uid {:?}, want uid {:?}",
                    created.provider_id, got.provider_id, got.uid, req.uid
                ));
            }
            if got.installation != INSTALLATION {
                return Err(format!(
                    "get answered installation {:?}, want {INSTALLATION:?}",
                    got.installation
                ));
            }
            Ok(format!(
                "created {:?} ({:?}, {} mutating calls); get agrees",
                created.provider_id,
                created.state,
                self.create_calls.unwrap_or(0)
            ))
        }
        .await;
        self.cleanup(p, &req, Some(&created.provider_id)).await;
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    async fn adopts_repeat(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "create/adopts-repeat";
        let req = self.request(2, 2, INSTALLATION);
        let first = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("first create failed: {e}")),
        };
        self.advance(BACKOFF);
        let second = p.create(&self.subject(&req), &req).await;
        self.cleanup(p, &req, Some(&first.provider_id)).await;
        match second {
            Ok(i) if i.provider_id == first.provider_id && i.uid == req.uid => pass(
                NAME,
                format!("the repeated create adopted {:?}", i.provider_id),
            ),
            Ok(i) => fail(
                NAME,
                format!(
                    "the repeated create answered id {:?} uid {:?}, want {:?} uid {:?}",
                    i.provider_id, i.uid, first.provider_id, req.uid
                ),
            ),
            Err(e) => fail(NAME, format!("the repeated create failed: {e}")),
        }
    }

    async fn refuses_other_uid(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "create/refuses-other-uid";
        let req = self.request(3, 3, INSTALLATION);
        let first = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("first create failed: {e}")),
        };
        self.advance(BACKOFF);
        let mut other = self.request(3, 33, INSTALLATION);
        if let Some(o) = other.owner.as_mut() {
            o.name = "conformance-impostor".into();
        }
        let second = p.create(&self.subject(&other), &other).await;
        self.cleanup(p, &req, Some(&first.provider_id)).await;
        match second {
            Err(e) if e.class == ErrorClass::Permanent => {
                pass(NAME, format!("refused: {} ({})", e.reason, e.message))
            }
            Err(e) => fail(
                NAME,
                format!("refused as {:?}, want Permanent: {e}", e.class),
            ),
            Ok(i) => fail(
                NAME,
                format!(
                    "an instance of uid {:?} was adopted for uid {:?} (answered uid {:?})",
                    req.uid, other.uid, i.uid
                ),
            ),
        }
    }

    async fn unknown_is_not_found(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "get/unknown-is-not-found";
        let req = self.request(4, 4, INSTALLATION);
        // An id of the provider's own shape, for an instance that was never created.
        let id = match p.create(&self.subject(&req), &req).await {
            Ok(i) => {
                self.cleanup(p, &req, Some(&i.provider_id)).await;
                i.provider_id.replace(&req.name, ABSENT_NAME)
            }
            Err(e) => return fail(NAME, format!("create (to learn the id shape) failed: {e}")),
        };
        match p.get("conformance/absent", &id).await {
            Err(e) if e.class == ErrorClass::NotFound => {
                pass(NAME, format!("get {id:?}: NotFound ({})", e.reason))
            }
            Err(e) => fail(NAME, format!("get {id:?}: want NotFound, got {e}")),
            Ok(i) => fail(
                NAME,
                format!("get {id:?}: want NotFound, got an instance {:?}", i.name),
            ),
        }
    }

    async fn delete_idempotent(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "delete/idempotent-leaves-nothing";
        let req = self.request(5, 5, INSTALLATION);
        let created = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("create failed: {e}")),
        };
        self.advance(SETTLE);
        let id = created.provider_id;
        if let Err(e) = p.delete(&self.subject(&req), &id).await {
            return fail(NAME, format!("first delete failed: {e}"));
        }
        if let Err(e) = p.delete(&self.subject(&req), &id).await {
            return fail(NAME, format!("second delete failed: {e}"));
        }
        self.advance(SETTLE);
        if let Err(e) = p.delete(&self.subject(&req), &id).await {
            return fail(NAME, format!("delete of a gone instance failed: {e}"));
        }
        match self.verify_gone(p, &req, &id).await {
            Ok(()) => pass(NAME, format!("deleted {id:?} three times; nothing remains")),
            Err(m) => fail(NAME, m),
        }
    }

    async fn own_installation_only(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "list-by-tag/own-installation-only";
        let ours = self.request(6, 6, INSTALLATION);
        let theirs = self.request(7, 7, OTHER_INSTALLATION);
        let a = p.create(&self.subject(&ours), &ours).await;
        let b = p.create(&self.subject(&theirs), &theirs).await;
        let result = match (&a, &b) {
            (Err(e), _) | (_, Err(e)) => Err(format!("create failed: {e}")),
            (Ok(a), Ok(b)) => match p.list_by_tag("gc", INSTALLATION).await {
                Err(e) => Err(format!("list-by-tag failed: {e}")),
                Ok(list) => {
                    if !list.iter().any(|i| i.provider_id == a.provider_id) {
                        Err(format!(
                            "this installation's {:?} is missing",
                            a.provider_id
                        ))
                    } else if list.iter().any(|i| i.provider_id == b.provider_id) {
                        Err(format!(
                            "another installation's {:?} is listed",
                            b.provider_id
                        ))
                    } else if let Some(i) = list.iter().find(|i| i.installation != INSTALLATION) {
                        Err(format!(
                            "{:?} of installation {:?} is listed",
                            i.provider_id, i.installation
                        ))
                    } else if let Some(i) = list.iter().find(|i| i.uid.is_empty()) {
                        Err(format!("unmarked {:?} is listed", i.provider_id))
                    } else {
                        Ok(format!(
                            "{} listed, all of installation {INSTALLATION:?}; the other installation's is not",
                            list.len()
                        ))
                    }
                }
            },
        };
        if let Ok(i) = &a {
            self.cleanup(p, &ours, Some(&i.provider_id)).await;
        }
        if let Ok(i) = &b {
            self.cleanup(p, &theirs, Some(&i.provider_id)).await;
        }
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    /// A listing in pages of a few items lists each instance once and no page is larger than
    /// asked; a module built before `listing` answers in one page.
    async fn pages(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "list-by-tag/pages";
        const PAGE: u32 = 2;
        let ours: Vec<CreateRequest> = (11..16).map(|n| self.request(n, n, INSTALLATION)).collect();
        let theirs = self.request(16, 16, OTHER_INSTALLATION);
        let mut created: Vec<(CreateRequest, Option<String>)> = Vec::new();
        let mut failed = None;
        for req in ours.iter().chain([&theirs]) {
            match p.create(&self.subject(req), req).await {
                Ok(i) => created.push((req.clone(), Some(i.provider_id))),
                Err(e) => {
                    failed.get_or_insert(format!("create failed: {e}"));
                    created.push((req.clone(), None));
                }
            }
        }
        self.advance(SETTLE);
        let result = match failed {
            Some(m) => Err(m),
            None => {
                let mut sizes = Vec::new();
                let mut listed: Vec<String> = Vec::new();
                match p
                    .list_pages("gc", INSTALLATION, PAGE, |page| {
                        sizes.push(page.len());
                        listed.extend(page.into_iter().map(|i| i.provider_id));
                    })
                    .await
                {
                    Err(e) => Err(format!("listing in pages of {PAGE} failed: {e}")),
                    Ok(pages) => {
                        let ids: Vec<&str> = created
                            .iter()
                            .take(ours.len())
                            .filter_map(|(_, id)| id.as_deref())
                            .collect();
                        let theirs_id = created.last().and_then(|(_, id)| id.as_deref());
                        let twice = listed
                            .iter()
                            .find(|id| listed.iter().filter(|o| o == id).count() > 1);
                        if let Some(missing) =
                            ids.iter().find(|id| !listed.iter().any(|l| l == *id))
                        {
                            Err(format!(
                                "{missing:?} is missing from {pages} pages of {PAGE}"
                            ))
                        } else if let Some(id) = twice {
                            Err(format!("{id:?} is listed twice across {pages} pages"))
                        } else if theirs_id.is_some_and(|t| listed.iter().any(|l| l == t)) {
                            Err("another installation's instance is listed".to_string())
                        } else if !p.module.pages() {
                            Ok(format!(
                                "{} listed in one page: the module predates `listing` and lists through list-by-tag",
                                listed.len()
                            ))
                        } else if let Some(n) = sizes.iter().find(|n| **n > PAGE as usize) {
                            Err(format!("a page of {n} instances, asked for {PAGE}"))
                        } else if pages < 3 {
                            Err(format!(
                                "{} instances in {pages} pages of {PAGE}: the module ignored the limit",
                                listed.len()
                            ))
                        } else {
                            Ok(format!(
                                "{} listed once each in {pages} pages of at most {PAGE}",
                                listed.len()
                            ))
                        }
                    }
                }
            }
        };
        for (req, id) in &created {
            self.cleanup(p, req, id.as_deref()).await;
        }
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    async fn stopped(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "get/stopped-instance";
        if !self.caps.any_backend() {
            return skip(NAME, "the module uses no backend: nothing can stop");
        }
        let req = self.request(8, 8, INSTALLATION);
        let created = match p.create(&self.subject(&req), &req).await {
            Ok(i) => i,
            Err(e) => return fail(NAME, format!("create failed: {e}")),
        };
        self.advance(SETTLE);
        let id = created.provider_id.clone();
        let result = async {
            self.setup
                .stop(&self.caps, &self.block, &req.namespace, &req.name, &id)
                .await
                .map_err(|m| format!("stopping it in the backend: {m}"))?;
            match p.get(&self.subject(&req), &id).await {
                Ok(i) if matches!(i.state, InstanceState::Stopped | InstanceState::Terminated) => {
                    Ok(format!(
                        "reported {:?} after the backend stopped it",
                        i.state
                    ))
                }
                Ok(i) => Err(format!(
                    "reported {:?} after the backend stopped it, want Stopped or Terminated",
                    i.state
                )),
                Err(e) => Err(format!("get failed: {e}")),
            }
        }
        .await;
        self.cleanup(p, &req, Some(&id)).await;
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    async fn transient_then_retry(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "fault/transient-then-retry";
        let Some(n) = self.create_calls.filter(|n| *n > 0) else {
            return skip(NAME, "a create makes no mutating backend call to fail");
        };
        let req = self.request(9, 9, INSTALLATION);
        self.setup.faults.arm(1, FaultKind::Transient);
        let first = p.create(&self.subject(&req), &req).await;
        let fired = self.setup.faults.disarm();
        let verdict = match &first {
            _ if !fired => Err("the create made no mutating call this time".to_string()),
            Err(e) if e.class == ErrorClass::Transient => Ok(e.reason.clone()),
            Err(e) => Err(format!(
                "the failure was {:?}, want Transient: {e}",
                e.class
            )),
            Ok(_) => Err("the create succeeded although its first mutating call failed".into()),
        };
        let reason = match verdict {
            Ok(r) => r,
            Err(m) => {
                if let Ok(i) = &first {
                    self.cleanup(p, &req, Some(&i.provider_id)).await;
                }
                return fail(NAME, m);
            }
        };
        self.advance(BACKOFF);
        let retry = p.create(&self.subject(&req), &req).await;
        let result = match &retry {
            Ok(i) if i.uid == req.uid => Ok(format!(
                "the first of {n} mutating calls failed: Transient ({reason}); the retry created {:?}",
                i.provider_id
            )),
            Ok(i) => Err(format!("the retry answered uid {:?}", i.uid)),
            Err(e) => Err(format!("the retry failed: {e}")),
        };
        match &retry {
            Ok(i) => {
                let id = i.provider_id.clone();
                if let Err(m) = self.delete(p, &req, &id).await {
                    return fail(NAME, format!("delete after the retry failed: {m}"));
                }
                if let Err(m) = self.verify_gone(p, &req, &id).await {
                    return fail(NAME, m);
                }
            }
            Err(_) => self.cleanup(p, &req, None).await,
        }
        match result {
            Ok(m) => pass(NAME, m),
            Err(m) => fail(NAME, m),
        }
    }

    async fn timeout_mid_create(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "fault/timeout-mid-create";
        let Some(n) = self.create_calls.filter(|n| *n > 0) else {
            return skip(NAME, "a create makes no mutating backend call to interrupt");
        };
        let req = self.request(10, 10, INSTALLATION);
        // The middle of the sequence: some of it done, some not. The first create may have
        // filled a cache (an image) that later creates reuse, so a later create can make fewer
        // calls: then the middle of that shorter sequence is tried once more.
        let mut n = n;
        let mut tries = 0;
        let (k, first) = loop {
            tries += 1;
            let k = (n / 2 + 1).min(n);
            let before = self.setup.faults.mutating_calls();
            self.setup.faults.arm(k, FaultKind::Hang);
            let first = p.create(&self.subject(&req), &req).await;
            let fired = self.setup.faults.disarm();
            if fired {
                break (k, first);
            }
            let made = self.setup.faults.mutating_calls() - before;
            if let Ok(i) = &first {
                self.cleanup(p, &req, Some(&i.provider_id)).await;
            }
            if tries > 1 || made == 0 || made >= k {
                return fail(
                    NAME,
                    format!("the create made {made} mutating calls, fewer than {k}, this time"),
                );
            }
            n = made;
        };
        match &first {
            Err(e) if e.reason == "Timeout" => {}
            Err(e) => return fail(NAME, format!("want the runtime's Timeout, got {e}")),
            Ok(_) => return fail(NAME, "the create answered although a backend call hung"),
        }
        let created = match self.converge(p, &req).await {
            Ok(i) => i,
            Err(m) => {
                return fail(
                    NAME,
                    format!("after call {k} of {n} hung, a later create did not converge: {m}"),
                );
            }
        };
        if created.uid != req.uid {
            return fail(
                NAME,
                format!("the later create answered uid {:?}", created.uid),
            );
        }
        let id = created.provider_id;
        if let Err(m) = self.delete(p, &req, &id).await {
            return fail(
                NAME,
                format!("delete after the interrupted create failed: {m}"),
            );
        }
        match self.verify_gone(p, &req, &id).await {
            Ok(()) => pass(
                NAME,
                format!(
                    "call {k} of {n} hung until the runtime cancelled the create; a later create converged and delete left nothing"
                ),
            ),
            Err(m) => fail(NAME, m),
        }
    }

    async fn check(&self, p: &Provider) -> CaseResult {
        const NAME: &str = "check/one-target-per-backend";
        let expected = if self.caps.libvirt {
            sim::libvirt_hosts(&self.block).len()
        } else if self.caps.kube || self.caps.http {
            1
        } else {
            0
        };
        let targets = p.check().await;
        if targets.len() != expected {
            let names: Vec<String> = targets
                .iter()
                .map(|t| format!("{} ({})", t.target, t.reason))
                .collect();
            return fail(
                NAME,
                format!(
                    "{} targets [{}], want {expected}",
                    targets.len(),
                    names.join(", ")
                ),
            );
        }
        if let Some(t) = targets.iter().find(|t| t.reason != "Healthy") {
            return fail(
                NAME,
                format!(
                    "target {:?} is {} against a healthy simulation: {}",
                    t.target, t.reason, t.message
                ),
            );
        }
        pass(NAME, format!("{expected} target(s), all Healthy"))
    }

    /// The sentinel in the characters of a crypt(3) hash, as the htpasswd carries it.
    fn hash_sentinel(&self) -> String {
        self.sentinel.replace('-', "")
    }

    fn cloud_init_not_leaked(&self, captured: &Captured) -> CaseResult {
        const NAME: &str = "secrets/cloud-init-not-leaked";
        let plan = self.recorder.snapshot();
        let plan_text = serde_json::to_string(&plan).unwrap_or_default();
        let hash = self.hash_sentinel();
        let leaked = |text: &str| text.contains(&self.sentinel) || text.contains(&hash);
        let mut leaks = Vec::new();
        if captured.contains(&self.sentinel) || captured.contains(&hash) {
            leaks.push("logs or spans");
        }
        if leaked(&plan_text) {
            leaks.push("the plan");
        }
        if self.results.iter().any(|r| leaked(&r.message)) {
            leaks.push("errors");
        }
        if !leaks.is_empty() {
            return fail(
                NAME,
                format!(
                    "a line of the cloud-init or the htpasswd appeared in {}",
                    leaks.join(", ")
                ),
            );
        }
        if captured.len() == 0 {
            return skip(NAME, "no tracing output was captured to search");
        }
        pass(
            NAME,
            format!(
                "not in {} bytes of logs and spans, {} plan steps or any error",
                captured.len(),
                plan.len()
            ),
        )
    }
}
