//! A dry-run plans each lane of providers, those whose calls can meet, in a simulated world
//! of its own and on a clock of its own, the lanes side by side. What one lane plans depends
//! on nothing the others do; providers that share a backend still plan in one world.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use egress_proxies::{ReconcileRequest, Source, run_reconcile};
use egress_runtime::RuntimeOptions;
use egress_tests::scale;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The JSON plan of a dry-run of the three files, at most `max_rounds` rounds.
async fn plan(dir: &Path, providers: &str, proxies: &str, world: &str, max_rounds: u32) -> Value {
    plan_with_state(dir, providers, proxies, world, max_rounds, None).await
}

/// The same, reading the statuses of an earlier run from `state`.
async fn plan_with_state(
    dir: &Path,
    providers: &str,
    proxies: &str,
    world: &str,
    max_rounds: u32,
    state: Option<PathBuf>,
) -> Value {
    std::fs::create_dir_all(dir).unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        Source::File(p)
    };
    let report = run_reconcile(ReconcileRequest {
        proxies: file("proxies.yaml", proxies),
        providers: file("providers.yaml", providers),
        world: Some(file("world.yaml", world)),
        dry_run: true,
        state,
        timeout: Duration::from_secs(600),
        max_rounds,
        gc_grace: Duration::ZERO,
        concurrency: 1,
        run_for: None,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        runtime: RuntimeOptions {
            cache_dir: Some(root().join("target/test-module-cache")),
            ..Default::default()
        },
    })
    .await
    .unwrap();
    serde_json::to_value(&report).unwrap()
}

/// The documents of a proxies file that name `provider`.
fn only(proxies: &str, provider: &str) -> String {
    let line = format!("  provider: {provider}\n");
    proxies
        .split_inclusive("---\n")
        .filter(|doc| doc.contains(&line))
        .map(|doc| format!("---\n{}", doc.trim_end_matches("---\n")))
        .collect()
}

fn by_name(plan: &Value) -> std::collections::BTreeMap<String, Value> {
    plan["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap().to_string(), p.clone()))
        .collect()
}

/// Four providers on four backends, faults drawn at a rate on every call: each Proxy's
/// changes, events and status in the mixed run are exactly those of a run of its provider
/// alone, and so is each provider's sweep.
#[tokio::test]
async fn each_lane_plans_as_if_it_ran_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = scale::Spec::new(48);
    spec.seed = 7;
    spec.faults.push(scale::FaultRule {
        capability: "*".into(),
        call: "*".into(),
        rate: 0.1,
        class: "transient".into(),
    });
    let providers = scale::providers();
    let proxies = scale::proxies(spec.proxies);
    let world = scale::world(&spec);
    let mixed = plan(
        &dir.path().join("mixed"),
        &providers,
        &proxies,
        &world,
        20_000,
    )
    .await;
    assert_eq!(mixed["steady"], true, "{mixed:#}");
    let mixed_proxies = by_name(&mixed);
    assert_eq!(mixed_proxies.len(), spec.proxies);
    let mut compared = 0;
    for provider in ["cluster", "gce", "lab", "legacy"] {
        let alone = plan(
            &dir.path().join(provider),
            &providers,
            &only(&proxies, provider),
            &world,
            20_000,
        )
        .await;
        let alone_proxies = by_name(&alone);
        assert_eq!(alone_proxies.len(), spec.proxies / 4, "{provider}");
        for (name, report) in &alone_proxies {
            assert_eq!(report["status"]["state"], "Running", "{name}");
            assert_eq!(&mixed_proxies[name], report, "{name} of {provider}");
            compared += 1;
        }
        // What the sweep judged, and whether its listing failed part way (a faulted list).
        let sweep = |plan: &Value| -> Vec<Value> {
            ["verdicts", "incomplete"]
                .iter()
                .flat_map(|k| plan["gc"][k].as_array().cloned().unwrap_or_default())
                .filter(|v| v["provider"] == provider)
                .collect()
        };
        assert!(!sweep(&alone).is_empty(), "{provider} sweeps");
        assert_eq!(sweep(&mixed), sweep(&alone), "{provider}'s sweep");
    }
    assert_eq!(compared, spec.proxies);
    // And the mixed plan is the same on a second run, however its lanes were scheduled.
    let again = plan(
        &dir.path().join("again"),
        &providers,
        &proxies,
        &world,
        20_000,
    )
    .await;
    assert_eq!(again, mixed);
}

