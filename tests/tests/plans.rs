//! The dry-run plan of every example under examples/, snapshotted: what the real provider
//! modules would do against the simulated backends the example's world describes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use egress_proxies::cli::Format;
use egress_proxies::{ReconcileRequest, output, run_reconcile};
use egress_runtime::RuntimeOptions;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn runtime() -> RuntimeOptions {
    RuntimeOptions {
        cache_dir: Some(root().join("target/test-module-cache")),
        ..Default::default()
    }
}

/// Every example set: a proxies file with its providers config and world file beside it.
fn example_sets() -> Vec<(String, PathBuf, PathBuf, Option<PathBuf>)> {
    let dir = root().join("examples");
    let mut sets = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("proxies") && n.ends_with(".yaml"))
        .collect();
    names.sort();
    for name in names {
        let suffix = name.trim_start_matches("proxies").trim_end_matches(".yaml");
        let providers = dir.join(format!("providers{suffix}.yaml"));
        let world = dir.join(format!("world{suffix}.yaml"));
        assert!(providers.exists(), "{name} has no providers{suffix}.yaml");
        let label = if suffix.is_empty() {
            "default".to_string()
        } else {
            suffix.trim_start_matches('-').to_string()
        };
        sets.push((
            label,
            dir.join(&name),
            providers,
            world.exists().then_some(world),
        ));
    }
    sets
}

async fn plan(
    proxies: &Path,
    providers: &Path,
    world: Option<&Path>,
) -> egress_proxies::reconcile::Report {
    support::dry_run(proxies, providers, world, None).await
}

#[tokio::test]
async fn example_plans() {
    let sets = example_sets();
    assert!(!sets.is_empty());
    for (label, proxies, providers, world) in sets {
        let report = plan(&proxies, &providers, world.as_deref()).await;
        assert!(report.steady, "example {label} does not settle");
        insta::assert_snapshot!(
            format!("plan_{label}_text"),
            output::reconcile(&report, Format::Text, true)
        );
        insta::assert_snapshot!(
            format!("plan_{label}_json"),
            output::reconcile(&report, Format::Json, true)
        );
    }
}

/// The pool example over a day of simulated time: every Proxy is rotated by age (8 h ± 1 h),
/// one at a time, and the pool never has fewer than its 20 Ready. The snapshot holds the
/// pool's section: each rotation with its time, and the minimum seen.
#[tokio::test]
async fn a_pool_rotates_over_a_day_without_dropping_below_its_replicas() {
    let dir = root().join("examples");
    let report = support::dry_run(
        &dir.join("proxies-pool.yaml"),
        &dir.join("providers-pool.yaml"),
        None,
        Some(Duration::from_secs(24 * 3600)),
    )
    .await;
    let text = output::reconcile(&report, Format::Text, true);
    let start = text.find("\nPool crawlers/crawl").expect("no pool section") + 1;
    let end = text[start..]
        .find("\nSweep")
        .map_or(text.len(), |e| start + e);
    let section = &text[start..end];
    assert!(
        section.contains("at least 20 ready and 20 available throughout once available"),
        "{section}"
    );
    // Twenty Proxies, each older than 9 h at most twice in 24 h: at least 20 and at most 60
    // rotations, never two at once (maxSurge 1, maxUnavailable 0).
    let rotations = section.matches("Rotated: deleting").count();
    assert!(
        (20..=60).contains(&rotations),
        "{rotations} rotations:\n{section}"
    );
    insta::assert_snapshot!("plan_pool_24h_pool_section", section);
}

#[tokio::test]
async fn plans_are_deterministic() {
    for (_, proxies, providers, world) in example_sets() {
        let a = plan(&proxies, &providers, world.as_deref()).await;
        let b = plan(&proxies, &providers, world.as_deref()).await;
        assert_eq!(
            output::reconcile(&a, Format::Json, true),
            output::reconcile(&b, Format::Json, true)
        );
    }
}

#[tokio::test]
async fn the_embedded_default_is_the_examples() {
    let files = plan(
        &root().join("examples/proxies.yaml"),
        &root().join("examples/providers.yaml"),
        Some(&root().join("examples/world.yaml")),
    )
    .await;
    let embedded = run_reconcile(ReconcileRequest {
        proxies: egress_proxies::examples::proxies(),
        providers: egress_proxies::examples::providers(),
        world: Some(egress_proxies::examples::world()),
        dry_run: true,
        state: None,
        timeout: Duration::from_secs(600),
        max_rounds: egress_proxies::DEFAULT_MAX_ROUNDS,
        gc_grace: Duration::ZERO,
        concurrency: 1,
        run_for: None,
        max_replicas: egress_core::pool::DEFAULT_MAX_REPLICAS,
        runtime: runtime(),
    })
    .await
    .unwrap();
    assert_eq!(
        output::reconcile(&files, Format::Json, true),
        output::reconcile(&embedded, Format::Json, true)
    );
}

/// Without a world file a dry-run plans against the world the providers config describes:
/// every example plans Running Proxies with the calls that make them (domain XML, insert
/// requests, Pod manifests), but for the ones the examples get wrong on purpose.
#[tokio::test]
async fn every_example_config_plans_without_a_world_file() {
    for (label, proxies, providers, _) in example_sets() {
        let report = plan(&proxies, &providers, None).await;
        assert!(report.steady, "{label}");
        let calls: Vec<String> = report
            .proxies
            .iter()
            .flat_map(|p| p.changes.iter())
            .filter(|c| c.error.is_none())
            .map(|c| format!("{} {}", c.call, c.target))
            .collect();
        for p in &report.proxies {
            let ready = p.status.condition("Ready").unwrap();
            let on_purpose = ["ProviderNotFound", "PermanentFailure"]
                .contains(&ready.reason.as_str())
                && (ready.message.contains("elsewhere") || ready.message.contains("\"huge\""));
            assert!(
                ready.status == "True" || on_purpose,
                "{label}: {}/{} is {} {}: {}",
                p.namespace,
                p.name,
                ready.status,
                ready.reason,
                ready.message
            );
        }
        let wanted = match label.as_str() {
            "kvm" => "domain-define-xml",
            "gcp" => "POST",
            _ => "create Pod",
        };
        assert!(
            calls.iter().any(|c| c.contains(wanted)),
            "{label}: no {wanted} in {calls:#?}"
        );
    }
}

/// The kubernetes block's `spread`, through the real module: its Pods carry a topology spread
/// constraint over the provider's proxy Pods, which the plan shows.
#[tokio::test]
async fn a_spread_kubernetes_provider_plans_pods_with_a_topology_constraint() {
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.yaml");
    let proxies = dir.path().join("proxies.yaml");
    std::fs::write(
        &providers,
        "installation: spread\nproviders:\n- name: cluster\n  type: kubernetes\n  kubernetes: {spread: {whenUnsatisfiable: DoNotSchedule}}\n",
    )
    .unwrap();
    std::fs::write(
        &proxies,
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: crawlers}\nspec: {provider: cluster, port: 3128}\n",
    )
    .unwrap();
    let report = plan(&proxies, &providers, None).await;
    assert!(report.steady);
    let json: serde_json::Value =
        serde_json::from_str(&output::reconcile(&report, Format::Json, true)).unwrap();
    let text = json.to_string();
    assert!(
        text.contains(r#""topologySpreadConstraints":[{"labelSelector":{"matchLabels":{"#)
            && text.contains(r#""whenUnsatisfiable":"DoNotSchedule""#)
            && text.contains(r#""topologyKey":"kubernetes.io/hostname""#),
        "{text}"
    );
}
