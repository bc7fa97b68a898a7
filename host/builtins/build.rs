//! Builds the built-in provider modules for wasm32-wasip2 (see egress-guest-build). Only the
//! providers a user can configure are embedded in the binary; the modules tests load are
//! built by host/test-modules.

use egress_guest_build::{Guest, build_guests};

fn main() {
    build_guests(
        &[
            Guest {
                package: "provider-kubernetes",
                file: "provider_kubernetes",
            },
            Guest {
                package: "provider-libvirt",
                file: "provider_libvirt",
            },
            Guest {
                package: "provider-gcp",
                file: "provider_gcp",
            },
        ],
        &[
            "schemas/wit",
            "guest-sdk",
            "providers-wasm/kubernetes",
            "providers-wasm/libvirt",
            "providers-wasm/gcp",
            "Cargo.lock",
            "Cargo.toml",
        ],
    );
}
