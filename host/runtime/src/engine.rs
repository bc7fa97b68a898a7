//! The one Engine: compiled modules cached on disk (keyed by module digest and engine config),
//! the pooling allocator when the machine lets it reserve its slots, one epoch ticker.

use crate::bindings::ProviderModule;
use crate::call::CallState;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances: the granularity at which a spinning guest yields.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// The largest linear memory any provider entry may ask for.
pub const MAX_MEMORY_BYTES: usize = 256 << 20;

#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Where compiled modules are cached; None disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// Try the pooling allocator (falls back to on-demand when it cannot reserve memory).
    pub pooling: bool,
    /// Calls running at once; further calls wait for a slot.
    pub max_concurrent_calls: u32,
    /// How `oci://` modules are pulled: credentials and extra CAs. Their cache is beside the
    /// compiled modules', in `cache_dir` (its own `cache_dir` is not read).
    pub registry: egress_supply::oci::RegistryOptions,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            cache_dir: default_cache_dir(),
            pooling: true,
            max_concurrent_calls: 128,
            registry: egress_supply::oci::RegistryOptions::from_env(None),
        }
    }
}

/// `$EGRESS_PROXIES_CACHE_DIR`, else `$XDG_CACHE_HOME/egress-proxies`, else
/// `$HOME/.cache/egress-proxies`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("EGRESS_PROXIES_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("egress-proxies"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/egress-proxies"))
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("wasm engine: {0}")]
    Engine(String),
    #[error("module cache at {path}: {message}")]
    Cache { path: String, message: String },
    #[error("registry client: {0}")]
    Registry(#[from] egress_supply::oci::OciError),
}

pub(crate) struct Inner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<CallState>,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) pooling: bool,
    /// Backends for calls granted nothing (describe).
    pub(crate) inert: crate::capabilities::Backends,
    /// Told about every finished provider call (metrics).
    pub(crate) observer: std::sync::OnceLock<Arc<dyn CallObserver>>,
    /// The `lock` capability's keys, shared by every call of this process.
    pub(crate) locks: Arc<crate::capabilities::lock::Locks>,
    /// Compiled modules by digest, so identical bytes compile once per process.
    pub(crate) modules:
        std::sync::Mutex<std::collections::HashMap<String, Arc<crate::module::LoadedModule>>>,
    /// Where `oci://` modules come from; tags it resolved stay pinned for the process.
    pub(crate) registry: egress_supply::oci::Registry,
}

/// Cheap to clone; all clones share the Engine, the linker and the call slots.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

fn base_config(opts: &RuntimeOptions) -> Result<Config, RuntimeError> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.parallel_compilation(true);
    if let Some(dir) = &opts.cache_dir {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Cache {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        let dir = std::path::absolute(dir).map_err(|e| RuntimeError::Cache {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        let mut cache = wasmtime::CacheConfig::new();
        cache.with_directory(&dir);
        let cache = wasmtime::Cache::new(cache).map_err(|e| RuntimeError::Cache {
            path: dir.display().to_string(),
            message: format!("{e:#}"),
        })?;
        config.cache(Some(cache));
    }
    Ok(config)
}

/// The core instances one component may hold. A Rust module holds two or three; a Python one
/// (componentize-py: libc, libpython and its runtime linked dynamically, an adapter for each
/// WASI interface) 38. A core instance is no reservation of the pool (its context is allocated
/// at instantiation, only memories, tables and stacks are pooled): this bounds a count, and
/// the total is this for every call slot, so no call fails for the want of one.
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;

/// How much of each pooled linear memory stays resident between calls (see `pooling_config`).
const KEEP_RESIDENT_BYTES: usize = 512 << 10;

fn pooling_config(slots: u32) -> PoolingAllocationConfig {
    let mut p = PoolingAllocationConfig::default();
    p.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT))
        .total_memories(slots * 2)
        .total_tables(slots * 4)
        .total_stacks(slots)
        .max_memory_size(MAX_MEMORY_BYTES)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(4)
        .max_tables_per_component(8)
        // A reused slot keeps its first 512 KiB resident, zeroed with memset, instead of
        // faulting them in again and unmapping them at every release. The guests' shadow stack
        // (128 KiB, host/guest-build), their data and the heap of most calls lie below that.
        // Unmapping also costs every other thread of the process a TLB shootdown, which
        // doubled the system time of a dry-run's lanes. 10,000 Proxies: 495,000 -> 118,000
        // page faults, 7.6 -> 3.9 s (BENCHMARKS.md, "Scale").
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(64 << 10)
        // Of those, only the pages the call wrote are reset, found with Linux's PAGEMAP_SCAN
        // (6.7 and later; older kernels memset them all, as before): a Get writes a fraction
        // of the guests' 384 KiB. The 100-member day: user and system time 16.0 -> 14.4 s
        // (BENCHMARKS.md, "A pool's day of ordinary weather").
        .pagemap_scan(wasmtime::Enabled::Auto);
    p
}

