//! Builds the modules only tests load for wasm32-wasip2 (see egress-guest-build).

use egress_guest_build::{Guest, build_guests};

fn main() {
    build_guests(
        &[
            Guest {
                package: "provider-hostile",
                file: "provider_hostile",
            },
            Guest {
                package: "provider-examplecloud",
                file: "provider_examplecloud",
            },
        ],
        &[
            "schemas/wit",
            "guest-sdk",
            "providers-wasm/hostile",
            "examples/provider-template",
            "Cargo.lock",
            "Cargo.toml",
        ],
    );
}
