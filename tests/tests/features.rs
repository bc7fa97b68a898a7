//! The README's two commands compile every dependency once.
//!
//! Cargo compiles a package once per set of features and profile settings it is built with. The
//! first command (`cargo run -p egress-proxies`) and the second (`cargo test --workspace`) ask
//! for different features (the tests turn on tokio's paused clock, hyper-util's server, ...), so
//! without `host/workspace-hack` a clean run compiled a third of the tree twice, wasmtime and
//! kube among it. This test compares what the two builds would compile, unit by unit, and names
//! each package the first would build in a way the second does not.
//!
//! How: Cargo states the units of a build in its unit graph (`--unit-graph`), which stable Cargo
//! prints only with `-Z unstable-options`; `RUSTC_BOOTSTRAP=1` allows it on the pinned stable
//! toolchain. Nothing is built: Cargo only plans.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// A build's units: for each package, how each of its units is compiled (the target's kind,
/// the features and the profile's settings; the profile's name, `dev` or `test`, is not part of
/// what Cargo compares).
type Units = BTreeMap<String, BTreeSet<String>>;

fn unit_graph(args: &[&str]) -> Units {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .args(["--unit-graph", "-Z", "unstable-options"])
        .env("RUSTC_BOOTSTRAP", "1")
        .current_dir(&root)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} --unit-graph failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graph: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a unit graph");
    let mut units = Units::new();
    for unit in graph["units"].as_array().expect("units") {
        if unit["mode"] != "build" {
            continue;
        }
        let package = unit["pkg_id"].as_str().expect("a package id");
        let mut profile = unit["profile"].clone();
        profile.as_object_mut().expect("a profile").remove("name");
        let how = serde_json::json!({
            "kind": unit["target"]["kind"],
            "features": unit["features"],
            "profile": profile,
        });
        units
            .entry(package.to_owned())
            .or_default()
            .insert(how.to_string());
    }
    units
}

#[test]
fn the_readme_commands_compile_every_dependency_once() {
    let run = unit_graph(&["build", "-p", "egress-proxies"]);
    let test = unit_graph(&["test", "--workspace", "--no-run"]);
    assert!(
        run.keys().any(|p| p.contains("#tokio@")),
        "the binary's build has no tokio: the unit graph is not what this test expects"
    );
    let mut twice = Vec::new();
    for (package, hows) in &run {
        if package.contains("workspace-hack") {
            continue;
        }
        let tested = test.get(package).cloned().unwrap_or_default();
        for how in hows.difference(&tested) {
            twice.push(format!(
                "{package}\n  the binary's build: {how}\n  the test build:     {tested:?}"
            ));
        }
    }
    assert!(
        twice.is_empty(),
        "the binary's build compiles {} unit(s) the test build compiles otherwise; add the test \
         build's features to host/workspace-hack/Cargo.toml (as a normal dependency, or a \
         build-dependency for a build script's or proc-macro's unit):\n{}",
        twice.len(),
        twice.join("\n")
    );
}
