//! One instance's life, recorded against the real backends or replayed from a tape: create a
//! Proxy's instance, get it until it is ready, delete it, and list to see it gone. Recording
//! writes every capability call and its answer to the tape; replaying answers them from it,
//! offline, and fails on any call the tape lacks. Both print the plan, which a replay of an
//! unchanged module and block repeats byte for byte.
//!
//! The instance's UID (and so its name) is drawn from the clock capability, so it is on the
//! tape; its credential is fresh from the operating system in every run and on no tape: what a
//! tape or a plan shows of a call carrying it is redacted, digests included.

use crate::cases::module_grants;
use crate::suite::{BlockFile, ModuleSource, SuiteError};
use egress_core::config::{ConfigError, ProviderEntry, ProvidersConfig};
use egress_core::{CreateRequest, ErrorClass, InstanceState, OwnerReference};
use egress_runtime::capabilities::credentials;
use egress_runtime::capabilities::tape::{Replay, Tape, TapeError};
use egress_runtime::redact::Redactor;
use egress_runtime::{Backends, LoadOptions, PlanRecorder, PlanStep, Provider, Providers, Runtime};
use egress_runtime::{RuntimeOptions, capabilities::clock::ClockBackend};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const INSTALLATION: &str = "conformance";
const PROVIDER_NAME: &str = "conformance";
/// Attempts a create or delete gets, a transient failure backed off between them.
const ATTEMPTS: usize = 6;
const BACKOFF: Duration = Duration::from_secs(10);
/// Between two gets while waiting for the instance to be ready.
const POLL: Duration = Duration::from_secs(2);

/// Against what the lifecycle runs.
#[derive(Debug, Clone)]
pub enum TapeMode {
    /// The real backends, every call written to this file.
    Record(PathBuf),
    /// The calls of this file, and nothing else.
    Replay(PathBuf),
}

/// One run of the lifecycle.
pub struct Lifecycle {
    pub module: ModuleSource,
    /// The type to configure; default: the type the module describes.
    pub type_name: Option<String>,
    pub block: BlockFile,
    pub runtime: RuntimeOptions,
    /// How long the instance may take to be ready (on the run's clock: the tape's in a replay).
    pub ready_timeout: Duration,
    pub mode: TapeMode,
}

/// What a run did.
#[derive(Debug)]
pub struct LifecycleReport {
    /// Every mutating call, as plan steps serialise.
    pub plan: Vec<PlanStep>,
    /// What happened, one line a step.
    pub log: Vec<String>,
    /// Why the run failed; None when it passed.
    pub failure: Option<String>,
}

