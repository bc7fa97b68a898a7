//! The contract's types and imports, generated from `schemas/wit`.

wit_bindgen::generate!({
    world: "provider-module",
    path: "../schemas/wit",
    pub_export_macro: true,
    export_macro_name: "__export_provider_module",
    default_bindings_module: "guest_sdk::bindings",
    additional_derives: [PartialEq, Eq],
});
