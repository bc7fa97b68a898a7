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