impl LifecycleReport {
    /// The plan as JSON (what `provider test --record` and `--replay` print).
    pub fn plan_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.plan).unwrap_or_default();
        text.push('\n');
        text
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Suite(#[from] SuiteError),
    #[error(transparent)]
    Tape(#[from] TapeError),
    #[error("the provider entry: {0}")]
    Load(ConfigError),
}

/// The backends of the run and, for a replay, the tape that answers them.
enum Side {
    Record(Arc<Tape>, PathBuf),
    Replay(Arc<Replay>),
}

impl Side {
    fn add_secrets(&self, r: &Redactor) {
        match self {
            Side::Record(t, _) => t.add_secrets(r),
            Side::Replay(r2) => r2.add_secrets(r),
        }
    }

    /// The first call the tape lacked, in a replay.
    fn missed(&self) -> Option<String> {
        match self {
            Side::Record(..) => None,
            Side::Replay(r) => r.misses().into_iter().next(),
        }
    }
}

impl Lifecycle {
    pub async fn run(self) -> Result<LifecycleReport, LifecycleError> {
        // A tape that cannot be read fails before anything is compiled or dialled.
        let (side, backends) = match &self.mode {
            TapeMode::Record(path) => {
                // Written empty first: a tape that cannot be written fails before anything is
                // made on a real backend.
                egress_runtime::capabilities::tape::write(path, &[])?;
                let tape = Arc::new(Tape::new());
                let backends = Backends::recording(&Backends::real(), tape.clone());
                (Side::Record(tape, path.clone()), backends)
            }
            TapeMode::Replay(path) => {
                let replay = Arc::new(Replay::open(path)?);
                let backends = Backends::replaying(replay.clone());
                (Side::Replay(replay), backends)
            }
        };
        let (bytes, file) = match &self.module {
            ModuleSource::Embedded(b) => (b.to_vec(), None),
            ModuleSource::File(p) => {
                let bytes = std::fs::read(p).map_err(|e| SuiteError::Module {
                    path: p.display().to_string(),
                    message: e.to_string(),
                })?;
                (
                    bytes,
                    Some(std::path::absolute(p).unwrap_or_else(|_| p.clone())),
                )
            }
        };
        let runtime =
            Runtime::new(self.runtime.clone()).map_err(|e| SuiteError::Runtime(e.to_string()))?;
        let module = runtime
            .load_module(&bytes)
            .await
            .map_err(|message| SuiteError::Module {
                path: file
                    .as_ref()
                    .map_or_else(|| "embedded module".into(), |p| p.display().to_string()),
                message,
            })?;
        let desc = module.description.clone();
        let type_name = self.type_name.clone().unwrap_or(desc.type_name.clone());
        let grants = module_grants(
            self.block.settings.grants.as_ref(),
            file.is_some(),
            &self.block.block,
            &desc,
        );
        let mut entry = ProviderEntry {
            name: PROVIDER_NAME.into(),
            type_: type_name,
            module: file.as_ref().map(|p| p.display().to_string()),
            grants,
            ..Default::default()
        };
        let block = Some(self.block.block.clone());
        match entry.block().0 {
            "kubernetes" => entry.kubernetes = block,
            "gcp" => entry.gcp = block,
            "kvm" => entry.kvm = block,
            "kvm2" => entry.kvm2 = block,
            _ => entry.config = block,
        }
        let cfg = ProvidersConfig {
            installation: Some(INSTALLATION.into()),
            egress_check: None,
            providers: vec![entry],
            module_verification: None,
        };

        let recorder = Arc::new(PlanRecorder::new());
        let embedded = match &self.module {
            ModuleSource::Embedded(b) => Some(*b),
            ModuleSource::File(_) => None,
        };
        let lookup = move |_: &str| embedded;
        let loaded = Providers::load(
            &runtime,
            &cfg,
            LoadOptions {
                base_dir: Path::new("/"),
                builtin: &lookup,
                backends: backends.clone(),
                recorder: Some(recorder.clone()),
            },
        )
        .await;
        let mut run = Run {
            side,
            clock: backends.clock.clone(),
            log: Vec::new(),
            namespace: self
                .block
                .settings
                .namespace
                .clone()
                .unwrap_or_else(|| "conformance".into()),
            ready_timeout: self.ready_timeout,
        };
        let failure = match loaded.map(|p| p.get(PROVIDER_NAME).cloned()) {
            Err(e) => Some(run.missed().unwrap_or_else(|| format!("load: {e}"))),
            Ok(None) => Some("load: the provider entry was not loaded".into()),
            Ok(Some(p)) => run.life(&p, &self.block).await.err(),
        };
        if let Side::Record(tape, path) = &run.side {
            tape.write(path)?;
            run.log.push(format!(
                "wrote {} calls to the tape {}",
                tape.entries().len(),
                path.display()
            ));
        }
        if let Side::Replay(r) = &run.side
            && failure.is_none()
        {
            let left = r.unused();
            if left > 0 {
                run.log
                    .push(format!("{left} calls of the tape were not made again"));
            }
        }
        Ok(LifecycleReport {
            plan: recorder.snapshot(),
            log: run.log,
            failure,
        })
    }
}

struct Run {
    side: Side,
    clock: Arc<dyn ClockBackend>,
    log: Vec<String>,
    namespace: String,
    ready_timeout: Duration,
}

impl Run {
    fn missed(&self) -> Option<String> {
        self.side.missed()
    }

    /// Fails at the first call the tape lacked.
    fn check_tape(&self) -> Result<(), String> {
        match self.missed() {
            Some(m) => Err(m),
            None => Ok(()),
        }
    }

    async fn sleep(&self, d: Duration) {
        self.clock.sleep_millis(d.as_millis() as u64).await;
    }

    async fn life(&mut self, p: &Provider, block: &BlockFile) -> Result<(), String> {
        // The UID from the clock's randomness, so a replay makes the same names.
        let (a, b) = (self.clock.random_u64(), self.clock.random_u64());
        let uid = format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            b >> 52,
            b & 0xffff_ffff_ffff
        );
        let name = egress_core::name::instance_name(&uid);
        let credential = credentials::fresh(&name)
            .ok_or("the operating system has no randomness for a credential")?;
        let htpasswd = credentials::htpasswd(&credential)
            .ok_or("the operating system has no randomness for a salt")?;
        self.side.add_secrets(
            &Redactor::for_create(None, Some(&htpasswd))
                .merged(&Redactor::new([credential.password.clone()])),
        );
        let req = CreateRequest {
            name: name.clone(),
            namespace: self.namespace.clone(),
            uid: uid.clone(),
            port: 3128,
            placement: block.settings.placement.clone(),
            cloud_init: None,
            installation: INSTALLATION.into(),
            owner: Some(OwnerReference {
                api_version: "crawl.example.com/v1alpha1".into(),
                kind: "Proxy".into(),
                name: name.clone(),
                uid: uid.clone(),
            }),
            htpasswd: Some(htpasswd),
        };
        let subject = format!("{}/{}", req.namespace, req.name);

        let created = self.create(p, &subject, &req).await?;
        self.log.push(format!(
            "created {} ({:?})",
            created.provider_id, created.state
        ));
        let ready = self.until_ready(p, &subject, &created.provider_id).await;
        // Deleted whether or not it became ready: the run leaves nothing behind.
        let deleted = self.delete(p, &subject, &created.provider_id).await;
        ready?;
        deleted?;
        let gone = p.get(&subject, &created.provider_id).await;
        self.check_tape()?;
        match gone {
            Err(e) if e.class == ErrorClass::NotFound => {
                self.log
                    .push(format!("get after delete: NotFound ({})", e.reason));
            }
            Err(e) => return Err(format!("get after delete: want NotFound, got {e}")),
            Ok(i) => {
                return Err(format!(
                    "get after delete: want NotFound, got an instance in state {:?}",
                    i.state
                ));
            }
        }
        let listed = p.list_by_tag("gc", INSTALLATION).await;
        self.check_tape()?;
        match listed {
            Ok(list) if list.iter().any(|i| i.provider_id == created.provider_id) => Err(format!(
                "list-by-tag still lists {} after its delete",
                created.provider_id
            )),
            Ok(list) => {
                self.log.push(format!(
                    "list-by-tag: {} instances of installation {INSTALLATION:?}, not {}",
                    list.len(),
                    created.provider_id
                ));
                Ok(())
            }
            Err(e) => Err(format!("list-by-tag failed: {e}")),
        }
    }

    async fn create(
        &mut self,
        p: &Provider,
        subject: &str,
        req: &CreateRequest,
    ) -> Result<egress_core::Instance, String> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let out = p.create(subject, req).await;
            self.check_tape()?;
            match out {
                Ok(i) => return Ok(i),
                Err(e) if matches!(e.class, ErrorClass::Transient | ErrorClass::QuotaExceeded) => {
                    self.log.push(format!("create: {e}; again in {BACKOFF:?}"));
                    last = e.to_string();
                    self.sleep(BACKOFF).await;
                }
                Err(e) => return Err(format!("create failed: {e}")),
            }
        }
        Err(format!(
            "create still failing after {ATTEMPTS} attempts: {last}"
        ))
    }

    /// Gets until the instance runs with an address, within the ready timeout.
    async fn until_ready(&mut self, p: &Provider, subject: &str, id: &str) -> Result<(), String> {
        let deadline = self
            .clock
            .now_millis()
            .saturating_add(self.ready_timeout.as_millis() as u64);
        loop {
            let got = p.get(subject, id).await;
            self.check_tape()?;
            match got {
                Ok(i) if i.state == InstanceState::Running && i.ip.is_some() => {
                    let ip = i.ip.unwrap_or_default();
                    self.log.push(format!("ready: {} at {ip}", i.provider_id));
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) if e.class == ErrorClass::Transient => {}
                Err(e) => return Err(format!("get of {id} failed: {e}")),
            }
            if self.clock.now_millis() >= deadline {
                return Err(format!(
                    "{id} was not running with an address within {:?}",
                    self.ready_timeout
                ));
            }
            self.sleep(POLL).await;
        }
    }

    async fn delete(&mut self, p: &Provider, subject: &str, id: &str) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let out = p.delete(subject, id).await;
            self.check_tape()?;
            match out {
                Ok(()) => {
                    self.log.push(format!("deleted {id}"));
                    return Ok(());
                }
                Err(e) if matches!(e.class, ErrorClass::Transient | ErrorClass::QuotaExceeded) => {
                    self.log.push(format!("delete: {e}; again in {BACKOFF:?}"));
                    last = e.to_string();
                    self.sleep(BACKOFF).await;
                }
                Err(e) => return Err(format!("delete failed: {e}")),
            }
        }
        Err(format!(
            "delete still failing after {ATTEMPTS} attempts: {last}"
        ))
    }
}
