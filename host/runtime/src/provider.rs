//! Configured providers: each entry's module compiled once and described, its config block
//! validated by the module, its grants resolved, and its calls run on fresh stores.

use crate::bindings::{self as b, ModulePre};
use crate::call::{CallFailure, CallState, Op, OpOut, execute};
use crate::capabilities::Backends;
use crate::engine::{MAX_MEMORY_BYTES, Runtime};
use crate::grants::{EffectiveGrants, effective};
use crate::plan::PlanRecorder;
use crate::redact::Redactor;
use egress_core::config::{ConfigError, ProviderEntry, ProvidersConfig};
use egress_core::{
    CreateRequest, ErrorClass, Instance, InstanceState, Placement, ProviderError, TargetStatus,
};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// The wall-time bound of `describe`, which every module answers from constants.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A compiled module with its InstancePre and its self-description.
pub struct LoadedModule {
    /// Hex sha256 of the module bytes.
    pub digest: String,
    pub(crate) pre: ModulePre<CallState>,
    pub description: b::Description,
}

pub type LoadError = ConfigError;

impl LoadedModule {
    /// Whether the module lists page by page (exports `listing`, contract 0.1.2 and later);
    /// an older module answers its whole listing in one call.
    pub fn pages(&self) -> bool {
        self.pre.pages()
    }

    /// The interfaces the module imports: a module names the capabilities it calls
    /// (`export_provider!`'s `uses`), and each it leaves out is linked and set up at none of
    /// its calls.
    pub fn imports(&self) -> Vec<String> {
        self.pre.import_names()
    }
}

/// One page of a provider's listing and the cursor that continues it; none on the last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    pub instances: Vec<Instance>,
    pub next: Option<String>,
}

/// A listing stops after this many pages: a module whose cursors never end must not keep a
/// sweep going forever (100,000 pages of the default 500 is 50 million instances).
const MAX_LIST_PAGES: u32 = 100_000;

/// A page whose call failed transiently is asked again this many times before the listing is
/// given up: a listing of many pages over a backend that fails one call in ten would
/// otherwise almost never reach its end, and a sweep that does not reach it collects nothing
/// past the failing page.
pub const PAGE_RETRIES: u32 = 3;

/// The wait before a page is asked again the first time; doubled for each retry after it
/// (0.5, 1 and 2 s): long enough for an API server's leader change or a reconnect, short
/// beside a sweep's interval.
pub const PAGE_RETRY_BASE: Duration = Duration::from_millis(500);

/// The reasons the host gives a call that produced no answer. A page is not asked again after
/// one: a trap or a memory limit would come again, and a timeout has waited its bound already.
const CALL_FAILURES: [&str; 5] = [
    "Timeout",
    "MemoryLimit",
    "Trap",
    "Instantiate",
    "ShuttingDown",
];

/// Whether a page's failure is one asking again may cure: a transient error the module
/// reported from its backend.
fn page_retryable(e: &ProviderError) -> bool {
    e.class == ErrorClass::Transient && !CALL_FAILURES.contains(&e.reason.as_str())
}

/// How to resolve modules and which backends the providers run against.
pub struct LoadOptions<'a> {
    /// Relative `module:` paths are resolved against this directory (the providers file's).
    pub base_dir: &'a Path,
    /// The embedded module for a built-in type.
    pub builtin: &'a (dyn Fn(&str) -> Option<&'static [u8]> + Sync),
    pub backends: Backends,
    pub recorder: Option<Arc<PlanRecorder>>,
}

/// One configured provider, ready to call.
#[derive(Clone)]
pub struct Provider {
    pub name: String,
    pub type_name: String,
    /// The revision of its entry: a change releases Proxies held on a permanent failure.
    pub revision: String,
    pub module: Arc<LoadedModule>,
    pub grants: Arc<EffectiveGrants>,
    /// The normalized config block (JSON), as the module's validate-config returned it.
    pub config: String,
    /// The create bound, which for a libvirt entry covers a first image transfer.
    create_timeout: Duration,
    entry: ProviderEntry,
    runtime: Runtime,
    backends: Backends,
    /// The hypervisors of a libvirt entry, as its block configures them; empty otherwise.
    libvirt_hosts: Vec<crate::capabilities::libvirt::LibvirtHost>,
    recorder: Option<Arc<PlanRecorder>>,
}

