//! Loading: a module compiled (once per digest) and asked to describe itself, and a provider
//! entry read, checked against its module, its block validated by the module, its grants and
//! bounds resolved.

use crate::bindings::{self as b, ModulePre};
use crate::call::{CallState, Op, OpOut, execute};
use crate::engine::{MAX_MEMORY_BYTES, Runtime};
use crate::grants::{EffectiveGrants, effective};
use crate::module::LoadedModule;
use crate::provider::{LoadError, LoadOptions, Provider, Providers, Rejection};
use crate::redact::Redactor;
use egress_core::config::{
    ConfigError, ModuleRef, ModuleVerification, OciRef, ProviderEntry, ProvidersConfig,
};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The wall-time bound of `describe`, which every module answers from constants.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

impl Runtime {
    /// Compiles a module (or takes it from the disk cache), prepares its instantiation and
    /// asks it to describe itself. Identical bytes are compiled once per process.
    pub async fn load_module(&self, bytes: &[u8]) -> Result<Arc<LoadedModule>, String> {
        self.load_module_digest(bytes, hex::encode(Sha256::digest(bytes)))
            .await
    }

    /// [`load_module`](Self::load_module) of bytes whose SHA-256 (`digest`, hex) is known.
    async fn load_module_digest(
        &self,
        bytes: &[u8],
        digest: String,
    ) -> Result<Arc<LoadedModule>, String> {
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
        .0
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
            let provider =
                Provider::load(runtime, i, entry, cfg.module_verification.as_ref(), &opts).await?;
            by_name.insert(entry.name.clone(), Arc::new(provider));
        }
        Ok(Self { by_name })
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
            match Provider::load(runtime, i, entry, cfg.module_verification.as_ref(), &opts).await {
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
}

impl Provider {
    async fn load(
        runtime: &Runtime,
        i: usize,
        entry: &ProviderEntry,
        verification: Option<&ModuleVerification>,
        opts: &LoadOptions<'_>,
    ) -> Result<Self, LoadError> {
        let at = format!("providers[{i}]");
        let mut source = None;
        // The module's SHA-256 (hex) once its checks computed it, so it is hashed once.
        let mut known_digest: Option<String> = None;
        let bytes: std::borrow::Cow<'_, [u8]> = match entry.module_ref() {
            Some(Ok(ModuleRef::File(path))) => {
                let full = opts.base_dir.join(path);
                let bytes = std::fs::read(&full).map_err(|e| {
                    ConfigError::new(
                        format!("{at}.module"),
                        format!("cannot read {}: {e}", full.display()),
                    )
                })?;
                // Before compiling: a module that is not the one pinned, or not signed as the
                // policy requires, is never instantiated.
                let sum: [u8; 32] = Sha256::digest(&bytes).into();
                entry.verify_module_digest(&at, sum)?;
                if let Some(policy) = verification {
                    let digest = format!("sha256:{}", hex::encode(sum));
                    let signed_by =
                        egress_supply::check_module(policy, opts.base_dir, &at, &full, &digest)?;
                    tracing::debug!(provider = %entry.name, keys = ?signed_by, "module signature verified");
                }
                known_digest = Some(hex::encode(sum));
                bytes.into()
            }
            Some(Ok(ModuleRef::Oci(r))) => {
                let pulled = runtime
                    .inner
                    .registry
                    .pull(&r, verification.is_some())
                    .await
                    .map_err(|e| ConfigError::new(format!("{at}.module"), e.to_string()))?;
                let mut sum = [0u8; 32];
                hex::decode_to_slice(
                    pulled.module_digest.trim_start_matches("sha256:"),
                    &mut sum,
                )
                .map_err(|e| ConfigError::new(format!("{at}.module"), e.to_string()))?;
                entry.verify_module_digest(&at, sum)?;
                if let Some(policy) = verification {
                    let keys = egress_supply::read_keys(policy, opts.base_dir)?;
                    let sig = OciRef {
                        tag: Some(egress_supply::oci::signature_tag(&pulled.module_digest)),
                        digest: None,
                        ..r.clone()
                    };
                    let signed_by = egress_supply::check_signature(
                        policy,
                        &keys,
                        &at,
                        &pulled.reference.to_string(),
                        &pulled.module_digest,
                        &sig.to_string(),
                        pulled.signature.as_deref(),
                    )?;
                    tracing::debug!(provider = %entry.name, keys = ?signed_by, "module signature verified");
                }
                source = Some(pulled.reference.to_string());
                known_digest = Some(hex::encode(sum));
                pulled.bytes.into()
            }
            Some(Err(why)) => return Err(ConfigError::new(format!("{at}.module"), why)),
            None => (opts.builtin)(&entry.type_)
                .ok_or_else(|| {
                    ConfigError::new(
                        format!("{at}.type"),
                        format!("type {:?} has no built-in module in this build; name one with `module`", entry.type_),
                    )
                })?
                .into(),
        };
        let digest = known_digest.unwrap_or_else(|| hex::encode(Sha256::digest(&bytes)));
        let module = runtime
            .load_module_digest(&bytes, digest)
            .await
            .map_err(|m| {
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
        .0
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
            source,
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
