//! The JSON schemas under schemas/ are generated from the config types; this test fails when
//! they are stale. Regenerate with `EGRESS_BLESS=1 cargo test -p egress-tests --test schemas`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

fn check(name: &str, schema: schemars::Schema) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas")
        .join(name);
    let fresh = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    if std::env::var_os("EGRESS_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "{} is stale; regenerate with EGRESS_BLESS=1 cargo test -p egress-tests --test schemas",
        path.display()
    );
}

#[test]
fn providers_config_schema_is_fresh() {
    check(
        "providers-config.schema.json",
        schemars::schema_for!(egress_core::config::ProvidersConfig),
    );
}

#[test]
fn world_schema_is_fresh() {
    check(
        "world.schema.json",
        schemars::schema_for!(egress_runtime::world::World),
    );
}

#[test]
fn proxy_schema_is_fresh() {
    check(
        "proxy.schema.json",
        schemars::schema_for!(egress_core::Proxy),
    );
}

fn check_yaml(name: &str, value: &impl serde::Serialize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas/crds")
        .join(name);
    let fresh = format!(
        "# Generated from host/operator/src/crd.rs; regenerate with\n# EGRESS_BLESS=1 cargo test -p egress-tests --test schemas\n{}",
        serde_yaml::to_string(value).unwrap()
    );
    if std::env::var_os("EGRESS_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "{} is stale; regenerate with EGRESS_BLESS=1 cargo test -p egress-tests --test schemas",
        path.display()
    );
}

#[test]
fn proxy_crd_is_fresh() {
    use kube::CustomResourceExt;
    check_yaml(
        "proxies.crawl.example.com.yaml",
        &egress_operator::crd::Proxy::crd(),
    );
}

#[test]
fn provider_health_crd_is_fresh() {
    use kube::CustomResourceExt;
    check_yaml(
        "providerhealths.crawl.example.com.yaml",
        &egress_operator::crd::ProviderHealth::crd(),
    );
}

/// The deploy kustomization builds, carries the CRDs as generated, and keeps Pod permissions
/// in their optional component.
#[test]
fn deploy_kustomization_builds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in [
        "proxies.crawl.example.com.yaml",
        "providerhealths.crawl.example.com.yaml",
    ] {
        let generated = std::fs::read_to_string(root.join("schemas/crds").join(name)).unwrap();
        let copied = std::fs::read_to_string(root.join("examples/deploy/crds").join(name))
            .unwrap_or_default();
        assert!(
            generated == copied,
            "examples/deploy/crds/{name} differs from schemas/crds/{name}; copy it over"
        );
    }
    let out = match std::process::Command::new("kubectl")
        .args(["kustomize"])
        .arg(root.join("examples/deploy"))
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            assert!(
                std::env::var("EGRESS_REQUIRE_REAL_BACKENDS").as_deref() != Ok("1"),
                "kubectl is required to build the kustomization: {e}"
            );
            eprintln!("skipped: kubectl not found ({e})");
            return;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut kinds: Vec<String> = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
        kinds.push(format!(
            "{} {}",
            v["kind"].as_str().unwrap(),
            v["metadata"]["name"].as_str().unwrap()
        ));
        if v["kind"] == "Deployment" {
            let c = &v["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
            assert_eq!(
                v["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
                true
            );
            assert_eq!(v["metadata"]["namespace"], "egress-proxies");
        }
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == "egress-proxies-pods" {
            // blockOwnerDeletion on the Pods' OwnerReference needs update on the owner's
            // finalizers under OwnerReferencesPermissionEnforcement.
            let rules = v["rules"].as_sequence().unwrap();
            assert!(
                rules.iter().any(|r| {
                    r["apiGroups"][0] == "crawl.example.com"
                        && r["resources"][0] == "proxies/finalizers"
                        && r["verbs"]
                            .as_sequence()
                            .is_some_and(|v| v.iter().any(|v| v == "update"))
                }),
                "the Pods' role must allow update on proxies/finalizers: {rules:?}"
            );
        }
        if v["kind"] == "ClusterRole" && v["metadata"]["name"] == "egress-proxies" {
            let rules = serde_yaml::to_string(&v["rules"]).unwrap();
            assert!(
                !rules.contains("pods"),
                "the operator's own role must not grant Pods"
            );
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            "ClusterRole egress-proxies",
            "ClusterRole egress-proxies-pods",
            "ClusterRoleBinding egress-proxies",
            "ClusterRoleBinding egress-proxies-pods",
            "ConfigMap egress-proxies-providers",
            "CustomResourceDefinition providerhealths.crawl.example.com",
            "CustomResourceDefinition proxies.crawl.example.com",
            "Deployment egress-proxies",
            "Namespace egress-proxies",
            "Role egress-proxies-leader",
            "RoleBinding egress-proxies-leader",
            "Service egress-proxies",
            "ServiceAccount egress-proxies",
        ]
    );
}
