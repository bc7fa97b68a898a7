//! Hot reload: the providers config and every module file it names are watched (by content,
//! polled); a change is compiled and validated in the background and swapped in per provider.
//! A version that fails to compile, validate, or asks for capabilities its grant does not
//! allow is refused with a log line, and the old version keeps serving.

use crate::capabilities::Backends;
use crate::engine::Runtime;
use crate::plan::PlanRecorder;
use crate::provider::{LoadOptions, Providers, Rejection};
use egress_core::config::{ConfigError, ProvidersConfig};
use egress_core::settle::Settle;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// What a reload did.
#[derive(Debug, Default)]
pub struct ReloadOutcome {
    /// Providers now served by a new version (added or changed).
    pub swapped: Vec<String>,
    /// Providers no longer configured.
    pub removed: Vec<String>,
    pub rejected: Vec<Rejection>,
    /// The config file itself was refused (nothing was swapped).
    pub config_error: Option<ConfigError>,
}

pub struct Reloader {
    runtime: Runtime,
    path: PathBuf,
    backends: Backends,
    recorder: Option<Arc<PlanRecorder>>,
    builtin: fn(&str) -> Option<&'static [u8]>,
    current: RwLock<Arc<Providers>>,
    config: RwLock<Arc<ProvidersConfig>>,
    /// The fingerprint of the files serving now, and a change waiting to settle.
    files: Mutex<Settle<String>>,
}

/// The config file's text and the fingerprint of it and of every module file it names, read
/// once, so the decision taken on a change and the fingerprint stored after it describe the
/// same content: a file caught mid-write and completed after is seen as a change again.
struct Snapshot {
    text: Result<String, String>,
    fingerprint: String,
}

impl Snapshot {
    /// Module paths come from the file as read when it parses (an edit may add one), else from
    /// the config now serving.
    fn take(path: &Path, serving: &ProvidersConfig) -> Self {
        let mut h = Sha256::new();
        let text = match std::fs::read(path) {
            Ok(b) => {
                h.update(&b);
                String::from_utf8(b).map_err(|e| format!("{} is not UTF-8: {e}", path.display()))
            }
            Err(e) => {
                let why = format!("cannot read {}: {e}", path.display());
                h.update(why.as_bytes());
                Err(why)
            }
        };
        let probe = text
            .as_deref()
            .ok()
            .and_then(|t| ProvidersConfig::from_yaml(t).ok());
        let dir = path.parent().unwrap_or(Path::new("."));
        let config = probe.as_ref().unwrap_or(serving);
        let mut hash_file = |p: &Path| {
            h.update(p.as_os_str().as_encoded_bytes());
            match std::fs::read(p) {
                Ok(b) => h.update(&b),
                Err(e) => h.update(e.to_string().as_bytes()),
            }
        };
        for entry in &config.providers {
            // A registry's module is named by digest (or a tag pinned at its first pull): the
            // config's text is its whole fingerprint.
            if let Some(Ok(egress_core::config::ModuleRef::File(m))) = entry.module_ref() {
                let module = dir.join(m);
                hash_file(&module);
                // A signature added, replaced or stripped is a change to load again.
                hash_file(&egress_supply::signature_path(&module));
            }
        }
        for key in config.module_verification.iter().flat_map(|v| &v.keys) {
            hash_file(&dir.join(&key.public_key_file));
        }
        Self {
            text,
            fingerprint: hex::encode(h.finalize()),
        }
    }
}

fn read_config(path: &Path) -> Result<ProvidersConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("", format!("cannot read {}: {e}", path.display())))?;
    parse_config(path, &text)
}

/// The config `text` of the file at `path`, its relative file paths resolved beside it.
fn parse_config(path: &Path, text: &str) -> Result<ProvidersConfig, ConfigError> {
    let mut cfg = ProvidersConfig::from_yaml(text)?;
    cfg.resolve_files(path.parent().unwrap_or(Path::new(".")));
    Ok(cfg)
}

