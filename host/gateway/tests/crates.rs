//! The data path is apart from the control plane in the crate graph too: what the gateway
//! links (its normal dependencies, followed all the way down) holds no controller, no
//! WebAssembly runtime and no built-in provider module, so building it compiles neither
//! wasmtime nor the guest modules.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

/// What the gateway must never link.
const CONTROL_PLANE: [&str; 4] = [
    "egress-operator",
    "egress-runtime",
    "egress-builtins",
    "wasmtime",
];

/// The names of the packages `root` links: its normal (not dev, not build) dependencies and
/// theirs, from `cargo metadata`'s resolved graph.
fn linked_by(root: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    let nodes: BTreeMap<&str, &serde_json::Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let start = names
        .iter()
        .find(|(_, name)| **name == root)
        .map(|(id, _)| *id)
        .unwrap();
    let mut seen = BTreeSet::new();
    let mut next = vec![start];
    while let Some(id) = next.pop() {
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            let dep_id = dep["pkg"].as_str().unwrap();
            if normal && seen.insert(dep_id) {
                next.push(dep_id);
            }
        }
    }
    seen.into_iter().map(|id| names[id].to_string()).collect()
}

#[test]
fn the_gateway_links_no_controller_and_no_webassembly_runtime() {
    let linked = linked_by("egress-gateway");
    // The walk reaches what the gateway is built on, so an empty answer cannot pass.
    for needed in ["egress-core", "egress-k8s-api", "egress-serve", "kube"] {
        assert!(linked.contains(needed), "{needed} not found in {linked:?}");
    }
    let control: Vec<_> = CONTROL_PLANE
        .iter()
        .filter(|c| linked.contains(**c))
        .collect();
    assert!(
        control.is_empty(),
        "the gateway links {control:?}: the data path must stay apart from the control plane"
    );
}
