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
