#![doc = include_str!("../README.md")]
//!
//! The SDK provider authors write against.
//!
//! A provider implements [`Provider`] with its logic written against [`Host`], the set of
//! capabilities. Compiled for `wasm32-wasip2`, [`export_provider!`] wires it to the contract's
//! exports and [`WasmHost`] calls the real imports; under `cargo test`, the same logic runs
//! natively against [`fakes::FakeHost`], so it is unit-tested without wasm.

pub mod bindings {
    wit_bindgen::generate!({
        world: "provider-module",
        path: "../schemas/wit",
        pub_export_macro: true,
        export_macro_name: "__export_provider_module",
        default_bindings_module: "guest_sdk::bindings",
        additional_derives: [PartialEq, Eq],
    });
}

pub mod errors;
pub mod fake_compute;
pub mod fake_libvirt;
pub mod fakes;
pub mod host;
pub mod json;
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

/// A provider's logic. Every method gets the host's capabilities as `host`, so the same code
/// runs in the component and in native tests.
pub trait Provider {
    /// Parses the config block (JSON) of `type_name`, fills defaults and checks it. Errors name
    /// the field path under `path` (`providers[1].kubernetes.image`).
    fn validate_config(type_name: &str, path: &str, config: &str) -> Result<String, ProviderError>;
    fn describe() -> Description;
    fn create(
        host: &dyn Host,
        ctx: &CallContext,
        req: &CreateRequest,
    ) -> Result<Instance, ProviderError>;
    fn get(
        host: &dyn Host,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Instance, ProviderError>;
    fn delete(host: &dyn Host, ctx: &CallContext, provider_id: &str) -> Result<(), ProviderError>;
    fn list_by_tag(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
    ) -> Result<Vec<Instance>, ProviderError>;
    /// One page of [`Provider::list_by_tag`]: at most `limit` instances from where `cursor`
    /// left off, and the cursor that continues after them (none when done). The host calls it
    /// page after page, each in a fresh instance, so the module holds one page at a time.
    ///
    /// The default runs `list_by_tag` for every page and answers the `limit` instances after
    /// the cursor in provider-id order (the cursor is the last provider-id answered): right
    /// for any backend, cheap only for one that lists a few instances, since the whole
    /// listing is in memory during each call. A provider whose backend can hold many asks it
    /// for pages instead (Kubernetes `limit`/`continue`, a cloud API's page token, libvirt's
    /// batched names).
    fn list_page(
        host: &dyn Host,
        ctx: &CallContext,
        installation: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<Instance>, Option<String>), ProviderError> {
        let mut all = Self::list_by_tag(host, ctx, installation)?;
        if let Some(after) = cursor {
            all.retain(|i| i.provider_id.as_str() > after);
        }
        all.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        let limit = limit.max(1) as usize;
        let more = all.len() > limit;
        all.truncate(limit);
        let next = more
            .then(|| all.last().map(|i| i.provider_id.clone()))
            .flatten();
        Ok((all, next))
    }
    fn check(host: &dyn Host, ctx: &CallContext) -> Vec<TargetStatus>;
}

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
