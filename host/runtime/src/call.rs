//! One provider call: a fresh Store with the call's grants, limits and secrets, the module
//! instantiated from its InstancePre, the export called under a wall-time bound. A guest that
//! loops, traps or outgrows its memory becomes a classified failure; the host keeps serving.

use crate::bindings::{
    CallContext, CreateRequest, Description, Instance, ModulePre, ProviderError, TargetStatus,
};
use crate::capabilities::Backends;
use crate::grants::EffectiveGrants;
use crate::plan::{PlanRecorder, PlanStep};
use crate::redact::Redactor;
use crate::trap::{INJECTED_TRAP, InjectedTrap};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::Store;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// The Store's data: everything one call may touch, and nothing else.
pub(crate) struct CallState {
    wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    limiter: MemoryLimiter,
    pub(crate) provider: String,
    pub(crate) grants: Arc<EffectiveGrants>,
    pub(crate) backends: Backends,
    pub(crate) recorder: Option<Arc<PlanRecorder>>,
    pub(crate) subject: String,
    pub(crate) redactor: Redactor,
    /// The locks this call may take; None where a call has no business locking (describe,
    /// validate-config).
    pub(crate) locks: Option<crate::capabilities::lock::LockScope>,
    /// Unix ms at which the host ends this call.
    pub(crate) deadline_ms: u64,
    /// The htpasswd of the proxy a create call makes (the `credentials` import); None in
    /// every other call.
    pub(crate) htpasswd: Option<String>,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl CallState {
    pub(crate) fn new(
        provider: &str,
        grants: Arc<EffectiveGrants>,
        backends: Backends,
        recorder: Option<Arc<PlanRecorder>>,
        subject: &str,
        redactor: Redactor,
        memory_bytes: usize,
    ) -> Self {
        // WASI with nothing granted: no files, env, args, sockets or name lookups.
        let wasi = WasiCtx::builder()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter {
                max_bytes: memory_bytes,
                denied: false,
                granted: 0,
            },
            provider: provider.to_string(),
            grants,
            backends,
            recorder,
            subject: subject.to_string(),
            redactor,
            locks: None,
            deadline_ms: 0,
            htpasswd: None,
        }
    }

    /// The call's bounds as the guest sees them: when it ends, and what it may lock.
    pub(crate) fn bounded(
        mut self,
        deadline_ms: u64,
        locks: Option<crate::capabilities::lock::LockScope>,
    ) -> Self {
        self.deadline_ms = deadline_ms;
        self.locks = locks;
        self
    }

    /// Records a mutating call as a plan step, secrets redacted, with the backend's refusal
    /// if it refused.
    pub(crate) fn record(
        &self,
        capability: &str,
        call: &str,
        target: String,
        mut args: Value,
        error: Option<String>,
    ) {
        if let Some(rec) = &self.recorder {
            self.redactor.value(&mut args);
            crate::redact::user_data_items(&mut args);
            rec.push(PlanStep {
                subject: self.subject.clone(),
                provider: self.provider.clone(),
                capability: capability.to_string(),
                call: call.to_string(),
                target: self.redactor.text(&target),
                args,
                error: error.map(|e| self.redactor.text(&e)),
                at_ms: self.backends.clock.now_millis(),
                seq: crate::plan::next_seq(),
            });
        }
    }
}

/// Caps linear memory per store; a refused growth traps at once (so the guest cannot limp
/// on), and the flag tells the caller why the call died.
struct MemoryLimiter {
    max_bytes: usize,
    denied: bool,
    /// Bytes of linear memory granted to the call's instance, across all its memories (a
    /// component may have several), initial sizes included: its memory at the end of the call,
    /// which is its peak, since linear memory never shrinks.
    granted: usize,
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.denied = true;
            return Err(wasmtime::Error::msg("provider memory limit reached"));
        }
        // Called with `current` 0 for a memory's initial size too.
        self.granted = self.granted.saturating_add(desired.saturating_sub(current));
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// An export call.
pub(crate) enum Op {
    Validate {
        type_name: String,
        path: String,
        config: String,
    },
    Describe,
    /// The request and the htpasswd the `credentials` import answers during the call.
    Create(CallContext, Box<CreateRequest>, Option<String>),
    Get(CallContext, String),
    Delete(CallContext, String),
    List(CallContext, String),
    /// `list-page` of a module that exports `listing`: installation, cursor, limit.
    ListPage(CallContext, String, Option<String>, u32),
    Check(CallContext),
}

impl Op {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Validate { .. } => "validateConfig",
            Op::Describe => "describe",
            Op::Create(..) => "create",
            Op::Get(..) => "get",
            Op::Delete(..) => "delete",
            // One page is one bounded call of the listing: the same operation as listByTag, so
            // its timeout, metrics and errors read alike whichever export served it.
            Op::List(..) | Op::ListPage(..) => "listByTag",
            Op::Check(..) => "check",
        }
    }
}

pub(crate) enum OpOut {
    Validate(Result<String, ProviderError>),
    Describe(Description),
    Create(Result<Instance, ProviderError>),
    Get(Result<Instance, ProviderError>),
    Delete(Result<(), ProviderError>),
    List(Result<Vec<Instance>, ProviderError>),
    ListPage(Result<(Vec<Instance>, Option<String>), ProviderError>),
    Check(Vec<TargetStatus>),
}

