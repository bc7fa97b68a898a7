//! The one place the contract's host bindings are generated.

wasmtime::component::bindgen!({
    world: "provider-module",
    path: "../../schemas/wit",
    imports: { default: async },
    exports: { default: async },
    // The types a tape of capability calls stores (libvirt's answers and errors among them).
    additional_derives: [serde::Serialize, serde::Deserialize],
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
    /// The `get` export: a Get (most calls of a long run, one per Proxy per resync) finds
    /// and type-checks only the function it calls, not every export of the module.
    get: Option<wasmtime::component::ComponentExportIndex>,
}

/// The `get` export's function as the bindings call it.
pub type GetFunc = wasmtime::component::TypedFunc<
    (&'static CallContext, &'static str),
    (Result<Instance, ProviderError>,),
>;

/// One instantiated module's exports.
pub struct ModuleExports {
    pub provider: provider::Guest,
    pub listing: Option<listing::Guest>,
}

impl<T: Send + 'static> ModulePre<T> {
    pub fn new(pre: wasmtime::component::InstancePre<T>) -> wasmtime::Result<Self> {
        let provider = provider::GuestIndices::new(&pre)?;
        let listing = listing::GuestIndices::new(&pre).ok();
        let get =
            provider_instance(&pre).and_then(|i| pre.component().get_export_index(Some(&i), "get"));
        Ok(Self {
            pre,
            provider,
            listing,
            get,
        })
    }

    /// Whether the module exports `listing` (contract 0.1.2 and later).
    pub fn pages(&self) -> bool {
        self.listing.is_some()
    }

    /// The names the component imports (`egress:provider/kube@0.1.3`, `wasi:io/...`).
    pub fn import_names(&self) -> Vec<String> {
        let component = self.pre.component();
        component
            .component_type()
            .imports(component.engine())
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// A new instance, its exports not looked up yet.
    pub async fn instantiate_async(
        &self,
        mut store: impl wasmtime::AsContextMut<Data = T>,
    ) -> wasmtime::Result<wasmtime::component::Instance> {
        self.pre.instantiate_async(&mut store).await
    }

    /// Every export of `instance`, each type-checked.
    pub fn exports(
        &self,
        mut store: impl wasmtime::AsContextMut<Data = T>,
        instance: &wasmtime::component::Instance,
    ) -> wasmtime::Result<ModuleExports> {
        let mut store = store.as_context_mut();
        let provider = self.provider.load(&mut store, instance)?;
        let listing = match &self.listing {
            Some(l) => Some(l.load(&mut store, instance)?),
            None => None,
        };
        Ok(ModuleExports { provider, listing })
    }

    /// The `get` export of `instance` alone, type-checked; None where it was not found by
    /// name (the caller then goes through [`ModulePre::exports`]).
    pub fn get(
        &self,
        mut store: impl wasmtime::AsContextMut<Data = T>,
        instance: &wasmtime::component::Instance,
    ) -> wasmtime::Result<Option<GetFunc>> {
        match &self.get {
            Some(i) => Ok(Some(instance.get_typed_func(&mut store, i)?)),
            None => Ok(None),
        }
    }
}

/// The module's export of the `provider` interface, whichever contract version it was built
/// against (the bindings' own lookup accepts every compatible version).
fn provider_instance<T>(
    pre: &wasmtime::component::InstancePre<T>,
) -> Option<wasmtime::component::ComponentExportIndex> {
    let component = pre.component();
    let ty = component.component_type();
    let name = ty
        .exports(component.engine())
        .map(|(name, _)| name)
        .find(|name| name.starts_with("egress:provider/provider@"))?;
    component.get_export_index(None, name)
}
