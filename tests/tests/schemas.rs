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

#[test]
fn proxy_pool_schema_is_fresh() {
    check(
        "proxypool.schema.json",
        schemars::schema_for!(egress_core::pool::ProxyPool),
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
fn proxy_pool_crd_is_fresh() {
    use kube::CustomResourceExt;
    check_yaml(
        "proxypools.crawl.example.com.yaml",
        &egress_operator::crd::ProxyPool::crd(),
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
        "proxypools.crawl.example.com.yaml",
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
            let grants = |resource: &str, verb: &str| {
                v["rules"].as_sequence().unwrap().iter().any(|r| {
                    r["apiGroups"][0] == "crawl.example.com"
                        && r["resources"]
                            .as_sequence()
                            .is_some_and(|rs| rs.iter().any(|x| x == resource))
                        && r["verbs"]
                            .as_sequence()
                            .is_some_and(|vs| vs.iter().any(|x| x == verb))
                })
            };
            // The pool controller watches pools, writes their status, creates and deletes
            // their Proxies, and sets blockOwnerDeletion on the Proxies' ownerReference
            // (update on the pool's finalizers under OwnerReferencesPermissionEnforcement).
            for (resource, verb) in [
                ("proxypools", "watch"),
                ("proxypools/status", "patch"),
                ("proxypools/finalizers", "update"),
                ("proxies", "create"),
                ("proxies", "delete"),
            ] {
                assert!(grants(resource, verb), "{verb} on {resource}: {rules}");
            }
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
            "CustomResourceDefinition proxypools.crawl.example.com",
            "Deployment egress-proxies",
            "Namespace egress-proxies",
            "Role egress-proxies-leader",
            "RoleBinding egress-proxies-leader",
            "Service egress-proxies",
            "ServiceAccount egress-proxies",
        ]
    );
}

/// The deploy's sample ProxyPool is a valid pool of the deploy's providers config.
#[test]
fn the_deploy_sample_pool_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text =
        std::fs::read_to_string(root.join("examples/deploy/samples/proxypool.yaml")).unwrap();
    let pool: egress_operator::crd::ProxyPool = serde_yaml::from_str(&text).unwrap();
    let core = pool.to_core();
    assert_eq!(egress_core::pool::validate(&core), Vec::<String>::new());
    let providers = egress_core::config::ProvidersConfig::from_yaml(
        &std::fs::read_to_string(root.join("examples/deploy/providers.yaml")).unwrap(),
    )
    .unwrap();
    for p in &core.spec.placements {
        assert!(
            providers.providers.iter().any(|e| e.name == p.provider),
            "placement provider {} is not in examples/deploy/providers.yaml",
            p.provider
        );
    }
    // Strictly, too: a misspelt field is an error there, not a field the API server drops.
    let strict: egress_core::pool::ProxyPool = serde_yaml::from_str(&text).unwrap();
    assert_eq!(strict.spec, core.spec);
    assert_eq!(pool.metadata.namespace.as_deref(), Some("crawlers"));
}