/// Why a call did not produce an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallFailure {
    #[error("exceeded its {0:?} wall-time bound")]
    Timeout(Duration),
    #[error("exceeded its memory limit of {0} bytes")]
    MemoryLimit(usize),
    #[error("trapped: {0}")]
    Trap(String),
    #[error("could not be instantiated: {0}")]
    Instantiate(String),
}

/// Runs one export call on a fresh instance: its answer, and the linear memory its instance
/// held at the end (its peak).
pub(crate) async fn execute(
    engine: &wasmtime::Engine,
    pre: &ModulePre<CallState>,
    state: CallState,
    op: Op,
    timeout: Duration,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) -> (Result<OpOut, CallFailure>, usize) {
    let memory = state.limiter.max_bytes;
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    // Yield at every epoch tick: a spinning guest then gives its thread back, and the timeout
    // below cancels it by dropping the future.
    store.epoch_deadline_async_yield_and_update(1);
    // An injected trap stops the guest as the host call that drew it returns, as a module
    // crashing there would: it makes no further call (a module in a wait loop would otherwise
    // go on calling until its budget ran out).
    let injected = Arc::new(InjectedTrap::default());
    let hook_sees = injected.clone();
    store.call_hook(move |_, hook| {
        if matches!(hook, wasmtime::CallHook::ReturningFromHost) && hook_sees.fired() {
            return Err(wasmtime::Error::msg("injected trap"));
        }
        Ok(())
    });

    let run = async {
        let instantiated = pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| CallFailure::Instantiate(format!("{e:#}")))?;
        let instantiation = |e: wasmtime::Error| CallFailure::Instantiate(format!("{e:#}"));
        // A Get looks up only its own export.
        let op = match op {
            Op::Get(ctx, id) => match pre.get(&mut store, &instantiated).map_err(instantiation)? {
                Some(get) => {
                    let out = get
                        .call_async(&mut store, (&ctx, id.as_str()))
                        .await
                        .map(|(r,)| OpOut::Get(r));
                    return out.map_err(|e| {
                        if store.data().limiter.denied {
                            CallFailure::MemoryLimit(memory)
                        } else {
                            CallFailure::Trap(trap_message(&e))
                        }
                    });
                }
                None => Op::Get(ctx, id),
            },
            op => op,
        };
        let instance = pre
            .exports(&mut store, &instantiated)
            .map_err(instantiation)?;
        let p = &instance.provider;
        let out = match op {
            Op::Validate {
                type_name,
                path,
                config,
            } => p
                .call_validate_config(&mut store, &type_name, &path, &config)
                .await
                .map(OpOut::Validate),
            Op::Describe => p.call_describe(&mut store).await.map(OpOut::Describe),
            Op::Create(ctx, req, _) => p
                .call_create(&mut store, &ctx, &req)
                .await
                .map(OpOut::Create),
            Op::Get(ctx, id) => p.call_get(&mut store, &ctx, &id).await.map(OpOut::Get),
            Op::Delete(ctx, id) => p
                .call_delete(&mut store, &ctx, &id)
                .await
                .map(OpOut::Delete),
            Op::List(ctx, inst) => p
                .call_list_by_tag(&mut store, &ctx, &inst)
                .await
                .map(OpOut::List),
            Op::ListPage(ctx, inst, cursor, limit) => match &instance.listing {
                Some(l) => l
                    .call_list_page(&mut store, &ctx, &inst, cursor.as_deref(), limit)
                    .await
                    .map(OpOut::ListPage),
                // A module built before `listing` (contract 0.1.0, 0.1.1) answers its whole
                // listing as one page.
                None => p
                    .call_list_by_tag(&mut store, &ctx, &inst)
                    .await
                    .map(OpOut::List),
            },
            Op::Check(ctx) => p.call_check(&mut store, &ctx).await.map(OpOut::Check),
        };
        out.map_err(|e| {
            if store.data().limiter.denied {
                CallFailure::MemoryLimit(memory)
            } else {
                CallFailure::Trap(trap_message(&e))
            }
        })
    };
    let mut result =
        match tokio::time::timeout(timeout, INJECTED_TRAP.scope(injected.clone(), run)).await {
            Ok(r) => r,
            Err(_) => Err(CallFailure::Timeout(timeout)),
        };
    if let Some(reason) = injected.take() {
        result = Err(CallFailure::Trap(reason));
    }
    // The Store is dropped here, on the caller's thread, before the slot is released: handing
    // it to another thread was measured slower (its teardown then frees pages across cores,
    // which costs TLB shootdowns and contends on the pool's free list; BENCHMARKS.md), and the
    // slot must stay taken until the instance's memory is back in the pool.
    let memory_bytes = store.data().limiter.granted;
    drop(store);
    drop(slot);
    (result, memory_bytes)
}

/// The trap's own words without the wasm backtrace, which names guest internals only.
fn trap_message(e: &wasmtime::Error) -> String {
    match e.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => e.to_string(),
    }
}

// The types interface has no functions; the bindings still want its (empty) host trait.
impl crate::bindings::egress::provider::types::Host for CallState {}
