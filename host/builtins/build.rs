//! Builds the built-in provider modules for wasm32-wasip2 so `cargo build` stays one command.
//!
//! The nested cargo uses its own target dir: sharing the outer one deadlocks on the artifact
//! lock. The outer build's flags are scrubbed because cargo hands them to build scripts and the
//! nested cargo would apply host flags (linker, coverage, target-cpu) to the wasm build.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const GUESTS: &[(&str, &str)] = &[
    ("provider-kubernetes", "provider_kubernetes"),
    ("provider-libvirt", "provider_libvirt"),
    ("provider-gcp", "provider_gcp"),
    ("provider-hostile", "provider_hostile"),
    // The provider template authors start from: built here so the conformance tests run it.
    ("provider-examplecloud", "provider_examplecloud"),
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest_dir.join("../..");
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap_or_default());
    // target/<profile>/build/<crate>/out -> target/
    let target_root = out_dir
        .ancestors()
        .nth(4)
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let guest_target = target_root.join("wasm-guests");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());

    for path in [
        "schemas/wit",
        "guest-sdk",
        "providers-wasm",
        "examples/provider-template",
        "Cargo.lock",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }

    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&guest_target)
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        .args(["--config", "profile.release.strip=true"])
        .args(["--config", "profile.release.panic=\"abort\""]);
    for (package, _) in GUESTS {
        cmd.args(["-p", package]);
    }
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOCFLAGS",
        "CARGO_ENCODED_RUSTDOCFLAGS",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            println!("cargo:warning=could not run cargo for the wasm guests: {e}");
            std::process::exit(1);
        }
    };
    if !status.success() {
        println!(
            "cargo:warning=building the provider modules for wasm32-wasip2 failed; is the target installed? (rustup target add wasm32-wasip2)"
        );
        std::process::exit(1);
    }
    for (_, file) in GUESTS {
        let wasm = guest_target
            .join("wasm32-wasip2/release")
            .join(format!("{file}.wasm"));
        println!(
            "cargo:rustc-env=EGRESS_MODULE_{}={}",
            file.to_uppercase(),
            wasm.display()
        );
    }
}
