//! The one place the contract's host bindings are generated.

wasmtime::component::bindgen!({
    world: "provider-module",
    path: "../../schemas/wit",
    imports: { default: async },
    exports: { default: async },
    with: {
        "egress:provider/lock.guard": crate::capabilities::lock::LockGuard,
    },
});

pub use egress::provider::types::{
    CallContext, Capability, CreateRequest, Description, ErrorClass, Instance, InstanceState,
    OwnerReference, Placement, Profile, ProviderError, TargetStatus,
};

use exports::egress::provider::{listing, provider};

/// A module ready to instantiate, with its exports found once. The generated
/// `ProviderModulePre` wants every export of the newest world, so a module built against an
/// older contract (no `listing`) would not load; this one requires `provider` and takes
/// `listing` when the module has it.
pub struct ModulePre<T: 'static> {
    pre: wasmtime::component::InstancePre<T>,
    provider: provider::GuestIndices,
    listing: Option<listing::GuestIndices>,
}

/// One instantiated module's exports.
pub struct ModuleExports {
    pub provider: provider::Guest,
    pub listing: Option<listing::Guest>,
}

impl<T: Send + 'static> ModulePre<T> {
    pub fn new(pre: wasmtime::component::InstancePre<T>) -> wasmtime::Result<Self> {
        let provider = provider::GuestIndices::new(&pre)?;
        let listing = listing::GuestIndices::new(&pre).ok();
        Ok(Self {
            pre,
            provider,
            listing,
        })
    }

    /// Whether the module exports `listing` (contract 0.1.2 and later).
    pub fn pages(&self) -> bool {
        self.listing.is_some()
    }

    pub async fn instantiate_async(
        &self,
        mut store: impl wasmtime::AsContextMut<Data = T>,
    ) -> wasmtime::Result<ModuleExports> {
        let mut store = store.as_context_mut();
        let instance = self.pre.instantiate_async(&mut store).await?;
        let provider = self.provider.load(&mut store, &instance)?;
        let listing = match &self.listing {
            Some(l) => Some(l.load(&mut store, &instance)?),
            None => None,
        };
        Ok(ModuleExports { provider, listing })
    }
}