/// Two entries that reach one simulated hypervisor by one address, under names of their own,
/// with room for one VM: they plan in one world, so the second VM finds the host full, as it
/// would on the real host.
#[tokio::test]
async fn entries_on_one_hypervisor_plan_in_one_world() {
    let dir = tempfile::tempdir().unwrap();
    let mut providers = String::from("installation: lanes\nproviders:\n");
    for (name, host) in [("east", "rack-a"), ("west", "rack-b")] {
        providers.push_str(&format!(
            "  - name: {name}\n    type: kvm2\n    kvm2:\n      insecureIgnoreHostKey: true\n      diskSizeGb: 10\n      images:\n        debian-12: {{url: {url}, sha256: {sha}, format: qcow2, firmware: uefi}}\n      machineTypes:\n        small: {{vcpus: 1, memoryMiB: 1024}}\n      hosts:\n        - {{name: {host}, address: \"192.0.2.50:22\", user: egress}}\n",
            url = scale::IMAGE_URL,
            sha = scale::IMAGE_SHA,
        ));
    }
    let mut proxies = String::new();
    for (name, provider, host) in [("one", "east", "rack-a"), ("two", "west", "rack-b")] {
        proxies.push_str(&format!(
            "---\napiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {{name: {name}, namespace: crawlers}}\nspec:\n  provider: {provider}\n  port: 3128\n  placement: {{zone: {host}, machineType: small, image: debian-12}}\n"
        ));
    }
    let world = format!(
        "start: \"2026-01-01T00:00:00Z\"\nseed: 1\nlibvirt:\n  urls:\n    - {{url: {url}, bytes: 402653184, sha256: {sha}, virtualSize: 2147483648}}\n  hosts:\n    - {{name: rack, address: \"192.0.2.50:22\", user: egress, memoryMiB: 2600, cpus: 4, addressPrefix: 10.9.0, firstAddress: 10, pools: [{{name: default, capacityGiB: 100}}]}}\n",
        url = scale::IMAGE_URL,
        sha = scale::IMAGE_SHA,
    );
    let plan = plan(dir.path(), &providers, &proxies, &world, 20_000).await;
    let states: Vec<String> = plan["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["status"]["state"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        states.iter().filter(|s| *s == "Running").count(),
        1,
        "one VM fits the shared host: {states:?}\n{plan:#}"
    );
}

/// A dry-run that reads a state file hands each lane the stored Proxies of its own providers:
/// each Proxy gone from the file is deleted by its provider, in its lane.
#[tokio::test]
async fn stored_proxies_gone_from_the_file_are_deleted_in_their_providers_lanes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = scale::Spec::new(8);
    let state = dir.path().join("state.yaml");
    std::fs::write(
        &state,
        "installation: scale\nproxies:\n  crawlers/gone-k:\n    key: crawlers/gone-k\n    uid: 00000000-0000-4000-8000-00000000000a\n    provider: cluster\n    status: {state: Running, providerID: crawlers/proxy-000000000000}\n  crawlers/gone-g:\n    key: crawlers/gone-g\n    uid: 00000000-0000-4000-8000-00000000000b\n    provider: gce\n    status: {state: Running, providerID: zones/europe-west1-b/instances/proxy-000000000000}\n",
    )
    .unwrap();
    let plan = plan_with_state(
        dir.path(),
        &scale::providers(),
        &scale::proxies(spec.proxies),
        &scale::world(&spec),
        1_000,
        Some(state),
    )
    .await;
    let proxies = by_name(&plan);
    assert_eq!(proxies.len(), spec.proxies + 2, "{plan:#}");
    for (name, provider, capability) in [("gone-k", "cluster", "kube"), ("gone-g", "gce", "http")] {
        let p = &proxies[name];
        assert_eq!(p["provider"], provider);
        assert_eq!(p["deleted"], true, "{name}: {p:#}");
        let calls: Vec<&Value> = p["changes"].as_array().unwrap().iter().collect();
        assert!(
            calls.iter().any(|c| c["capability"] == capability),
            "{name} deleted through {capability}: {p:#}"
        );
    }
    assert_eq!(plan["steady"], true);
}