/// A provider entry whose new version was refused; its previous version (if any) serves on.
#[derive(Debug, Clone)]
pub struct Rejection {
    pub provider: String,
    pub error: LoadError,
}

/// The configured providers by name.
pub struct Providers {
    pub by_name: BTreeMap<String, Arc<Provider>>,
}

impl Runtime {
    /// Compiles a module (or takes it from the disk cache), prepares its instantiation and
    /// asks it to describe itself. Identical bytes are compiled once per process.
    pub async fn load_module(&self, bytes: &[u8]) -> Result<Arc<LoadedModule>, String> {
        let digest = hex::encode(Sha256::digest(bytes));
        if let Some(m) = self.modules().get(&digest) {
            return Ok(m.clone());
        }
        let engine = self.inner.engine.clone();
        let owned = bytes.to_vec();
        let component = tokio::task::spawn_blocking(move || {
            wasmtime::component::Component::new(&engine, owned)
        })
        .await
        .map_err(|e| format!("compile task failed: {e}"))?
        .map_err(|e| format!("not a valid provider component: {e:#}"))?;
        let pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| format!("imports something the host does not provide: {e:#}"))?;
        let pre = ModulePre::new(pre)
            .map_err(|e| format!("does not export the provider interface: {e:#}"))?;
        let description = self.describe_pre(&pre).await?;
        let module = Arc::new(LoadedModule {
            digest: digest.clone(),
            pre,
            description,
        });
        self.modules().insert(digest, module.clone());
        Ok(module)
    }

    /// Runs `describe` on a fresh instance of `module`: the cheapest complete call, used to
    /// measure the per-call overhead of a fresh store.
    pub async fn describe(&self, module: &LoadedModule) -> Result<b::Description, String> {
        self.describe_pre(&module.pre).await
    }

    async fn describe_pre(&self, pre: &ModulePre<CallState>) -> Result<b::Description, String> {
        let state = CallState::new(
            "describe",
            Arc::new(EffectiveGrants::default()),
            self.inner.inert.clone(),
            None,
            "",
            Redactor::default(),
            64 << 20,
        );
        let state = state.bounded(
            self.inner
                .inert
                .clock
                .now_millis()
                .saturating_add(DESCRIBE_TIMEOUT.as_millis() as u64),
            None,
        );
        // Describing takes a call slot like any call: the pool's instances are shared, and a
        // reload under load must wait for one rather than fail.
        let slot = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| "the runtime is shutting down".to_string())?;
        match execute(
            &self.inner.engine,
            pre,
            state,
            Op::Describe,
            DESCRIBE_TIMEOUT,
            Some(slot),
        )
        .await
        {
            Ok(OpOut::Describe(d)) => Ok(d),
            Ok(_) => Err("describe answered with the wrong shape".into()),
            Err(e) => Err(format!("describe {e}")),
        }
    }

    fn modules(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LoadedModule>>> {
        self.inner.modules.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Providers {
    /// Loads every entry: reads or embeds its module, compiles it, checks that it serves the
    /// entry's type, validates the block through the module and resolves the grants. Every
    /// error names the entry's path.
    pub async fn load(
        runtime: &Runtime,
        cfg: &ProvidersConfig,
        opts: LoadOptions<'_>,
    ) -> Result<Self, LoadError> {
        cfg.check()?;
        let mut by_name = BTreeMap::new();
        for (i, entry) in cfg.providers.iter().enumerate() {
            let provider = Provider::load(runtime, i, entry, &opts).await?;
            by_name.insert(entry.name.clone(), Arc::new(provider));
        }
        Ok(Self { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Provider>> {
        self.by_name.get(name)
    }

    /// Loads `cfg` entry by entry next to `previous`: an entry that loads replaces its old
    /// version (or keeps the old object when nothing about it changed); an entry that does not
    /// load is refused and its old version keeps serving. Calls already running hold their
    /// `Arc<Provider>` and finish on the version they started with.
    pub async fn reload(
        runtime: &Runtime,
        cfg: &ProvidersConfig,
        opts: LoadOptions<'_>,
        previous: &Providers,
    ) -> (Self, Vec<Rejection>) {
        let mut by_name = BTreeMap::new();
        let mut rejected = Vec::new();
        for (i, entry) in cfg.providers.iter().enumerate() {
            let old = previous.by_name.get(&entry.name);
            match Provider::load(runtime, i, entry, &opts).await {
                Ok(new) => {
                    let same = old.is_some_and(|o| o.revision == new.revision);
                    let keep = match old {
                        Some(o) if same => o.clone(),
                        _ => Arc::new(new),
                    };
                    by_name.insert(entry.name.clone(), keep);
                }
                Err(error) => {
                    if let Some(o) = old {
                        by_name.insert(entry.name.clone(), o.clone());
                    }
                    rejected.push(Rejection {
                        provider: entry.name.clone(),
                        error,
                    });
                }
            }
        }
        (Self { by_name }, rejected)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Provider>> {
        self.by_name.values()
    }

    /// The providers named in `names`, bound to `backends` (see [`Provider::rebind`]). Names
    /// not configured are left out, as a lookup of them would find nothing.
    pub fn rebound<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        backends: &Backends,
        recorder: Option<Arc<PlanRecorder>>,
    ) -> Result<Self, String> {
        let mut by_name = BTreeMap::new();
        for name in names {
            if let Some(p) = self.by_name.get(name) {
                by_name.insert(
                    name.to_string(),
                    Arc::new(p.rebind(backends, recorder.clone())?),
                );
            }
        }
        Ok(Self { by_name })
    }
}

impl Provider {
    async fn load(
        runtime: &Runtime,
        i: usize,
        entry: &ProviderEntry,
        opts: &LoadOptions<'_>,
    ) -> Result<Self, LoadError> {
        let at = format!("providers[{i}]");
        let bytes: std::borrow::Cow<'_, [u8]> = match &entry.module {
            Some(path) => {
                let full = opts.base_dir.join(path);
                std::fs::read(&full)
                    .map_err(|e| ConfigError::new(format!("{at}.module"), format!("cannot read {}: {e}", full.display())))?
                    .into()
            }
            None => (opts.builtin)(&entry.type_)
                .ok_or_else(|| {
                    ConfigError::new(
                        format!("{at}.type"),
                        format!("type {:?} has no built-in module in this build; name one with `module`", entry.type_),
                    )
                })?
                .into(),
        };
        let module = runtime.load_module(&bytes).await.map_err(|m| {
            ConfigError::new(
                format!("{at}.module"),
                format!("module for type {:?} {m}", entry.type_),
            )
        })?;
        let d = &module.description;
        if d.type_name != entry.type_ && !d.aliases.contains(&entry.type_) {
            return Err(ConfigError::new(
                format!("{at}.type"),
                format!("the module serves {:?}, not {:?}", d.type_name, entry.type_),
            ));
        }
        if entry.memory_bytes() > MAX_MEMORY_BYTES {
            return Err(ConfigError::new(
                format!("{at}.limits.memoryMiB"),
                format!("at most {}", MAX_MEMORY_BYTES >> 20),
            ));
        }
        let (block_key, block) = entry.block();
        let block_json = block
            .cloned()
            .unwrap_or(serde_json::Value::Object(Default::default()));
        let path = format!("{at}.{block_key}");
        let state = CallState::new(
            &entry.name,
            Arc::new(EffectiveGrants::default()),
            opts.backends.clone(),
            None,
            "",
            Redactor::default(),
            entry.memory_bytes(),
        );
        let validate_timeout = entry.timeout("validateConfig");
        let state = state.bounded(
            opts.backends
                .clock
                .now_millis()
                .saturating_add(validate_timeout.as_millis() as u64),
            None,
        );
        let op = Op::Validate {
            type_name: entry.type_.clone(),
            path: path.clone(),
            config: block_json.to_string(),
        };
        let slot = runtime
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ConfigError::new(&path, "the runtime is shutting down"))?;
        let config = match execute(
            &runtime.inner.engine,
            &module.pre,
            state,
            op,
            entry.timeout("validateConfig"),
            Some(slot),
        )
        .await
        {
            Ok(OpOut::Validate(Ok(c))) => c,
            Ok(OpOut::Validate(Err(e))) => {
                // The module names the field inside its message (`path.field: ...`).
                let (p, m) = match e.message.split_once(": ") {
                    Some((p, m)) if p.starts_with(&path) => (p.to_string(), m.to_string()),
                    _ => (path.clone(), e.message.clone()),
                };
                return Err(ConfigError::new(p, m));
            }
            Ok(_) => {
                return Err(ConfigError::new(
                    path,
                    "validate-config answered with the wrong shape",
                ));
            }
            Err(f) => return Err(ConfigError::new(path, format!("validate-config {f}"))),
        };
        let mut grants = effective(i, entry, &block_json, &d.capabilities)?;
        // A relative credentials file is found beside the config, as a module file is.
        if let Some(file) = grants
            .http
            .as_mut()
            .and_then(|g| g.google_credentials_file.as_mut())
            .filter(|f| Path::new(f.as_str()).is_relative())
        {
            *file = opts.base_dir.join(file.as_str()).display().to_string();
        }
        let create_timeout = create_timeout(&at, entry, grants.libvirt.is_some())?;
        let mut backends = opts.backends.clone();
        let mut libvirt_hosts = Vec::new();
        if grants.libvirt.is_some() {
            // The host dials the hypervisors; their details come from the normalized block,
            // and this entry's calls go through its own view of them.
            let normalized: serde_json::Value = serde_json::from_str(&config).unwrap_or_default();
            libvirt_hosts = crate::capabilities::libvirt::LibvirtHost::from_block(&normalized)
                .map_err(|(field, m)| ConfigError::new(format!("{path}.{field}"), m))?;
            for h in &mut libvirt_hosts {
                h.transfer_timeout = entry.image_transfer_timeout();
            }
            backends.libvirt = opts
                .backends
                .libvirt
                .clone()
                .for_entry(&entry.name, &libvirt_hosts)
                .map_err(|m| ConfigError::new(format!("{path}.hosts"), m))?;
        }
        Ok(Self {
            name: entry.name.clone(),
            type_name: entry.type_.clone(),
            // A new module is a change too: it may fix what a held Proxy failed on.
            revision: format!("{}-{}", entry.revision(), &module.digest[..12]),
            module,
            grants: Arc::new(grants),
            config,
            create_timeout,
            entry: entry.clone(),
            runtime: runtime.clone(),
            backends,
            libvirt_hosts,
            recorder: opts.recorder.clone(),
        })
    }

    /// The same provider bound to other backends, its plan steps going to `recorder`: a
    /// dry-run gives each lane of providers a simulated world of its own.
    pub fn rebind(
        &self,
        backends: &Backends,
        recorder: Option<Arc<PlanRecorder>>,
    ) -> Result<Self, String> {
        let mut own = backends.clone();
        if self.grants.libvirt.is_some() {
            own.libvirt = backends
                .libvirt
                .clone()
                .for_entry(&self.name, &self.libvirt_hosts)?;
        }
        Ok(Self {
            backends: own,
            recorder,
            ..self.clone()
        })
    }

    /// What this provider's calls can change, as keys that two providers share when their
    /// calls can meet: the cluster, the HTTP APIs, and each hypervisor both by the name and by
    /// the address it is configured with (two entries reach one hypervisor through either).
    pub fn reaches(&self) -> Vec<String> {
        let mut keys = Vec::new();
        if self.grants.kube.is_some() {
            keys.push("kube".to_string());
        }
        if self.grants.http.is_some() {
            keys.push("http".to_string());
        }
        if self.grants.libvirt.is_some() {
            for h in &self.libvirt_hosts {
                keys.push(format!("libvirt-name:{}", h.name));
                if !h.address.is_empty() {
                    keys.push(format!("libvirt-address:{}", h.address));
                }
            }
        }
        keys
    }

    fn ctx(&self) -> b::CallContext {
        b::CallContext {
            provider: self.name.clone(),
            type_name: self.type_name.clone(),
            config: self.config.clone(),
        }
    }

    fn fail(&self, op: &str, class: ErrorClass, reason: &str, message: String) -> ProviderError {
        ProviderError::new(&self.name, op, class, reason, message)
    }

    /// Runs `op` inside `span`, the operation's `provider.<op>` span: the capability calls the
    /// guest makes open their spans under it.
    async fn call(
        &self,
        op: Op,
        span: tracing::Span,
        subject: &str,
        redactor: Redactor,
    ) -> Result<OpOut, ProviderError> {
        let name = op.name();
        let timeout = match name {
            "create" => self.create_timeout,
            _ => self.entry.timeout(name),
        };
        async {
            let slot = self
                .runtime
                .inner
                .slots
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| {
                    self.fail(
                        name,
                        ErrorClass::Transient,
                        CALL_FAILURES[4],
                        "the runtime is shutting down".into(),
                    )
                })?;
            let deadline_ms = self
                .backends
                .clock
                .now_millis()
                .saturating_add(timeout.as_millis() as u64);
            let locks = crate::capabilities::lock::LockScope {
                locks: self.runtime.inner.locks.clone(),
                scope: self.module.digest.clone(),
            };
            let mut state = CallState::new(
                &self.name,
                self.grants.clone(),
                self.backends.clone(),
                self.recorder.clone(),
                subject,
                redactor.clone(),
                self.entry.memory_bytes(),
            )
            .bounded(deadline_ms, Some(locks));
            if let Op::Create(_, _, htpasswd) = &op {
                state.htpasswd = htpasswd.clone();
            }
            let started = std::time::Instant::now();
            let out = execute(
                &self.runtime.inner.engine,
                &self.module.pre,
                state,
                op,
                timeout,
                Some(slot),
            )
            .await;
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                ok = out.is_ok(),
                "provider call finished"
            );
            out.map_err(|f| {
                let reason = match f {
                    CallFailure::Timeout(_) => CALL_FAILURES[0],
                    CallFailure::MemoryLimit(_) => CALL_FAILURES[1],
                    CallFailure::Trap(_) => CALL_FAILURES[2],
                    CallFailure::Instantiate(_) => CALL_FAILURES[3],
                };
                let message = redactor.text(&format!("module {f}"));
                tracing::warn!(reason, "provider call failed: {message}");
                self.fail(name, ErrorClass::Transient, reason, message)
            })
        }
        .instrument(span)
        .await
    }

    /// Maps the guest's classified error, naming provider and operation, secrets redacted.
    fn guest_error(&self, op: &str, e: b::ProviderError, redactor: &Redactor) -> ProviderError {
        let class = match e.class {
            b::ErrorClass::Transient => ErrorClass::Transient,
            b::ErrorClass::Permanent => ErrorClass::Permanent,
            b::ErrorClass::NotFound => ErrorClass::NotFound,
            b::ErrorClass::QuotaExceeded => ErrorClass::QuotaExceeded,
        };
        self.fail(
            op,
            class,
            &redactor.text(&e.reason),
            redactor.text(&e.message),
        )
    }

    fn wrong_shape(&self, op: &str) -> ProviderError {
        self.fail(
            op,
            ErrorClass::Transient,
            "Internal",
            "unexpected answer shape".into(),
        )
    }

    fn observed<T>(
        &self,
        op: &str,
        started: std::time::Instant,
        r: Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        if let Some(o) = self.runtime.inner.observer.get() {
            o.observe(
                &self.name,
                op,
                started.elapsed(),
                r.as_ref().err().map(|e| e.class),
            );
        }
        r
    }

    pub async fn create(
        &self,
        subject: &str,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        let started = std::time::Instant::now();
        let r = self.create_inner(subject, req).await;
        self.observed("create", started, r)
    }

    async fn create_inner(
        &self,
        subject: &str,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        let redactor = Redactor::for_create(req.cloud_init.as_deref(), req.htpasswd.as_deref());
        // The instance name and zone find the instance in the backend; the request's
        // cloud-init never becomes an attribute.
        let span = tracing::info_span!(
            "provider.create",
            provider = %self.name,
            subject,
            instance = %req.name,
            zone = req.placement.zone.as_deref(),
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = Op::Create(
            self.ctx(),
            Box::new(to_wit_request(req)),
            req.htpasswd.clone(),
        );
        let out = self
            .call(op, span.clone(), subject, redactor.clone())
            .await
            .and_then(|o| match o {
                OpOut::Create(r) => r
                    .map(from_wit_instance)
                    .map_err(|e| self.guest_error("create", e, &redactor)),
                _ => Err(self.wrong_shape("create")),
            });
        failed_in(&span, out)
    }

    pub async fn get(&self, subject: &str, provider_id: &str) -> Result<Instance, ProviderError> {
        let started = std::time::Instant::now();
        let r = self.get_inner(subject, provider_id).await;
        self.observed("get", started, r)
    }

    async fn get_inner(&self, subject: &str, provider_id: &str) -> Result<Instance, ProviderError> {
        let r = Redactor::default();
        let span = tracing::info_span!(
            "provider.get",
            provider = %self.name,
            subject,
            provider_id,
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = Op::Get(self.ctx(), provider_id.into());
        let out = self
            .call(op, span.clone(), subject, r.clone())
            .await
            .and_then(|o| match o {
                OpOut::Get(r2) => r2
                    .map(from_wit_instance)
                    .map_err(|e| self.guest_error("get", e, &r)),
                _ => Err(self.wrong_shape("get")),
            });
        failed_in(&span, out)
    }

    pub async fn delete(&self, subject: &str, provider_id: &str) -> Result<(), ProviderError> {
        let started = std::time::Instant::now();
        let r = self.delete_inner(subject, provider_id).await;
        self.observed("delete", started, r)
    }

    async fn delete_inner(&self, subject: &str, provider_id: &str) -> Result<(), ProviderError> {
        let r = Redactor::default();
        let span = tracing::info_span!(
            "provider.delete",
            provider = %self.name,
            subject,
            provider_id,
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = Op::Delete(self.ctx(), provider_id.into());
        let out = self
            .call(op, span.clone(), subject, r.clone())
            .await
            .and_then(|o| match o {
                OpOut::Delete(r2) => r2.map_err(|e| self.guest_error("delete", e, &r)),
                _ => Err(self.wrong_shape("delete")),
            });
        failed_in(&span, out)
    }

    /// Every instance of this installation, the listing's pages collected (see
    /// [`Provider::list_pages`], which hands them over one at a time instead).
    pub async fn list_by_tag(
        &self,
        subject: &str,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError> {
        let mut out = Vec::new();
        self.list_pages(subject, installation, self.entry.list_page_size(), |page| {
            out.extend(page)
        })
        .await?;
        Ok(out)
    }

    /// The page size of this entry's listings (`limits.listPageSize`).
    pub fn list_page_size(&self) -> u32 {
        self.entry.list_page_size()
    }

    /// Drives the listing page by page, each page a call of its own on a fresh instance, and
    /// hands each page to `each` as it comes, so neither the guest nor the caller need hold
    /// more than a page. A module without `listing` answers in one page. Answers the number
    /// of pages. A page that fails transiently is asked again (the same cursor) up to
    /// [`PAGE_RETRIES`] times, backing off from [`PAGE_RETRY_BASE`] on the provider's clock
    /// (virtual in simulated runs); a page that still fails, or fails otherwise, ends the
    /// listing with its error. The CLI's sweep and the operator's sweeper both list here.
    pub async fn list_pages(
        &self,
        subject: &str,
        installation: &str,
        limit: u32,
        mut each: impl FnMut(Vec<Instance>),
    ) -> Result<u32, ProviderError> {
        let limit = limit.max(1);
        let mut cursor: Option<String> = None;
        let mut pages = 0u32;
        loop {
            let page = self
                .list_page_again_on_failure(subject, installation, cursor.as_deref(), limit)
                .await?;
            pages += 1;
            each(page.instances);
            match page.next {
                None => return Ok(pages),
                Some(next) if cursor.as_deref() == Some(next.as_str()) => {
                    return Err(self.fail(
                        "listByTag",
                        ErrorClass::Transient,
                        "CursorStuck",
                        "the module answered the cursor it was given: the listing would never end"
                            .into(),
                    ));
                }
                Some(_) if pages >= MAX_LIST_PAGES => {
                    return Err(self.fail(
                        "listByTag",
                        ErrorClass::Transient,
                        "TooManyPages",
                        format!("still listing after {MAX_LIST_PAGES} pages"),
                    ));
                }
                Some(next) => cursor = Some(next),
            }
        }
    }

    /// [`Self::list_page`], asked again after a transient failure (see [`Self::list_pages`]).
    async fn list_page_again_on_failure(
        &self,
        subject: &str,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ListPage, ProviderError> {
        let mut wait = PAGE_RETRY_BASE;
        for retry in 1..=PAGE_RETRIES {
            match self.list_page(subject, installation, cursor, limit).await {
                Err(e) if page_retryable(&e) => {
                    tracing::info!(
                        provider = %self.name,
                        retry,
                        reason = %e.reason,
                        "a listing page failed; asking again in {wait:?}"
                    );
                    self.backends
                        .clock
                        .sleep_millis(wait.as_millis() as u64)
                        .await;
                    wait *= 2;
                }
                answered => return answered,
            }
        }
        self.list_page(subject, installation, cursor, limit).await
    }

    /// One page of the listing: at most `limit` instances after `cursor`. A module without
    /// `listing` answers everything, with no cursor.
    pub async fn list_page(
        &self,
        subject: &str,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ListPage, ProviderError> {
        let started = std::time::Instant::now();
        let r = self
            .list_page_inner(subject, installation, cursor, limit)
            .await;
        self.observed("listByTag", started, r)
    }

    async fn list_page_inner(
        &self,
        subject: &str,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<ListPage, ProviderError> {
        let r = Redactor::default();
        let span = tracing::info_span!(
            "provider.list-by-tag",
            provider = %self.name,
            subject,
            paged = self.module.pages(),
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let op = if self.module.pages() {
            Op::ListPage(
                self.ctx(),
                installation.into(),
                cursor.map(str::to_string),
                limit,
            )
        } else {
            Op::List(self.ctx(), installation.into())
        };
        let out = self
            .call(op, span.clone(), subject, r.clone())
            .await
            .and_then(|o| match o {
                OpOut::ListPage(r2) => r2
                    .map(|(v, next)| ListPage {
                        instances: v.into_iter().map(from_wit_instance).collect(),
                        next: next.filter(|c| !c.is_empty()),
                    })
                    .map_err(|e| self.guest_error("listByTag", e, &r)),
                OpOut::List(r2) => r2
                    .map(|v| ListPage {
                        instances: v.into_iter().map(from_wit_instance).collect(),
                        next: None,
                    })
                    .map_err(|e| self.guest_error("listByTag", e, &r)),
                _ => Err(self.wrong_shape("listByTag")),
            });
        failed_in(&span, out)
    }

    /// The health of each backend target. A failed call is one target with the failure.
    pub async fn check(&self) -> Vec<TargetStatus> {
        let started = std::time::Instant::now();
        let out = self.check_inner().await;
        let failed = out.iter().any(|t| t.reason != "Healthy");
        if let Some(o) = self.runtime.inner.observer.get() {
            o.observe(
                &self.name,
                "check",
                started.elapsed(),
                failed.then_some(ErrorClass::Transient),
            );
        }
        out
    }

    async fn check_inner(&self) -> Vec<TargetStatus> {
        let span = tracing::info_span!("provider.check", provider = %self.name);
        match self
            .call(Op::Check(self.ctx()), span, "check", Redactor::default())
            .await
        {
            Ok(OpOut::Check(targets)) => targets
                .into_iter()
                .map(|t| TargetStatus {
                    target: t.target,
                    address: t.address,
                    reason: t.reason,
                    message: t.message,
                    details: t.details.into_iter().collect(),
                })
                .collect(),
            Ok(_) => vec![],
            Err(e) => vec![TargetStatus {
                target: "module".into(),
                address: String::new(),
                reason: e.reason.clone(),
                message: e.message,
                details: BTreeMap::new(),
            }],
        }
    }
}

/// Marks a failed operation on its span: an error status with the (redacted) message, and the
/// reason as `error.type`, so a trace shows which call failed and why.
fn failed_in<T>(span: &tracing::Span, r: Result<T, ProviderError>) -> Result<T, ProviderError> {
    if let Err(e) = &r {
        span.record("error.type", e.reason.as_str());
        span.record("otel.status_description", e.message.as_str());
    }
    r
}

/// What a libvirt create may spend beyond its image transfer: the other RPCs, the start and
/// the wait for running.
const CREATE_BEYOND_TRANSFER: Duration = Duration::from_secs(300);

/// The create bound. A libvirt create streams a first image within it, under the entry's
/// transfer budget (`limits.timeouts.imageTransfer`): a create bound no longer than that would
/// cut every slow first download off and start it again from nothing at the next try, forever.
/// So for an entry granted libvirt the default covers the budget, and a bound that does not is
/// refused, naming both.
fn create_timeout(at: &str, entry: &ProviderEntry, libvirt: bool) -> Result<Duration, LoadError> {
    if !libvirt {
        return Ok(entry.timeout("create"));
    }
    let transfer = entry.image_transfer_timeout();
    match entry.explicit_timeout("create") {
        Some(t) if t <= transfer => Err(ConfigError::new(
            format!("{at}.limits.timeouts.create"),
            format!(
                "{} is not longer than the image transfer budget ({} = {}): a first image download could never finish; raise it or lower {at}.limits.timeouts.{}",
                human(t),
                egress_core::config::IMAGE_TRANSFER,
                human(transfer),
                egress_core::config::IMAGE_TRANSFER,
            ),
        )),
        Some(t) => Ok(t),
        None => Ok(transfer + CREATE_BEYOND_TRANSFER),
    }
}

fn human(d: Duration) -> String {
    match d.as_millis() {
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

fn to_wit_request(r: &CreateRequest) -> b::CreateRequest {
    let Placement {
        zone,
        region,
        machine_type,
        image,
    } = r.placement.clone();
    b::CreateRequest {
        name: r.name.clone(),
        namespace: r.namespace.clone(),
        uid: r.uid.clone(),
        port: r.port,
        placement: b::Placement {
            zone,
            region,
            machine_type,
            image,
        },
        cloud_init: r.cloud_init.clone(),
        installation: r.installation.clone(),
        owner: r.owner.as_ref().map(|o| b::OwnerReference {
            api_version: o.api_version.clone(),
            kind: o.kind.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        }),
    }
}

fn from_wit_instance(i: b::Instance) -> Instance {
    Instance {
        provider_id: i.provider_id,
        name: i.name,
        uid: i.uid,
        installation: i.installation,
        state: match i.state {
            b::InstanceState::Provisioning => InstanceState::Provisioning,
            b::InstanceState::Running => InstanceState::Running,
            b::InstanceState::Stopped => InstanceState::Stopped,
            b::InstanceState::Terminated => InstanceState::Terminated,
        },
        ip: i.ip,
        created_at: i.created_at,
    }
}