impl Runtime {
    pub fn new(opts: RuntimeOptions) -> Result<Self, RuntimeError> {
        let registry = egress_supply::oci::Registry::new(egress_supply::oci::RegistryOptions {
            cache_dir: opts.cache_dir.clone(),
            ..opts.registry.clone()
        })?;
        let slots = opts.max_concurrent_calls.max(1);
        let mut pooling = false;
        let mut engine = None;
        if opts.pooling {
            let mut config = base_config(&opts)?;
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling_config(slots)));
            match Engine::new(&config) {
                Ok(e) => {
                    pooling = true;
                    engine = Some(e);
                }
                Err(e) => {
                    tracing::warn!(
                        "pooling allocator unavailable ({e:#}); using on-demand allocation"
                    );
                }
            }
        }
        let engine = match engine {
            Some(e) => e,
            None => Engine::new(&base_config(&opts)?)
                .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?,
        };
        // A pooling engine can still fail at its first instantiation if the reservation is
        // refused lazily; probing with an empty store is not possible without a module, so the
        // fallback above covers the reservation made at Engine::new.

        let mut linker: Linker<CallState> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("linking WASI: {e:#}")))?;
        ProviderModule::add_to_linker::<CallState, HasSelf<CallState>>(&mut linker, |s| s)
            .map_err(|e| RuntimeError::Engine(format!("linking capabilities: {e:#}")))?;

        spawn_ticker(&engine).map_err(|e| RuntimeError::Engine(format!("epoch ticker: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                engine,
                linker,
                slots: Arc::new(Semaphore::new(slots as usize)),
                pooling,
                modules: Default::default(),
                observer: std::sync::OnceLock::new(),
                inert: crate::capabilities::Backends::inert(),
                locks: Arc::default(),
                registry,
            }),
        })
    }

    /// The digests (hex) of the modules compiled in this process: a module refused before
    /// compiling is never among them.
    pub fn loaded_digests(&self) -> Vec<String> {
        self.inner
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Whether the pooling allocator is in use.
    pub fn pooling(&self) -> bool {
        self.inner.pooling
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Sets the observer of every provider call; the first one set stays.
    pub fn set_observer(&self, observer: Arc<dyn CallObserver>) {
        let _ = self.inner.observer.set(observer);
    }
}

/// Sees every finished provider call: which provider, which operation, how long, and the
/// class of its failure if it failed.
pub trait CallObserver: Send + Sync {
    fn observe(
        &self,
        provider: &str,
        operation: &str,
        elapsed: Duration,
        failure: Option<egress_core::ErrorClass>,
    );

    /// The linear memory one finished call's instance held at its end, across the component's
    /// memories: its peak, since linear memory never shrinks (what `limits.memoryMiB` bounds).
    fn memory(&self, _provider: &str, _operation: &str, _bytes: usize) {}
}

/// One ticker per Engine, on its own thread so a guest spinning on a single-threaded runtime
/// still sees the epoch move. It ends when the Engine is dropped.
fn spawn_ticker(engine: &Engine) -> std::io::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => break,
                }
            }
        })
        .map(|_| ())
}
