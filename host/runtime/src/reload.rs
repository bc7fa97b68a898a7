//! Hot reload: the providers config and every module file it names are watched (by content,
//! polled); a change is compiled and validated in the background and swapped in per provider.
//! A version that fails to compile, validate, or asks for capabilities its grant does not
//! allow is refused with a log line, and the old version keeps serving.

use crate::plan::PlanRecorder;
use crate::provider::{LoadOptions, Providers, Rejection};
use crate::{Backends, Runtime};
use egress_core::config::{ConfigError, ProvidersConfig};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

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
    fingerprint: RwLock<String>,
}

/// A digest of the config file and of every module file it names, so an edit of either is
/// seen. Unreadable files count as their error, so their return is a change too.
fn fingerprint(path: &Path, cfg: Option<&ProvidersConfig>) -> String {
    let mut h = Sha256::new();
    match std::fs::read(path) {
        Ok(b) => h.update(&b),
        Err(e) => h.update(e.to_string().as_bytes()),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    for entry in cfg.map(|c| c.providers.as_slice()).unwrap_or_default() {
        if let Some(m) = &entry.module {
            h.update(m.as_bytes());
            match std::fs::read(dir.join(m)) {
                Ok(b) => h.update(&b),
                Err(e) => h.update(e.to_string().as_bytes()),
            }
        }
    }
    hex::encode(h.finalize())
}

fn read_config(path: &Path) -> Result<ProvidersConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("", format!("cannot read {}: {e}", path.display())))?;
    ProvidersConfig::from_yaml(&text)
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
        let fp = fingerprint(&path, Some(&cfg));
        Ok(Self {
            runtime,
            path,
            backends,
            recorder,
            builtin,
            current: RwLock::new(Arc::new(providers)),
            config: RwLock::new(Arc::new(cfg)),
            fingerprint: RwLock::new(fp),
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

    /// Whether the config file or a module file changed since the last (re)load.
    pub fn changed(&self) -> bool {
        let cfg = self.config();
        // A module path may be added by an edit of the config: fingerprint the new config's.
        let probe = read_config(&self.path).ok();
        let fp = fingerprint(&self.path, probe.as_ref().or(Some(&cfg)));
        *self.fingerprint.read().unwrap_or_else(|p| p.into_inner()) != fp
    }

    /// Reloads when something changed; None when nothing did.
    pub async fn reload_if_changed(&self) -> Option<ReloadOutcome> {
        if !self.changed() {
            return None;
        }
        Some(self.reload().await)
    }

    /// Loads the current files next to the serving version and swaps in what loaded.
    pub async fn reload(&self) -> ReloadOutcome {
        let mut out = ReloadOutcome::default();
        let cfg = match read_config(&self.path) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(path = %self.path.display(), "providers config refused, the previous one keeps serving: {e}");
                // Fingerprint it the way `changed` will, so the same bad file is refused once.
                let old = self.config();
                *self.fingerprint.write().unwrap_or_else(|p| p.into_inner()) =
                    fingerprint(&self.path, Some(&old));
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
        *self.fingerprint.write().unwrap_or_else(|p| p.into_inner()) =
            fingerprint(&self.path, Some(&cfg));
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(cfg);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        out
    }
}
