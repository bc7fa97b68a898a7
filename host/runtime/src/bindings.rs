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