impl Reloader {
    /// Loads the config at `path`; any error is fatal here (there is no old version yet).
    pub async fn new(
        runtime: Runtime,
        path: PathBuf,
        backends: Backends,
        recorder: Option<Arc<PlanRecorder>>,
        builtin: fn(&str) -> Option<&'static [u8]>,
    ) -> Result<Self, ConfigError> {
        let cfg = read_config(&path)?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let providers = Providers::load(
            &runtime,
            &cfg,
            LoadOptions {
                base_dir: &dir,
                builtin: &builtin,
                backends: backends.clone(),
                recorder: recorder.clone(),
            },
        )
        .await?;
        let fp = Snapshot::take(&path, &cfg).fingerprint;
        Ok(Self {
            runtime,
            path,
            backends,
            recorder,
            builtin,
            current: RwLock::new(Arc::new(providers)),
            config: RwLock::new(Arc::new(cfg)),
            files: Mutex::new(Settle::acting_on(fp)),
        })
    }

    /// The providers as loaded now. A caller keeps its snapshot for the length of its call.
    pub fn current(&self) -> Arc<Providers> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn config(&self) -> Arc<ProvidersConfig> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot::take(&self.path, &self.config())
    }

    fn files(&self) -> std::sync::MutexGuard<'_, Settle<String>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn serving_fingerprint(&self) -> String {
        self.files().current().cloned().unwrap_or_default()
    }

    /// Whether the config file or a module file changed since the last (re)load.
    pub fn changed(&self) -> bool {
        self.snapshot().fingerprint != self.serving_fingerprint()
    }

    /// Reloads when something changed; None when nothing did.
    pub async fn reload_if_changed(&self) -> Option<ReloadOutcome> {
        let snap = self.snapshot();
        if snap.fingerprint == self.serving_fingerprint() {
            return None;
        }
        Some(self.reload_from(snap).await)
    }

    /// For a loop that polls files other programs write: a change is loaded only once two
    /// polls in a row see the same content, so a file caught mid-write (truncated, half a
    /// module) is never loaded, refused, or taken for an empty config.
    pub async fn poll(&self) -> Option<ReloadOutcome> {
        let snap = self.snapshot();
        let settled = self.files().observe(snap.fingerprint.clone()).is_some();
        if !settled {
            return None;
        }
        Some(self.reload_from(snap).await)
    }

    /// Loads the current files next to the serving version and swaps in what loaded.
    pub async fn reload(&self) -> ReloadOutcome {
        let snap = self.snapshot();
        self.reload_from(snap).await
    }

    async fn reload_from(&self, snap: Snapshot) -> ReloadOutcome {
        let mut out = ReloadOutcome::default();
        let parsed = snap
            .text
            .map_err(|why| ConfigError::new("", why))
            .and_then(|t| parse_config(&self.path, &t));
        let cfg = match parsed {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(path = %self.path.display(), "providers config refused, the previous one keeps serving: {e}");
                // The same bad content is refused once, not on every poll.
                self.files().acted_on(snap.fingerprint);
                out.config_error = Some(e);
                return out;
            }
        };
        let dir = self
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let previous = self.current();
        let builtin = self.builtin;
        let (next, rejected) = Providers::reload(
            &self.runtime,
            &cfg,
            LoadOptions {
                base_dir: &dir,
                builtin: &builtin,
                backends: self.backends.clone(),
                recorder: self.recorder.clone(),
            },
            &previous,
        )
        .await;
        for (name, p) in &next.by_name {
            if previous.get(name).is_none_or(|o| !Arc::ptr_eq(o, p)) {
                tracing::info!(provider = %name, module = %p.module.digest, "provider version swapped in");
                out.swapped.push(name.clone());
            }
        }
        for name in previous.by_name.keys() {
            if next.get(name).is_none() && !cfg.providers.iter().any(|e| &e.name == name) {
                out.removed.push(name.clone());
            }
        }
        for r in &rejected {
            tracing::error!(provider = %r.provider, "new version refused, the previous one keeps serving: {}", r.error);
        }
        out.rejected = rejected;
        // The fingerprint of what was read, not of the files now: a module rewritten while
        // this load ran is seen as a change on the next poll.
        self.files().acted_on(snap.fingerprint);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(cfg);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        out
    }
}
