//! Configured providers: each entry's module compiled once and described, its config block
//! validated by the module, its grants resolved, and its calls run on fresh stores.
//!
//! Here a provider, the configured set and one call run on a fresh store; `load.rs` compiles a
//! module and loads an entry, `calls.rs` holds the typed calls (create, get, delete, check) and
//! `list.rs` the listing, page by page.

mod calls;
mod list;
mod load;

pub use crate::module::LoadedModule;

use crate::bindings as b;
use crate::call::{CallFailure, CallState, Op, OpOut, execute};
use crate::capabilities::Backends;
use crate::engine::Runtime;
use crate::grants::EffectiveGrants;
use crate::plan::PlanRecorder;
use crate::redact::Redactor;
use egress_core::config::{ConfigError, ProviderEntry};
use egress_core::{ErrorClass, Instance, ProviderError};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// The target of every provider span and event, whichever file of this module makes it: the
/// CLI's progress follows the `provider.*` spans of this target by name.
const TARGET: &str = "egress_runtime::provider";

pub type LoadError = ConfigError;

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
    /// Where the module came from when that was a registry: the reference pinned to the
    /// manifest's digest (a tag as resolved at load).
    pub source: Option<String>,
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

/// One page of a provider's listing and the cursor that continues it; none on the last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    pub instances: Vec<Instance>,
    pub next: Option<String>,
}

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

impl Providers {
    pub fn get(&self, name: &str) -> Option<&Arc<Provider>> {
        self.by_name.get(name)
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
            let (out, memory_bytes) = execute(
                &self.runtime.inner.engine,
                &self.module.pre,
                state,
                op,
                timeout,
                Some(slot),
            )
            .await;
            if let Some(o) = self.runtime.inner.observer.get() {
                o.memory(&self.name, name, memory_bytes);
            }
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
