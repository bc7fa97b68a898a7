#![doc = include_str!("../README.md")]
//!
//! The SDK provider authors write against.
//!
//! A provider implements [`Provider`] with its logic written against [`Host`], the set of
//! capabilities. Compiled for `wasm32-wasip2`, [`export_provider!`] wires it to the contract's
//! exports and [`WasmHost`] calls the real imports; under `cargo test`, the same logic runs
//! natively against [`fakes::FakeHost`], so it is unit-tested without wasm.

pub mod bindings;

pub mod errors;
pub mod fake_clock;
pub mod fake_compute;
pub mod fake_libvirt;
pub mod fakes;
pub mod host;
pub mod json;
pub mod provider;
pub mod squid;
pub mod time;
pub mod view;

pub use bindings::egress::provider::http::{
    HttpError, Request as HttpRequest, Response as HttpResponse,
};
pub use bindings::egress::provider::kube::{KubeError, ListOptions, ObjectRef};
pub use bindings::egress::provider::libvirt;
pub use bindings::egress::provider::log::Level;
pub use bindings::egress::provider::types::{
    CallContext, Capability, CreateRequest, Description, ErrorClass, Instance, InstanceState,
    OwnerReference, Placement, Profile, ProviderError, TargetStatus,
};
pub use errors::{not_found, permanent, quota_exceeded, transient};
pub use host::{Clock, Held, Host, Http, Kube, Libvirt, Locks, Log, WasmHost};
pub use provider::Provider;

/// Exports a [`Provider`] as the contract's `provider` and `listing` interfaces. Use once, in the provider
/// crate's `lib.rs`: `guest_sdk::export_provider!(MyProvider);`, or, naming the capabilities
/// the provider calls so the module imports only those,
/// `guest_sdk::export_provider!(MyProvider, uses: guest_sdk::host::caps::HTTP);` (see
/// [`host::Only`]; the others answer as ungranted).
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        $crate::export_provider!($provider, uses: $crate::host::caps::ALL);
    };
    ($provider:ty, uses: $caps:expr) => {
        #[doc(hidden)]
        pub struct __ProviderExports;

        impl $crate::bindings::exports::egress::provider::provider::Guest for __ProviderExports {
            fn validate_config(
                type_name: String,
                path: String,
                config: String,
            ) -> Result<String, $crate::ProviderError> {
                <$provider as $crate::Provider>::validate_config(&type_name, &path, &config)
            }
            fn describe() -> $crate::Description {
                <$provider as $crate::Provider>::describe()
            }
            fn create(
                ctx: $crate::CallContext,
                req: $crate::CreateRequest,
            ) -> Result<$crate::Instance, $crate::ProviderError> {
                <$provider as $crate::Provider>::create(&$crate::host::Only::<{ $caps }>, &ctx, &req)
            }
            fn get(
                ctx: $crate::CallContext,
                provider_id: String,
            ) -> Result<$crate::Instance, $crate::ProviderError> {
                <$provider as $crate::Provider>::get(&$crate::host::Only::<{ $caps }>, &ctx, &provider_id)
            }
            fn delete(ctx: $crate::CallContext, provider_id: String) -> Result<(), $crate::ProviderError> {
                <$provider as $crate::Provider>::delete(&$crate::host::Only::<{ $caps }>, &ctx, &provider_id)
            }
            fn list_by_tag(
                ctx: $crate::CallContext,
                installation: String,
            ) -> Result<Vec<$crate::Instance>, $crate::ProviderError> {
                <$provider as $crate::Provider>::list_by_tag(&$crate::host::Only::<{ $caps }>, &ctx, &installation)
            }
            fn check(ctx: $crate::CallContext) -> Vec<$crate::TargetStatus> {
                <$provider as $crate::Provider>::check(&$crate::host::Only::<{ $caps }>, &ctx)
            }
        }

        impl $crate::bindings::exports::egress::provider::listing::Guest for __ProviderExports {
            fn list_page(
                ctx: $crate::CallContext,
                installation: String,
                cursor: Option<String>,
                limit: u32,
            ) -> Result<(Vec<$crate::Instance>, Option<String>), $crate::ProviderError> {
                <$provider as $crate::Provider>::list_page(
                    &$crate::host::Only::<{ $caps }>,
                    &ctx,
                    &installation,
                    cursor.as_deref(),
                    limit,
                )
            }
        }

        $crate::bindings::__export_provider_module!(__ProviderExports with_types_in $crate::bindings);
    };
}

/// A Kubernetes-style label selector for the managed mark and the installation.
pub const LABEL_MANAGED: &str = "egress-proxies.crawl.example.com/managed";
pub const LABEL_UID: &str = "egress-proxies.crawl.example.com/uid";
pub const LABEL_INSTALLATION: &str = "egress-proxies.crawl.example.com/installation";
pub const LABEL_PROVIDER: &str = "egress-proxies.crawl.example.com/provider";
