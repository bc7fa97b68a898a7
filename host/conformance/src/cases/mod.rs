//! The cases, in order. Each creates its own instances (distinct names and UIDs), so one
//! failure does not cascade, and cleans up after itself. The cloud-init case runs last: it
//! searches everything the others logged, traced and planned.

mod inputs;
mod lifecycle;
mod secrets;
mod weather;

use crate::capture::Captured;
use crate::report::{CaseResult, Outcome, Report};
use crate::sim::{self, Caps, HttpSim, SimSetup};
use crate::suite::{ModuleSource, Suite, SuiteError};
use egress_core::config::{
    ConfigError, Grants, HttpGrant, KubeGrant, LibvirtGrant, Limits, ProviderEntry, ProvidersConfig,
};
use egress_core::{CreateRequest, ErrorClass, Instance, OwnerReference};
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

impl Suite {
    /// Runs every case. Errors only when the suite cannot start (no module, bad world); a
    /// module that does not load is a failed `load` case.
    pub async fn run(self) -> Result<Report, SuiteError> {
        run(self).await
    }
}

async fn run(suite: Suite) -> Result<Report, SuiteError> {
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
    settings: crate::suite::Settings,
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

/// The grants of the suite's provider entry: the block file's, else none for a built-in type
/// (its block implies them), and for a module from a file what it describes needing, reaching
/// the hosts the block names (a module from a file gets no implied grant).
pub(crate) fn module_grants(
    given: Option<&Grants>,
    from_file: bool,
    block: &Value,
    desc: &egress_runtime::bindings::Description,
) -> Option<Grants> {
    if let Some(g) = given {
        return Some(g.clone());
    }
    if !from_file {
        return None;
    }
    let wants = |c: Capability| desc.capabilities.contains(&c);
    let mut hosts = Vec::new();
    url_hosts(block, &mut hosts);
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
            hosts: sim::libvirt_hosts(block),
            image_hosts: hosts.clone(),
        }),
    })
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
    let grants = module_grants(
        suite.block.settings.grants.as_ref(),
        file.is_some(),
        &suite.block.block,
        &desc,
    );
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
            module_verification: None,
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
}
